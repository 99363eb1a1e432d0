"""BatchNormalizer: uint8 image batches to normalised float32, on whatever device they arrived."""

from __future__ import annotations

import weakref

import numpy as np
import torch


class BatchNormalizer:
    """`(x / 255 - mean) / std` for a uint8 `(N, 3, H, W)` batch, as one multiply-add per value.

    Images travel as uint8 (4x fewer bytes through workers, pinning and the host-to-device copy)
    and become float only here, after the transfer: on a GPU in one fused pass, on the CPU image
    by image in recycled memory (see `_cpu`).
    """

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean = tuple(mean)
        self.std = tuple(std)
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._buffers: list[list] = []  # [memory, weak reference to its view lent out]

    def __getstate__(self) -> dict:
        # for `spawn` processes and deepcopy: the recycled batches hold weak references, which
        # do not pickle, and are worth nothing in another process
        return {**self.__dict__, "_buffers": []}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        scale, bias = self.constants(images.device)
        if images.device.type != "cpu":
            return images.float().mul_(scale).add_(bias)
        return self._cpu(images, scale[0], bias[0])

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`scale`, `bias` with `(x / 255 - mean) / std == x * scale + bias`, once per device.

        Multiply-add is ~30% faster than subtract-divide on the CPU (12.6 -> 9.1 ms per batch of
        32 at 224 px, one thread); building the tensors once saves a host-to-device copy a batch.
        """
        if device not in self._constants:
            mean = torch.tensor(self.mean, dtype=torch.float64).view(1, 3, 1, 1)
            std = torch.tensor(self.std, dtype=torch.float64).view(1, 3, 1, 1)
            scale, bias = 1 / (255 * std), -mean / std
            self._constants[device] = (
                scale.to(device, torch.float32),
                bias.to(device, torch.float32),
            )
        return self._constants[device]

    def _cpu(self, images: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # On the CPU the loader workers are busy on the same cores: a multi-threaded conversion
        # stalls on descheduled threads, and its idle threads spin, taking CPU from the workers
        # (~40% of the loader's throughput on 2 cores, the template's BENCHMARKS.md). One thread
        # avoids both.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            # Image by image, so that each pass over the floats stays in the CPU cache.
            out = self._float_batch(images.shape)
            for i in range(len(images)):
                out[i].copy_(images[i]).mul_(scale).add_(bias)
            return out
        finally:
            torch.set_num_threads(threads)

    def _float_batch(self, shape: torch.Size) -> torch.Tensor:
        """An uninitialised float32 CPU tensor of `shape`, in memory recycled once it is free.

        A fresh 19 MB batch (32 x 3 x 224 x 224) costs up to 5 ms of page faults in the kernel
        whenever glibc has given the last one back to the system, which it does in some runs and
        not in others. Recycled, the main process needs 4.9 ms of CPU per cached batch instead of
        6.4 ms, and cached epochs ran at 6,400-7,200 images/s on 2 cores against 3,000-5,400
        (the template's BENCHMARKS.md and `benchmarks/cpu_normalise.py`).

        Each tensor is made from a fresh numpy view of the memory, which torch keeps alive as long
        as any tensor or view of that batch exists; the memory is lent again only once a weak
        reference says that view is gone. Nothing the caller keeps is ever overwritten.
        """
        for entry in self._buffers:
            memory, lent = entry
            if memory.shape == shape and lent() is None:
                break
        else:
            # keep the memory still lent out (a batch or two), drop the free ones of other shapes
            self._buffers = [e for e in self._buffers if e[1]() is not None][-3:]
            entry = [np.empty(shape, dtype=np.float32), None]
            self._buffers.append(entry)
        view = entry[0][...]
        entry[1] = weakref.ref(view)
        return torch.from_numpy(view)
