"""AdamW's parameter groups, the frozen backbone of fine-tuning, the learning-rate schedule."""

from __future__ import annotations

import math
from fnmatch import fnmatch
from itertools import product

import torch
from torch import nn

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.networks import classifier_of


def param_groups(
    network: nn.Module,
    lr: float,
    weight_decay: float,
    backbone_lr_scale: float = 1.0,
    layer_decay: float | None = None,
) -> list[dict]:
    """AdamW's groups over every parameter, frozen or not, weight decay by timm's rule; with a
    backbone scale or `layer_decay`, named, the classifier's first (the history logs its rate)."""
    skip = getattr(network, "no_weight_decay", set)()
    decays = {
        id(p): not (p.ndim <= 1 or name.endswith(".bias") or any(fnmatch(name, s) for s in skip))
        for name, p in network.named_parameters()
    }
    if backbone_lr_scale == 1.0 and layer_decay is None:
        params = list(network.parameters())
        return [
            {"params": [p for p in params if decays[id(p)]], "weight_decay": weight_decay},
            {"params": [p for p in params if not decays[id(p)]], "weight_decay": 0.0},
        ]
    if layer_decay is None:
        layers = [{"params": list(network.parameters()), "lr_scale": 1.0}]
    else:
        from timm.optim import param_groups_layer_decay

        flags = [(p, p.requires_grad) for p in network.parameters()]
        network.requires_grad_(True)  # timm leaves out the parameters frozen now
        try:
            layers = param_groups_layer_decay(network, weight_decay=0.0, layer_decay=layer_decay)
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)
    head = {id(p) for p in classifier_of(network).parameters()}
    groups = []
    for in_head, (index, layer), decay in product((True, False), enumerate(layers), (True, False)):
        chosen = [p for p in layer["params"] if (decays[id(p)], id(p) in head) == (decay, in_head)]
        if chosen:
            scale = layer["lr_scale"] * (1.0 if in_head else backbone_lr_scale)
            name = "head" if in_head else "backbone"
            name += ("" if layer_decay is None else f"_{index}") + ("" if decay else "_no_decay")
            wd = weight_decay if decay else 0.0
            groups.append({"params": chosen, "lr": lr * scale, "weight_decay": wd, "name": name})
    return groups


def check_layer_decay(network: nn.Module, architecture: str, layer_decay: float | None) -> None:
    """Refuse `layer_decay` out of (0, 1], or for a network without timm's layer groups."""
    if layer_decay is not None and not 0.0 < layer_decay <= 1.0:
        raise DataError(f"--model.layer_decay must be in (0, 1], got {layer_decay}")
    timm = type(network).__module__.startswith("timm.") and hasattr(network, "group_matcher")
    if layer_decay is not None and not timm:
        raise DataError(
            f"--model.layer_decay needs a timm architecture (its layer groups); "
            f"--model.architecture {architecture} is not one"
        )


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def freeze_backbone(network: nn.Module, frozen: bool) -> None:
    """Train only the classifier (`classifier_of`), or everything again. Frozen, the backbone's
    BatchNorm layers run in eval mode: the pretrained running statistics used, not pulled."""
    head = classifier_of(network)
    in_head = {id(p) for p in head.parameters()} | {id(m) for m in head.modules()}
    for param in network.parameters():
        if id(param) not in in_head:
            param.requires_grad_(not frozen)
    for module in network.modules():
        if isinstance(module, _BATCH_NORMS) and id(module) not in in_head:
            module.train(network.training and not frozen)


def lr_schedule(
    optimizer: torch.optim.Optimizer, kind: str, total: int, warmup_fraction: float
) -> torch.optim.lr_scheduler.LRScheduler:
    """Per step, each group from its own peak `lr`: "cosine" (linear warm-up over
    `warmup_fraction` of the `total` steps, then cosine decay to zero) or "onecycle"."""
    if kind == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=[group["lr"] for group in optimizer.param_groups],
            total_steps=total,
            pct_start=max(warmup_fraction, 1e-3),
        )
    warmup = int(total * warmup_fraction)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
