"""`--model.architecture`: the compact CNN, or a torchvision or timm model accepted only if it
runs at the data's image size and returns plain logits when training, else refused in one line
before training; a local weights file of other classes starts it with the classifier re-made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import one_error, tiny_run_options

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.model.networks import build_network

SIZE = 32


@pytest.mark.slow
def test_each_torchvision_family_is_refused_in_one_line_or_trains_one_cpu_step() -> None:
    """Each family (the module that builds it) at its smallest model; a refusal names a size that
    runs, or the outputs that are no logits (GoogLeNet's auxiliary heads)."""
    smallest: dict[str, tuple[int, str]] = {}
    for name in torchvision.models.list_models(module=torchvision.models):
        family = torchvision.models.get_model_builder(name).__module__
        size = torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]
        smallest[family] = min(smallest.get(family, (size, name)), (size, name))
    refused, accepted = {}, []
    torch.manual_seed(0)
    images, targets = torch.randn(2, 3, SIZE, SIZE), torch.tensor([0, 2])
    for _, name in smallest.values():
        try:
            model = ImageClassifier(class_names=["a", "b", "c"], image_size=SIZE, architecture=name)
        except DataError as err:
            refused[name] = str(err)
            continue
        accepted.append(name)
        before = [p.detach().clone() for p in model.parameters()]
        loss = model.loss(model.train()(images), targets)
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        assert torch.isfinite(loss), name
        changed = [not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)]
        assert sum(changed) > len(changed) // 2, name
    reason = rf"(does not run at --data.image_size {SIZE} \(.+\)|returns \w+, not logits per class)"
    for name, message in refused.items():
        pattern = rf"--model.architecture {name} {reason}; use .*another architecture"
        assert re.fullmatch(pattern, message), message
        if way_out := re.search(r"--data.image_size (\d+) or", message):
            build_network(name, 3, int(way_out.group(1)))  # the size it suggests runs
    assert {"vit_b_16", "inception_v3", "alexnet"} <= set(refused)
    assert "Expected 224 but got 32" in refused["vit_b_16"]
    assert "returns GoogLeNetOutputs, not logits" in refused["googlenet"]
    assert {"resnet18", "regnet_y_400mf", "squeezenet1_1", "swin_t"} <= set(accepted)
    assert len(accepted) >= 12, accepted  # resnet, mobilenetv3, efficientnet, regnet, vgg, ...


@pytest.mark.parametrize("size", [32, 224])  # 224: downsampled by the stem
def test_the_compact_cnn_gives_one_logit_per_class_and_saves_the_data_options(size: int) -> None:
    model = ImageClassifier(class_names=["a", "b", "c"], image_size=size)
    assert model(torch.randn(2, 3, size, size)).shape == (2, 3)
    assert model.hparams.class_names == ["a", "b", "c"] and model.hparams.image_size == size


@pytest.mark.parametrize("architecture", ["resnet18", "squeezenet1_1"])  # a convolutional head
def test_a_local_weights_file_loads_with_the_classifier_re_made(
    tmp_path: Path, architecture: str
) -> None:
    pretrained = torchvision.models.get_model(architecture)  # 1000 classes
    weights = str(tmp_path / "weights.pth")
    torch.save(pretrained.state_dict(), weights)
    model = ImageClassifier(list("abcdefg"), 32, architecture=architecture, weights=weights)
    assert isinstance(model.net, type(pretrained))
    torch.testing.assert_close(next(model.net.parameters()), next(pretrained.parameters()))
    logits = model.train()(torch.randn(2, 3, 32, 32))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 7)


def test_fit_refuses_a_model_that_cannot_run_at_the_image_size_in_one_line(
    image_root: Path, tmp_path: Path, run_main
) -> None:
    options = ["--model.architecture", "alexnet", "--trainer.max_epochs", "1"]
    fit = run_main("fit", *tiny_run_options(image_root), *options, cwd=tmp_path)
    said = r"error: --model.architecture alexnet does not run at --data.image_size 16 \(.+\); "
    said += "use --data.image_size 224 or another architecture"
    assert re.fullmatch(said, one_error(fit.returncode, fit.stderr))
    assert not list(tmp_path.rglob("*.ckpt"))


def test_timm_models_that_run_while_built_or_are_no_classifiers() -> None:
    """A hybrid ViT (its CNN stem runs while it is built); of two multimodal encoders, one takes no
    classifier options, the other returns features."""
    pytest.importorskip("timm", reason="the timm extra: pip install '.[timm]'")
    build_network("vit_tiny_r_s16_p8_224", 3, 224)
    refused = r"vit_tiny_r_s16_p8_224 does not run at --data.image_size 128 \(.+\); use .* 224 "
    with pytest.raises(DataError, match=refused):
        build_network("vit_tiny_r_s16_p8_224", 3, 128)
    with pytest.raises(DataError, match="gemma4_vit_167m_enc: timm does not build it as a class"):
        build_network("gemma4_vit_167m_enc", 3, 768)
    with pytest.raises(DataError, match="qwen3_vit_88m_enc returns Tensor, not logits per class"):
        build_network("qwen3_vit_88m_enc", 3, 64)
