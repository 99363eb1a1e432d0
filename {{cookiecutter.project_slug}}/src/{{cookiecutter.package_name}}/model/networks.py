"""The networks: a compact residual CNN (the default) and torchvision architectures by name."""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.errors import DataError

COMPACT = "compact_resnet"


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection, as in ResNet-18."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        nn.init.zeros_(
            self.body[-1].weight
        )  # each block starts as the identity: stabler early training
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.body(x) + self.shortcut(x))


class CompactResNet(nn.Module):
    """A small ResNet: a strided stem, `len(depths)` stages that halve resolution and double width.

    Args:
        stem_stride: downsampling of the stem; by default chosen from `image_size` so that the
            first stage sees 32 to 64 pixels: 1 below 64, 2 below 128, else 4.
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int,
        width: int = 32,
        depths: tuple[int, ...] = (1, 1, 2, 1),
        stem_stride: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if stem_stride is None:
            stem_stride = 1 if image_size < 64 else 2 if image_size < 128 else 4
        # A 4x4 stride-4 "patchify" stem (as in ConvNeXt) costs far less than a 7x7 conv + max pool.
        kernel, padding = (4, 0) if stem_stride == 4 else (3, 1)
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, kernel, stem_stride, padding, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        stages = []
        channels = width
        for i, depth in enumerate(depths):
            out = width * 2**i
            for j in range(depth):
                stages.append(BasicBlock(channels, out, 2 if (j == 0 and i > 0) else 1))
                channels = out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(channels, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.stages(self.stem(x)))


def build_network(
    architecture: str,
    num_classes: int,
    image_size: int,
    width: int = 32,
    depths: tuple[int, ...] = (1, 1, 2, 1),
    dropout: float = 0.0,
    weights_path: str | Path | None = None,
) -> nn.Module:
    """The compact CNN, or a torchvision model by name (`resnet18`, `efficientnet_b0`, ...).

    torchvision models start from random weights, or from `weights_path`: a local state dict for
    the architecture as torchvision defines it (usually ImageNet, 1000 classes), whose last linear
    layer is then replaced to give `num_classes` outputs. Nothing is ever downloaded.
    """
    if architecture == COMPACT:
        if weights_path is not None:
            raise DataError("--model.weights_path is for torchvision architectures only")
        return CompactResNet(num_classes, image_size, width, tuple(depths), dropout=dropout)
    available = torchvision.models.list_models(module=torchvision.models)
    if architecture not in available:
        raise DataError(
            f"--model.architecture {architecture!r} is neither {COMPACT!r} nor a torchvision "
            f"classification model (e.g. resnet18, resnet50, efficientnet_b0, convnext_tiny)"
        )
    if weights_path is None:
        return torchvision.models.get_model(architecture, weights=None, num_classes=num_classes)
    network = torchvision.models.get_model(architecture, weights=None)
    path = Path(weights_path)
    if not path.is_file():
        raise DataError(f"--model.weights_path {path} is not a file")
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        network.load_state_dict(state)
    except RuntimeError as err:
        raise DataError(f"--model.weights_path {path} does not fit {architecture}: {err}") from err
    _replace_last_linear(network, num_classes)
    return network


def _replace_last_linear(network: nn.Module, num_classes: int) -> None:
    """Swap the last `nn.Linear` (the classifier of every torchvision model) for a fresh one."""
    name, layer = [(n, m) for n, m in network.named_modules() if isinstance(m, nn.Linear)][-1]
    parent_name, _, attribute = name.rpartition(".")
    parent = network.get_submodule(parent_name) if parent_name else network
    setattr(parent, attribute, nn.Linear(layer.in_features, num_classes))
