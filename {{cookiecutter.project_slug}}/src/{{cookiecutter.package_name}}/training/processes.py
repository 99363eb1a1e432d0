"""A DDP run's processes on one machine: each ends with its starter, its process group closed."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch

# The process id of the command that starts Lightning's copies of itself (ranks 1.. of DDP).
STARTED_BY = "{{ cookiecutter.package_name | upper }}_STARTED_BY"


def end_with_starter() -> None:
    """In a DDP rank this command started, end with the starter (PR_SET_PDEATHSIG, Linux), or at
    once if it is gone: else Lightning waits 30 minutes to connect (docs/distributed.md)."""
    starter = os.environ.pop(STARTED_BY, None)
    if starter is not None and os.environ.get("LOCAL_RANK", "0") != "0":
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG, <sys/prctl.h>
        if str(os.getppid()) != starter:  # it ended first: this process was handed on
            os._exit(1)
    os.environ[STARTED_BY] = str(os.getpid())


def close_process_group() -> None:
    """Tear down torch.distributed before the interpreter does (PyTorch's DDP guide): Lightning
    does it for NCCL only, and a gloo group left once aborted a run (-6)."""
    os.environ.pop(STARTED_BY, None)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
