"""What the optimizer trains and how fast: AdamW's parameter groups (weight decay on weights only,
the backbone's own learning rate, timm's layer-wise decay), the frozen backbone of a fine-tuning
run, and the learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model.networks import classifier_of


def param_groups(
    network: nn.Module,
    lr: float,
    weight_decay: float,
    backbone_lr_scale: float = 1.0,
    layer_decay: float | None = None,
) -> list[dict]:
    """AdamW's parameter groups over every parameter, frozen or not, each with its peak `lr`.

    Norm layers, biases and what a timm model lists in `no_weight_decay()` (a ViT's position
    embedding and class token) get no weight decay. With the backbone's learning rate scaled or
    `layer_decay`, the classifier's groups come first (the run history logs the first group's
    rate), then the backbone's, named for the learning-rate monitor; otherwise there are just
    the two groups, with and without decay.
    """
    no_decay = _no_decay(network)
    if backbone_lr_scale == 1.0 and layer_decay is None:
        decayed = [p for p in network.parameters() if id(p) not in no_decay]
        plain = [p for p in network.parameters() if id(p) in no_decay]
        return [
            {"params": decayed, "weight_decay": weight_decay, "lr": lr},
            {"params": plain, "weight_decay": 0.0, "lr": lr},
        ]
    if layer_decay is None:
        layered = [{"params": list(network.parameters()), "lr_scale": 1.0}]
    else:
        layered = _timm_layers(network, layer_decay)
    head = {id(p) for p in classifier_of(network).parameters()}
    heads, backbones = [], []
    for index, layer in enumerate(layered):
        part = "" if layer_decay is None else f"_{index}"
        for decay in (True, False):
            for in_head, groups in ((True, heads), (False, backbones)):
                chosen = [
                    p
                    for p in layer["params"]
                    if (id(p) not in no_decay) == decay and (id(p) in head) == in_head
                ]
                if not chosen:
                    continue
                scale = layer["lr_scale"] * (1.0 if in_head else backbone_lr_scale)
                name = ("head" if in_head else "backbone") + part + ("" if decay else "_no_decay")
                groups.append(
                    {
                        "params": chosen,
                        "lr": lr * scale,
                        "weight_decay": weight_decay if decay else 0.0,
                        "name": name,
                    }
                )
    return heads + backbones


def _no_decay(network: nn.Module) -> set[int]:
    """The ids of the parameters without weight decay: those of one dimension (norm layers,
    biases) and, in a timm model, those its `no_weight_decay()` names, matched by timm's own
    `param_groups_weight_decay` as its optimizer factory matches them."""
    if not _is_timm(network):
        return {id(p) for p in network.parameters() if p.ndim <= 1}
    from timm.optim import param_groups_weight_decay

    names = getattr(network, "no_weight_decay", set)()
    with _all_trainable(network):
        groups = param_groups_weight_decay(network, 1.0, no_weight_decay_list=names)
    return {id(p) for group in groups if group["weight_decay"] == 0.0 for p in group["params"]}


def _timm_layers(network: nn.Module, layer_decay: float) -> list[dict]:
    """timm's layer groups (`param_groups_layer_decay`, from the model's `group_matcher`), each
    with its `lr_scale`; every parameter is included, frozen or not."""
    from timm.optim import param_groups_layer_decay

    with _all_trainable(network):
        return param_groups_layer_decay(network, weight_decay=0.0, layer_decay=layer_decay)


@contextmanager
def _all_trainable(network: nn.Module) -> Iterator[None]:
    """Every parameter takes gradients inside: timm's group helpers leave out those that do not
    now, where the groups must hold a frozen backbone too."""
    flags = [(p, p.requires_grad) for p in network.parameters()]
    for p, _ in flags:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _is_timm(network: nn.Module) -> bool:
    return type(network).__module__.startswith("timm.")


def check_layer_decay(network: nn.Module, architecture: str, layer_decay: float | None) -> None:
    """Refuse `layer_decay` for a network without timm's layer groups, or out of (0, 1]."""
    if layer_decay is None:
        return
    if not 0.0 < layer_decay <= 1.0:
        raise DataError(f"--model.layer_decay must be in (0, 1], got {layer_decay}")
    if not (_is_timm(network) and hasattr(network, "group_matcher")):
        raise DataError(
            f"--model.layer_decay needs a timm architecture (its layer groups); "
            f"--model.architecture {architecture} is not one"
        )


def freeze_backbone(network: nn.Module, frozen: bool) -> None:
    """Train only the classifier (`classifier_of`), or everything again.

    Frozen, the backbone's parameters take no gradients (so AdamW leaves them, and their weight
    decay, alone) and its BatchNorm layers run in eval mode, as Lightning's `BaseFinetuning` and
    the usual fine-tuning recipes keep them: the running statistics of the pretrained backbone
    are not pulled towards the batches of a classifier that is still random.
    """
    head = classifier_of(network)
    in_head = {id(p) for p in head.parameters()} | {id(m) for m in head.modules()}
    for param in network.parameters():
        if id(param) not in in_head:
            param.requires_grad_(not frozen)
    for module in network.modules():
        if isinstance(module, _BatchNorm) and id(module) not in in_head:
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
