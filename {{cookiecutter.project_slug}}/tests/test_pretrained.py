"""Starting from weights: timm models, published weights from a local Hugging Face cache (made
here, offline), local weight files, and the errors when none of them is there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import CLASSES, one_error, tiny_run_options

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.model.networks import build_network, classifier_of

timm = pytest.importorskip("timm", reason="the timm extra: pip install '.[timm]'")
from safetensors.torch import save_file  # noqa: E402  (the timm extra brings it)

TIMM_MODEL = "test_resnet.r160_in1k"  # a tiny timm model with published weights (160 px)
STEM = "conv1.0.weight"  # its first convolution


def hub_cache(home: Path, model: str = TIMM_MODEL) -> dict[str, torch.Tensor]:
    """A Hugging Face cache under `home` (HF_HOME) with random weights for timm's `model`."""
    weights = timm.create_model(model).state_dict()
    repo = home / "hub" / f"models--timm--{model}"
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    save_file(weights, snapshot / "model.safetensors")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    return weights


def hub_home(folder: Path, monkeypatch: pytest.MonkeyPatch, offline: bool) -> Path:
    """Empty Hugging Face and torch hub folders under `folder`, downloads on or off."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(folder / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(folder / "torch"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads its settings when imported: set them there too
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    return folder / "hf"


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return hub_home(tmp_path, monkeypatch, offline=True)


def test_published_weights_from_the_hub_cache_or_a_refusal_naming_the_folder_file_or_extra(
    offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(DataError, match=f"weights of {TIMM_MODEL} are not in the Hugging") as e:
        build_network(TIMM_MODEL, 3, 160, pretrained=True)
    assert str(offline_hub / "hub") in str(e.value)
    weights = hub_cache(offline_hub)
    for name in (TIMM_MODEL, f"timm/{TIMM_MODEL}"):  # the hub-style name too
        network = build_network(name, 3, 160, pretrained=True)
        torch.testing.assert_close(network.state_dict()[STEM], weights[STEM])
        assert classifier_of(network).out_features == 3  # the head re-made for three classes
    for name in ("compact_resnet", "resnet18"):  # torchvision's resnet18: timm's are named
        with pytest.raises(DataError, match=f"timm's published weights, and {name} is not a timm"):
            build_network(name, 3, 32, pretrained=True)
    with pytest.raises(DataError, match="'no_such_net' is neither compact_resnet, .* nor a timm"):
        build_network("no_such_net", 3, 32)
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "resnet18.pth")
    with pytest.raises(DataError, match=f"does not fit {TIMM_MODEL}: .* e.g. "):
        build_network(TIMM_MODEL, 3, 32, weights=tmp_path / "resnet18.pth")
    (tmp_path / "notes.txt").write_text("not weights")
    with pytest.raises(DataError, match="notes.txt holds no weights"):
        build_network(TIMM_MODEL, 3, 32, weights=tmp_path / "notes.txt")
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    with pytest.raises(DataError, match=r'pip install "\.\[timm\]"'):
        build_network(TIMM_MODEL, 3, 32)


@pytest.mark.parametrize("kind", ["pt", "ckpt"])  # a state dict, a checkpoint
def test_weights_file_of_other_classes_starts_the_backbone(tmp_path: Path, kind: str) -> None:
    trained = ImageClassifier(class_names=["x", "y"], image_size=32, architecture=TIMM_MODEL)
    state, path = trained.net.state_dict(), tmp_path / f"weights.{kind}"
    ckpt = {"state_dict": trained.state_dict(), "hyper_parameters": {}}  # the net's, `net.` first
    torch.save(state if kind == "pt" else ckpt, path)
    with pytest.warns(UserWarning, match="classifier is re-made for 3 classes"):
        model = ImageClassifier(list(CLASSES), 32, architecture=TIMM_MODEL, weights=str(path))
    torch.testing.assert_close(model.net.state_dict()[STEM], state[STEM])
    assert model.net.fc.out_features == 3


@pytest.mark.slow
def test_fit_a_pretrained_timm_model_through_the_cli(
    image_root: Path, tmp_path: Path, offline_hub: Path, run_main
) -> None:
    """Offline, from a hub cache: the weights' image size and normalisation are taken, said and
    recorded; from a local file of 1000 classes, the classifier is re-made for three."""
    hub_cache(offline_hub)
    options = [o for o in tiny_run_options(image_root) if o not in ("--data.image_size", "16")]
    options += ["--model.architecture", TIMM_MODEL, "--trainer.max_epochs", "1"]
    options += ["--trainer.limit_train_batches", "2", "--trainer.logger", "false"]
    hub = ["--model.pretrained", "true", "--checkpoint.dirpath", "hub"]
    done = run_main("fit", *options, *hub, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = f"--model.pretrained {TIMM_MODEL}: --data.image_size 160, --data.mean (0.5, 0.5, 0.5)"
    assert said in done.stdout
    hparams = torch.load(tmp_path / "hub" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["image_size"] == 160
    assert tuple(hparams["mean"]) == tuple(hparams["std"]) == (0.5,) * 3
    torch.save(timm.create_model(TIMM_MODEL).state_dict(), tmp_path / "w.pt")
    weights = ["--model.weights", str(tmp_path / "w.pt"), "--data.image_size", "32"]
    with pytest.warns(UserWarning, match="classifier is re-made for 3 classes"):
        local = run_main("fit", *options, *weights, "--checkpoint.dirpath", "local", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    assert f"--model.weights {TIMM_MODEL}: --data.mean (0.5, 0.5, 0.5)" in local.stdout


def test_fit_without_the_weights_stops_in_one_line(
    offline_hub: Path, image_root: Path, tmp_path: Path, run_main
) -> None:
    """Before training, naming the model and the folder."""
    options = ["--model.architecture", TIMM_MODEL, "--model.pretrained", "true"]
    failed = run_main("fit", *tiny_run_options(image_root), *options, cwd=tmp_path)
    line = one_error(failed.returncode, failed.stderr)
    assert TIMM_MODEL in line and str(offline_hub / "hub") in line
