"""BatchNormalizer: uint8 image batches to normalised float32, on whatever device they arrived."""

from __future__ import annotations

import torch


class BatchNormalizer:
    """`(x / 255 - mean) / std` as one multiply-add per value: images travel as uint8 (4x fewer
    bytes) and become float only here."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = tuple(mean), tuple(std)
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        scale, bias = self.constants(images.device)
        if images.device.type != "cpu":
            return images.float().mul_(scale).add_(bias)
        # CPU: one thread (the loader workers busy the cores, where torch's threads stall and
        # spin), image by image so that each pass over the floats stays in the CPU cache.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = torch.empty(images.shape, dtype=torch.float32)
            for i in range(len(images)):
                out[i].copy_(images[i]).mul_(scale[0]).add_(bias[0])
            return out
        finally:
            torch.set_num_threads(threads)

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`scale`, `bias` with `(x / 255 - mean) / std == x * scale + bias`, once per device."""
        if device not in self._constants:
            mean, std = torch.tensor([self.mean, self.std], dtype=torch.float64).view(2, 1, 3, 1, 1)
            pair = (1 / (255 * std), -mean / std)
            self._constants[device] = tuple(t.to(device, torch.float32) for t in pair)
        return self._constants[device]
