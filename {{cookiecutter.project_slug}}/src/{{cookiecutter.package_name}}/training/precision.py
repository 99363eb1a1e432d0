"""The default `--trainer.precision`: bf16 where every GPU does it natively, else fp16 on GPUs."""

from __future__ import annotations

import ctypes

import torch


def default_precision(accelerator: object) -> str | None:
    """None (fp32) off CUDA. Asked of NVML: CUDA must not start before DDP forks its workers."""
    if accelerator not in ("auto", "gpu", "cuda") or not torch.cuda.is_available():
        return None
    return precision_for(_compute_capabilities())


def precision_for(capabilities: list[tuple[int, int]] | None) -> str:  # None: unknown
    native_bf16 = bool(capabilities) and all(major >= 8 for major, _ in capabilities)
    return "bf16-mixed" if native_bf16 else "16-mixed"


def _compute_capabilities() -> list[tuple[int, int]] | None:
    """(major, minor) of every GPU NVML sees, or None where NVML cannot say."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        capabilities = []
        for index in range(count.value):
            handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
            failed = nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) or (
                nvml.nvmlDeviceGetCudaComputeCapability(handle, *map(ctypes.byref, (major, minor)))
            )
            if failed:
                return None
            capabilities.append((major.value, minor.value))
        return capabilities
    finally:
        nvml.nvmlShutdown()
