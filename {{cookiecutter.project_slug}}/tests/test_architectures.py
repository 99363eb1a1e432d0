"""`--model.architecture`: a torchvision or timm model is accepted only if it trains at the data's
image size and returns plain logits, else refused in one line before training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import one_error, tiny_run_options

from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.model.networks import check_runs

SIZE = 32


@pytest.mark.slow
def test_each_torchvision_family_is_refused_in_one_line_or_trains_one_cpu_step() -> None:
    """A family: the torchvision module that builds it (resnext50_32x4d is a ResNet), checked at
    its smallest model; a refusal names a size that runs."""
    smallest: dict[str, tuple[int, str]] = {}
    for name in torchvision.models.list_models(module=torchvision.models):
        family = torchvision.models.get_model_builder(name).__module__
        size = torchvision.models.get_model_weights(name).DEFAULT.meta["num_params"]
        smallest[family] = min(smallest.get(family, (size, name)), (size, name))
    refused, accepted = {}, []
    for _, name in smallest.values():
        try:
            check_runs(name, 7, SIZE)
            accepted.append(name)
        except DataError as err:
            refused[name] = str(err)
    for name, message in refused.items():
        pattern = rf"--model.architecture {name} does not run at --data.image_size {SIZE} \(.+\)"
        assert re.fullmatch(pattern + "; use .*another architecture", message), message
        way_out = re.search(r"--data.image_size (\d+) or", message)
        if way_out:  # the size it suggests is one that runs
            check_runs(name, 7, int(way_out.group(1)))
    assert {"vit_b_16", "inception_v3", "alexnet"} <= set(refused)
    assert "Expected 224 but got 32" in refused["vit_b_16"]
    assert {"resnet18", "googlenet", "regnet_y_400mf", "squeezenet1_1", "swin_t"} <= set(accepted)
    assert len(accepted) >= 12, accepted  # resnet, mobilenetv3, efficientnet, regnet, vgg, ...
    torch.manual_seed(0)
    images, targets = torch.randn(2, 3, SIZE, SIZE), torch.tensor([0, 2])
    for name in accepted:
        model = ImageClassifier(class_names=["a", "b", "c"], image_size=SIZE, architecture=name)
        model.train()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model.loss(model(images), targets)
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss), name
        after = list(model.parameters())
        changed = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
        assert sum(changed) > len(changed) // 2, name


def test_a_model_built_from_computed_widths_is_checked_without_its_memory() -> None:
    check_runs("regnet_y_128gf", 10, SIZE)  # about 645 million parameters, none allocated


def test_fit_refuses_a_model_too_big_for_the_images(
    image_root: Path, tmp_path: Path, run_main
) -> None:
    options = ["--model.architecture", "alexnet", "--trainer.max_epochs", "1"]
    fit = run_main("fit", *tiny_run_options(image_root), *options, cwd=tmp_path)
    line = one_error(fit.returncode, fit.stderr)
    assert "alexnet does not run at --data.image_size 16" in line
    assert "use --data.image_size 63 or another architecture" in line
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_timm_model_is_checked_at_the_image_size_before_training(
    image_root: Path, tmp_path: Path, run_main
) -> None:
    """A ViT (224 pixels only) at 16 is refused in one line before training (a timm model that
    runs trains: test_pretrained.py's fit)."""
    pytest.importorskip("timm", reason="the timm extra: pip install '.[timm]'")
    run = [*tiny_run_options(image_root), "--trainer.max_epochs", "1", "--trainer.logger", "false"]
    fit = run_main("fit", *run, "--model.architecture", "vit_tiny_patch16_224", cwd=tmp_path)
    line = one_error(fit.returncode, fit.stderr)
    assert line == (
        "error: --model.architecture vit_tiny_patch16_224 does not run at --data.image_size 16 "
        "(Input height (16) doesn't match model (224)); use --data.image_size 224 or another "
        "architecture"
    )
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_timm_model_that_runs_itself_while_built_is_checked_too() -> None:
    """A hybrid ViT runs its CNN stem while it is built, which the meta-device build allows."""
    pytest.importorskip("timm", reason="the timm extra: pip install '.[timm]'")
    check_runs("vit_tiny_r_s16_p8_224", 3, 224)
    refused = r"vit_tiny_r_s16_p8_224 does not run at --data.image_size 128 \(.+\); use .* 224 "
    with pytest.raises(DataError, match=refused):
        check_runs("vit_tiny_r_s16_p8_224", 3, 128)


def test_a_timm_model_that_is_no_classifier_is_refused_in_one_line() -> None:
    """Encoders of multimodal models: one takes no classifier options, another returns features."""
    pytest.importorskip("timm", reason="the timm extra: pip install '.[timm]'")
    with pytest.raises(DataError, match="gemma4_vit_167m_enc: timm does not build it as a class"):
        check_runs("gemma4_vit_167m_enc", 3, 768)
    with pytest.raises(DataError, match="it returns Tensor, not logits per class"):
        check_runs("qwen3_vit_88m_enc", 3, 768)
