"""timm models by name, from their published weights where asked (timm's and huggingface_hub's
own cache, HF_HUB_OFFLINE honoured), and the image size and normalisation of those weights."""

from __future__ import annotations

import torchvision

from {{ cookiecutter.package_name }}.errors import DataError, one_line


def _timm(architecture: str):
    try:
        import timm
    except ImportError:
        timm = None
    name = architecture.removeprefix("timm/")  # the hub's name: timm/convnext_nano.in12k
    if timm is None or not timm.is_model(name):
        how = "timm.list_models() lists them" if timm else 'needs pip install ".[timm]"'
        raise DataError(
            f"--model.architecture {architecture!r} is neither compact_resnet, a torchvision "
            f"classification model (e.g. resnet18) nor a timm model (e.g. convnext_nano.in12k; "
            f"{how})"
        )
    return timm, name


def timm_network(architecture: str, num_classes: int, dropout: float, pretrained: bool):
    """timm's `architecture` with a fresh classifier of `num_classes`, from its published
    weights when `pretrained` (timm then leaves the old classifier out)."""
    timm, name = _timm(architecture)
    try:
        return timm.create_model(
            name, pretrained=pretrained, num_classes=num_classes, drop_rate=dropout
        )
    except TypeError as err:  # the encoders of multimodal models take no classifier options
        raise DataError(
            f"--model.architecture {architecture}: timm does not build it as a classifier "
            f"({one_line(err)}); use another architecture"
        ) from err
    except (OSError, RuntimeError, ValueError) as err:  # offline, or no such weights
        if not pretrained:
            raise
        from huggingface_hub import constants

        raise DataError(
            f"--model.pretrained: the weights of {name} are not in the Hugging Face cache "
            f"{constants.HF_HUB_CACHE} and could not be downloaded ({one_line(err)}); run once "
            f"with network access, point HF_HOME at a cache that has them, or give a file with "
            f"--model.weights PATH"
        ) from err


def pretrained_inputs(architecture: str) -> tuple[int, tuple, tuple] | None:
    """(image size, mean, std) of the published weights of `architecture`, or None."""
    if architecture in torchvision.models.list_models(module=torchvision.models):
        preset = torchvision.models.get_model_weights(architecture).DEFAULT.transforms()
        return int(preset.crop_size[0]), tuple(preset.mean), tuple(preset.std)
    if architecture == "compact_resnet":
        return None
    timm, name = _timm(architecture)
    if (config := timm.get_pretrained_cfg(name)) is None:
        return None
    return int(config.input_size[-1]), tuple(config.mean), tuple(config.std)
