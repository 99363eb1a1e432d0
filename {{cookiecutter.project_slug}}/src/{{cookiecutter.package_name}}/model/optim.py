"""AdamW's parameter groups, the frozen backbone of fine-tuning, the learning-rate schedule."""

from __future__ import annotations

import math
from fnmatch import fnmatch

import torch
from torch import nn

from {{ cookiecutter.package_name }}.model.networks import classifier_of


def param_groups(
    network: nn.Module, lr: float, weight_decay: float, backbone_lr_scale: float = 1.0
) -> list[dict]:
    """AdamW's groups over every parameter, frozen or not: the classifier's first (the history
    logs the first group's rate), then the backbone's at `backbone_lr_scale` times `lr`; no weight
    decay on norms, biases and what a timm model's `no_weight_decay()` lists (timm's rule)."""
    skip = getattr(network, "no_weight_decay", set)()
    head = {id(p) for p in classifier_of(network).parameters()}
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in network.named_parameters():
        plain = p.ndim <= 1 or name.endswith(".bias") or any(fnmatch(name, s) for s in skip)
        groups.setdefault((id(p) not in head, plain), []).append(p)
    return [
        {"params": params, "lr": lr * (backbone_lr_scale if in_backbone else 1.0)}
        | {"weight_decay": 0.0 if plain else weight_decay}
        for (in_backbone, plain), params in sorted(groups.items())
    ]


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def freeze_backbone(network: nn.Module, frozen: bool) -> None:
    """Train only the classifier (`classifier_of`), or everything again. Frozen, the backbone's
    BatchNorm layers run in eval mode: the pretrained running statistics used, not pulled."""
    head = classifier_of(network)
    network.requires_grad_(not frozen)
    head.requires_grad_(True)
    for module in network.modules():
        if isinstance(module, _BATCH_NORMS):
            module.train(network.training and not frozen)
    head.train(network.training)


def lr_schedule(
    optimizer: torch.optim.Optimizer, total: int, warmup_fraction: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Per step, each group from its own peak `lr`: linear warm-up over `warmup_fraction` of the
    `total` steps, then cosine decay to zero."""
    warmup = int(total * warmup_fraction)

    def factor(step: int) -> float:
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
