"""Work for ranks that fail on purpose, in a module of its own: the ranks `run_on_ranks`
spawns import the module of their work, and this one loads torch alone, not the trainer."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist

from ..sandbox.helpers import host_pid_alive


def leave(how: str) -> None:
    """Rank 1 gets stuck past the collective timeout ("stuck") or dies ("dies"); rank 0
    waits for it in an all-reduce."""
    if dist.get_rank() == 1:
        if how == "dies":
            os._exit(1)
        time.sleep(600)
    dist.all_reduce(torch.zeros(1))


def answer_then_die() -> torch.Tensor | tuple[object, torch.Tensor]:
    """Rank 1 sends its answer and exits before the driver has read the tensor in it: a
    tensor travels as a file descriptor the driver fetches from the rank that sent it."""
    if dist.get_rank() == 1:
        return _ExitOnceSent(), torch.zeros(4)
    return torch.zeros(4)


class _ExitOnceSent:
    """Pickled in the rank, it makes the rank exit just after; unpickled in the driver
    ahead of the tensor, it waits for that exit."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        threading.Timer(0.1, os._exit, (1,)).start()
        return _wait_for_exit, (os.getpid(),)


def _wait_for_exit(pid: int) -> None:
    deadline = time.monotonic() + 60
    while host_pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
