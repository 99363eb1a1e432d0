"""The networks: a compact residual CNN (the default), torchvision and timm models by name."""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from {{ cookiecutter.package_name }}.errors import DataError, one_line
from {{ cookiecutter.package_name }}.model.pretrained import (
    pretrained_inputs,
    timm_network,
    torchvision_pretrained,
)

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
        nn.init.zeros_(self.body[-1].weight)  # each block starts as the identity: stabler
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.body(x) + self.shortcut(x))


class CompactResNet(nn.Module):
    """A small ResNet: a strided stem, then stages that halve resolution and double width."""

    def __init__(
        self, num_classes: int, image_size: int, width: int, depths: tuple[int, ...], dropout: float
    ) -> None:
        super().__init__()
        stride = 1 if image_size < 64 else 2 if image_size < 128 else 4  # stage 1: 32 to 64 pixels
        # A 4x4 stride-4 "patchify" stem (as in ConvNeXt) costs far less than a 7x7 conv + max pool.
        kernel, padding = (4, 0) if stride == 4 else (3, 1)
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, kernel, stride, padding, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        stages, channels = [], width
        for i, depth in enumerate(depths):
            for j in range(depth):
                stages.append(BasicBlock(channels, width * 2**i, 2 if (j == 0 and i > 0) else 1))
                channels = width * 2**i
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
    weights: str | Path | None = None,
    pretrained: bool = False,
) -> nn.Module:
    """The compact CNN, a torchvision model or a timm model by name, with `num_classes` outputs,
    from published weights (`pretrained`), a local file (`weights`) or random ones."""
    if pretrained and weights is not None:
        raise DataError("--model.pretrained and --model.weights both say where to start: pick one")
    if architecture == COMPACT:
        if pretrained:
            raise DataError(
                f"--model.pretrained: {COMPACT} has no published weights; start it from a file "
                f"with --model.weights PATH, or pick a torchvision or timm architecture"
            )
        network: nn.Module = CompactResNet(num_classes, image_size, width, tuple(depths), dropout)
    else:
        if not _is_torchvision(architecture):
            network = timm_network(architecture, num_classes, dropout, pretrained)
        elif pretrained:  # torchvision's classifier (`classifier_of`) re-made for our classes
            network = torchvision_pretrained(architecture)
            name, layer = _last_layer(network)
            if isinstance(layer, nn.Linear):
                fresh: nn.Module = nn.Linear(layer.in_features, num_classes)
            else:
                fresh = nn.Conv2d(layer.in_channels, num_classes, layer.kernel_size)
            network.set_submodule(name, fresh)
        else:
            network = _torchvision_network(architecture, num_classes)
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
    return _last_layer(network)[1]


def load_weights(network: nn.Module, path: str | Path, architecture: str) -> None:
    """Start `network` from a state dict, `.safetensors` file or checkpoint of this project; a
    classifier for other classes is re-made (a warning), any other misfit layer refused by name."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--model.weights {path} is not a file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except ImportError as err:
        raise DataError(
            f'--model.weights {path}: reading .safetensors needs pip install ".[timm]" ({err})'
        ) from err
    except Exception as err:  # whatever the file is, it is not weights we can read
        raise DataError(f"--model.weights {path} holds no weights: {one_line(err)}") from err
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):  # our checkpoint
        state = {k[4:]: v for k, v in state["state_dict"].items() if k.startswith("net.")}
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise DataError(f"--model.weights {path} is not a state dict of tensors")
    own, layer = network.state_dict(), classifier_of(network)
    head = tuple(f"{n}." for n, module in network.named_modules() if module is layer)
    reshaped = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    # torch's account of missing and extra keys: a layer set to None (aux heads) is neither
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
    """Refuse, before training, a network that returns no logits per class, or an image size it
    cannot run (one image, in eval mode), naming a size that runs."""

    def failure(size: int) -> str | None:
        training = network.training
        try:
            with torch.no_grad():
                logits = network.eval()(torch.zeros(1, 3, size, size))
        except (RuntimeError, AssertionError, ValueError) as err:  # shapes that do not fit
            return one_line(err, 160).rstrip("!.")
        finally:
            network.train(training)
        if not isinstance(logits, Tensor) or tuple(logits.shape) != (1, num_classes):
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


def _is_torchvision(architecture: str) -> bool:
    return architecture in torchvision.models.list_models(module=torchvision.models)


def _torchvision_network(architecture: str, num_classes: int) -> nn.Module:
    """torchvision's `architecture`, random, with plain logits in every mode (GoogLeNet's and
    Inception v3's auxiliary heads removed, as torchvision does for its weights)."""
    options: dict = {"num_classes": num_classes}
    if architecture in ("googlenet", "inception_v3"):
        options["init_weights"] = True  # torchvision's own initialisation for these two
    network = torchvision.models.get_model(architecture, weights=None, **options)
    if isinstance(network, torchvision.models.GoogLeNet):
        network.aux_logits, network.aux1, network.aux2 = False, None, None
    elif isinstance(network, torchvision.models.Inception3):
        network.aux_logits, network.AuxLogits = False, None
    return network


def _last_layer(network: nn.Module) -> tuple[str, nn.Module]:
    layers = [(n, m) for n, m in network.named_modules() if isinstance(m, nn.Linear)]
    return (layers or [(n, m) for n, m in network.named_modules() if isinstance(m, nn.Conv2d)])[-1]
