"""The default `--trainer.precision`: bf16 where every GPU does it natively, else fp16 on GPUs."""

from __future__ import annotations

import ctypes

import torch


def default_precision(accelerator: object) -> str | None:
    """`bf16-mixed` on CUDA GPUs that all compute in bf16 natively (compute capability 8.0 and
    later, as `torch.cuda.is_bf16_supported(including_emulation=False)`), `16-mixed` on other
    CUDA GPUs, None (Lightning's fp32) elsewhere.

    Asked of NVML, never of the CUDA runtime: this runs in the launching process, which must not
    initialise CUDA before DDP forks or spawns its workers. (`torch.cuda.is_available()` asks NVML
    too: Lightning sets `PYTORCH_NVML_BASED_CUDA_CHECK=1`.)
    """
    if accelerator not in ("auto", "gpu", "cuda") or not torch.cuda.is_available():
        return None
    return precision_for(_compute_capabilities())


def precision_for(capabilities: list[tuple[int, int]] | None) -> str:
    """The mixed precision for CUDA GPUs of these compute capabilities (None: unknown)."""
    native_bf16 = bool(capabilities) and all(major >= 8 for major, _ in capabilities)
    return "bf16-mixed" if native_bf16 else "16-mixed"


def _compute_capabilities() -> list[tuple[int, int]] | None:
    """(major, minor) of every GPU NVML sees, or None where NVML cannot say (then fp16, which
    every CUDA GPU runs)."""
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
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                return None
            found = nvml.nvmlDeviceGetCudaComputeCapability(
                handle, ctypes.byref(major), ctypes.byref(minor)
            )
            if found != 0:
                return None
            capabilities.append((major.value, minor.value))
        return capabilities
    finally:
        nvml.nvmlShutdown()
