"""BatchNormalizer: uint8 batches to normalised float, and the CPU path's recycled memory."""

from __future__ import annotations

import pickle

import numpy as np
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


def test_cpu_path_leaves_torch_thread_count_as_it_was() -> None:
    before = torch.get_num_threads()
    BatchNormalizer(MEAN, STD)(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))
    assert torch.get_num_threads() == before


def test_cpu_batches_reuse_memory_only_once_nothing_refers_to_it() -> None:
    normalize = BatchNormalizer(MEAN, STD)
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    expected = reference(images).float()

    first = normalize(images)
    kept_view = first[1:3]  # e.g. a few images kept for logging, the batch itself dropped
    first_address = first.data_ptr()
    del first
    second = normalize(255 - images)
    assert second.data_ptr() != first_address  # the view still holds the first batch
    assert torch.allclose(kept_view, expected[1:3], atol=1e-5)  # ... which was not overwritten

    second_address = second.data_ptr()
    del kept_view, second
    third = normalize(images)
    assert third.data_ptr() in (first_address, second_address)  # freed memory is recycled
    assert torch.allclose(third, expected, atol=1e-5)
    as_numpy = third.numpy()
    del third
    fourth = normalize(255 - images)
    assert fourth.data_ptr() != as_numpy.ctypes.data  # a numpy view keeps it too
    assert np.allclose(as_numpy, expected.numpy(), atol=1e-5)


def test_a_new_shape_gets_new_memory() -> None:
    normalize = BatchNormalizer(MEAN, STD)
    small = normalize(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    address = small.data_ptr()
    del small
    large = normalize(torch.full((3, 3, 8, 8), 255, dtype=torch.uint8))
    assert large.shape == (3, 3, 8, 8) and large.data_ptr() != address
    assert torch.allclose(large, reference(torch.full((3, 3, 8, 8), 255)).float(), atol=1e-5)


def test_pickles_without_its_buffers_for_spawn_workers() -> None:
    normalize = BatchNormalizer(MEAN, STD)
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    kept = normalize(images)  # a buffer lent out: a weak reference, which cannot pickle
    copy = pickle.loads(pickle.dumps(normalize))
    assert copy._buffers == [] and len(normalize._buffers) == 1
    assert torch.equal(copy(images), kept)
