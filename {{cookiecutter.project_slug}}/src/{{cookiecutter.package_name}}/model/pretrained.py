"""Published weights, offline-safe: timm's and torchvision's, read from their local cache before
any download, and a stop naming the model and the folder where neither has them."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import torch
import torchvision
from torch import nn

from {{ cookiecutter.package_name }}.errors import DataError, one_line

TIMM_PREFIX = "timm/"  # as the Hugging Face hub names timm's weights: timm/convnext_nano.in12k
DOWNLOAD_TIMEOUT = 30.0  # seconds a download through torch's hub (urllib) waits for bytes


def _timm(architecture: str):
    try:
        import timm
    except ImportError:
        timm = None
    name = architecture.removeprefix(TIMM_PREFIX)
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
    options = {"num_classes": num_classes, "drop_rate": dropout}
    if not pretrained:
        try:
            return timm.create_model(name, **options)
        except TypeError as err:  # the encoders of multimodal models take no classifier options
            raise DataError(
                f"--model.architecture {architecture}: timm does not build it as a classifier "
                f"({one_line(err)}); use another architecture"
            ) from err
    try:  # from the cache file itself: no network call at all when the weights are here
        cached = _cached_or_reachable(timm, name)
        cfg = {"file": cached, "source": ""} if cached else None
        with _download_timeout():
            return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=cfg, **options)
    except (OSError, RuntimeError, ValueError) as err:  # offline, or no such weights
        from huggingface_hub import constants

        raise DataError(
            f"--model.pretrained: the weights of {name} are not in the Hugging Face cache "
            f"{constants.HF_HUB_CACHE} and could not be downloaded ({one_line(err)}); run once "
            f"with network access, point HF_HOME at a cache that has them, or give a file with "
            f"--model.weights PATH"
        ) from err


def _cached_or_reachable(timm, name: str) -> str | None:
    """The weights file of timm's `name` in the Hugging Face cache, if there; else OSError if the
    hub cannot be reached, asked once (an uncached download retries for 45 s offline)."""
    import huggingface_hub as hub
    from huggingface_hub import constants
    from huggingface_hub.utils import HfHubHTTPError

    config = timm.get_pretrained_cfg(name)
    if config is None or not config.hf_hub_id:
        return None  # URL weights go through torch's hub
    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = hub.try_to_load_from_cache(config.hf_hub_id, filename)
        if isinstance(found, str):
            return found
    if constants.HF_HUB_OFFLINE:
        return None  # offline mode fails at once by itself
    url = hub.hf_hub_url(config.hf_hub_id, config.hf_hub_filename or "model.safetensors")
    try:
        hub.get_hf_file_metadata(url, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except HfHubHTTPError:
        pass  # the hub answered (a file timm then looks past, say): it can be reached
    except Exception as err:  # httpx's (or requests') connection errors, timeouts, proxies
        raise OSError(f"{constants.ENDPOINT} cannot be reached: {one_line(err)}") from err
    return None


@contextlib.contextmanager
def _download_timeout() -> Iterator[None]:
    """The process-wide socket timeout `DOWNLOAD_TIMEOUT` while a model is built (torch's hub
    takes none), then put back."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)


def torchvision_pretrained(architecture: str) -> nn.Module:
    """torchvision's `architecture` with its default published weights (still 1000 classes)."""
    weights = torchvision.models.get_model_weights(architecture).DEFAULT
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    try:  # torch's hub uses the file in `folder` if it is there, else downloads it there
        with _download_timeout():
            return torchvision.models.get_model(architecture, weights=weights)
    except OSError as err:  # urllib's errors are OSErrors: offline, refused, timed out
        name = os.path.basename(weights.url)
        raise DataError(
            f"--model.pretrained: the weights of {architecture} ({name}) are not in torch's hub "
            f"folder {folder} and could not be downloaded ({one_line(err)}); run once with "
            f"network access, set TORCH_HOME, or give a file with --model.weights PATH"
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
