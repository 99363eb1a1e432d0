"""The networks: a compact residual CNN (the default), torchvision and timm models by name."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
import torchvision
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock

from {{ cookiecutter.package_name }}.errors import DataError, one_line
from {{ cookiecutter.package_name }}.model.pretrained import pretrained_inputs, timm_network

COMPACT = "compact_resnet"


def compact_resnet(
    num_classes: int, image_size: int, width: int, depths: tuple[int, ...], dropout: float
) -> nn.Sequential:
    """A small ResNet: a strided stem, then stages of torchvision's `BasicBlock` (ResNet-18's)
    that halve resolution and double width."""
    stride = 1 if image_size < 64 else 2 if image_size < 128 else 4  # stage 1: 32 to 64 pixels
    # A 4x4 stride-4 "patchify" stem (as in ConvNeXt) costs far less than a 7x7 conv + max pool.
    kernel, padding = (4, 0) if stride == 4 else (3, 1)
    stem = [nn.Conv2d(3, width, kernel, stride, padding, bias=False), nn.BatchNorm2d(width)]
    blocks, channels = [], width
    for i, depth in enumerate(depths):
        for j in range(depth):
            out, stride = width * 2**i, 2 if (j == 0 and i > 0) else 1
            blocks.append(block := BasicBlock(channels, out, stride))
            if stride != 1 or channels != out:
                conv = nn.Conv2d(channels, out, 1, stride, bias=False)
                block.downsample = nn.Sequential(conv, nn.BatchNorm2d(out))
            nn.init.zeros_(block.bn2.weight)  # each block starts as the identity: stabler
            channels = out
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout)]
    return nn.Sequential(
        OrderedDict(
            stem=nn.Sequential(*stem, nn.ReLU(inplace=True)),
            stages=nn.Sequential(*blocks),
            head=nn.Sequential(*head, nn.Linear(channels, num_classes)),
        )
    )


def build_network(
    architecture: str,
    num_classes: int,
    image_size: int,
    width: int = 32,
    depths: tuple[int, ...] = (1, 1, 2, 1),
    dropout: float = 0.0,
    weights: str | Path | None = None,
    pretrained: bool = False,
) -> nn.Module:
    """The compact CNN, a torchvision model or a timm model by name, with `num_classes` outputs,
    from timm's published weights (`pretrained`), a local file (`weights`) or random ones."""
    if pretrained and weights is not None:
        raise DataError("--model.pretrained and --model.weights both say where to start: pick one")
    torchvision_names = torchvision.models.list_models(module=torchvision.models)
    if pretrained and (architecture == COMPACT or architecture in torchvision_names):
        raise DataError(
            f"--model.pretrained takes timm's published weights, and {architecture} is not a "
            f"timm model: name one (e.g. resnet18.a1_in1k) or give a file with --model.weights"
        )
    if architecture == COMPACT:
        network: nn.Module = compact_resnet(num_classes, image_size, width, tuple(depths), dropout)
    elif architecture in torchvision_names:
        network = torchvision.models.get_model(architecture, num_classes=num_classes)
    else:
        network = timm_network(architecture, num_classes, dropout, pretrained)
    if weights is not None:
        load_weights(network, weights, architecture)
    if architecture != COMPACT:
        check_runs(network, architecture, num_classes, image_size)
    return network


def classifier_of(network: nn.Module) -> nn.Module:
    """The layer that gives the class scores, re-made for new classes and trained first over a
    frozen backbone: timm's `get_classifier()`, else the last `nn.Linear` (or convolution)."""
    if hasattr(network, "get_classifier"):  # timm
        return network.get_classifier()
    layers = [m for m in network.modules() if isinstance(m, nn.Linear)]
    return (layers or [m for m in network.modules() if isinstance(m, nn.Conv2d)])[-1]


def load_weights(network: nn.Module, path: str | Path, architecture: str) -> None:
    """Start `network` from a state dict or a checkpoint of this project; a classifier for other
    classes is re-made (a warning), any other misfit layer refused by name."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # missing, or whatever it is, not weights we can read
        raise DataError(f"--model.weights {path} holds no weights: {one_line(err)}") from err
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):  # our checkpoint
        state = {k[4:]: v for k, v in state["state_dict"].items() if k.startswith("net.")}
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise DataError(f"--model.weights {path} is not a state dict of tensors")
    own, layer = network.state_dict(), classifier_of(network)
    head = tuple(f"{n}." for n, module in network.named_modules() if module is layer)
    reshaped = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    missing, extra = network.load_state_dict(
        {k: v for k, v in state.items() if k not in reshaped}, strict=False
    )
    wrong = [k for k in reshaped + missing + extra if not k.startswith(head)]
    if wrong:
        raise DataError(
            f"--model.weights {path} does not fit {architecture}: {len(wrong)} layers missing or "
            f"of another shape, e.g. {', '.join(wrong[:3])}"
        )
    if reshaped or missing:
        outputs = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
        rank_zero_warn(
            f"--model.weights {path}: its classifier is for other classes; the classifier is "
            f"re-made for {outputs} classes and trained from random weights"
        )


def check_runs(network: nn.Module, architecture: str, num_classes: int, image_size: int) -> None:
    """Refuse, before training, a network that returns no logits per class when training
    (GoogLeNet's auxiliary outputs), or an image size it cannot run, naming a size that runs."""

    def failure(size: int) -> str | None:
        buffers = [b.clone() for b in network.buffers()]  # BatchNorm's statistics, put back
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):  # dropout's draws too
                logits = network(torch.zeros(2, 3, size, size))
        except (RuntimeError, AssertionError, ValueError) as err:  # shapes that do not fit
            return one_line(err, 160).rstrip("!.")
        finally:
            for buffer, saved in zip(network.buffers(), buffers, strict=True):
                buffer.copy_(saved)
        if not isinstance(logits, Tensor) or tuple(logits.shape) != (2, num_classes):
            raise DataError(
                f"--model.architecture {architecture} returns {type(logits).__name__}, not logits "
                f"per class; use another architecture"
            )
        return None

    reason = failure(image_size)
    if reason is not None:
        size = (pretrained_inputs(architecture) or (224,))[0]
        way_out = f"--data.image_size {size} or " if failure(size) is None else ""
        raise DataError(
            f"--model.architecture {architecture} does not run at --data.image_size {image_size} "
            f"({reason}); use {way_out}another architecture"
        )
