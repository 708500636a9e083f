"""Work for ranks that fail on purpose, in a module of its own: the ranks `run_on_ranks`
spawns import the module of their work, and this one loads torch alone, not the trainer."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def leave(how: str) -> None:
    """Rank 1 gets stuck past the collective timeout ("stuck") or dies ("dies"); rank 0
    waits for it in an all-reduce."""
    if dist.get_rank() == 1:
        if how == "dies":
            os._exit(1)
        time.sleep(600)
    dist.all_reduce(torch.zeros(1))
