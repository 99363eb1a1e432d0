"""The processes of a DDP run on one machine: each ends with the one that started it, and each
closes its process group before the interpreter ends."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch

# The process id of the command that starts Lightning's copies of itself (ranks 1.. of DDP).
STARTED_BY = "{{ cookiecutter.package_name | upper }}_STARTED_BY"
_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def end_with_starter() -> None:
    """In a DDP rank that this command started as a copy of itself, end when the starter ends.

    Lightning's DDP on one machine starts ranks 1.. as copies of the command line
    (`_SubprocessScriptLauncher`) and ends them if one of them fails, but nothing ends them when
    rank zero fails before the processes have met (its port taken by another run's, an error seen
    on rank zero only): they wait for it inside the connection, up to its 30-minute timeout,
    holding their devices and their terminal. A thread cannot watch for it: the connection holds
    Python's lock while it waits. So each command names itself, while it runs, in the environment
    its copies inherit, and a rank started by it asks Linux to kill it when its parent ends
    (PR_SET_PDEATHSIG), or ends at once if it already has. On macOS only the second holds; on
    Windows, which does not hand a process on to another parent, neither.
    """
    starter = os.environ.pop(STARTED_BY, None)
    if starter is not None and os.environ.get("LOCAL_RANK", "0") != "0":
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if str(os.getppid()) != starter:  # it ended first: this process was handed on
            os._exit(1)
    os.environ[STARTED_BY] = str(os.getpid())


def close_process_group() -> None:
    """Tear down torch.distributed before the interpreter does, as PyTorch's DDP guide asks.

    Lightning does it at exit for NCCL only. A gloo group (DDP on CPUs) left to interpreter
    shutdown aborted a finished run once in our two-node test ("terminate called without an active
    exception", exit code -6), after every checkpoint had been written. Local, not collective.
    The command is over, too: no process it starts now is one of its ranks.
    """
    os.environ.pop(STARTED_BY, None)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
