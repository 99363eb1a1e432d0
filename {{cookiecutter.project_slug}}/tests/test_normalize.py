"""BatchNormalizer: uint8 batches to normalised float."""

from __future__ import annotations

import pickle

import torch

from {{ cookiecutter.package_name }}.data.normalize import BatchNormalizer

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def reference(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (images.double() / 255 - mean) / std


def test_normalises_every_value_as_mean_and_std_say() -> None:
    images = torch.arange(256, dtype=torch.uint8).repeat(2, 3, 4, 8)[:, :, :, :64]
    out = BatchNormalizer(MEAN, STD)(images)
    assert out.dtype == torch.float32 and out.shape == images.shape
    assert torch.allclose(out.double(), reference(images), atol=1e-5)
    assert torch.equal(images, torch.arange(256, dtype=torch.uint8).repeat(2, 3, 4, 8)[..., :64])
    copy = pickle.loads(pickle.dumps(BatchNormalizer(MEAN, STD)))  # as for spawn workers
    assert torch.equal(copy(images), out)


def test_cpu_path_leaves_torch_thread_count_as_it_was() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1, which the CPU path sets while it runs (OMP_NUM_THREADS=1)
    try:
        BatchNormalizer(MEAN, STD)(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
