"""Ranks on this machine: one process each, joined in one process group.

`run_on_ranks` starts them with torch.multiprocessing (spawn) and a file rendezvous, so
there is no port to pick. Under torchrun (or across machines), start the process group
yourself; `ShardedTrainer` works in any.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reinforge.train.config import TrainerConfig

Result = TypeVar("Result")


def run_on_ranks(config: TrainerConfig, work: Callable[..., Result], *args: Any) -> Result:
    """`work(*args)` in `config.world_size` spawned processes, each a rank of one process
    group (gloo on CPU, NCCL with one GPU per rank); returns rank 0's result.

    A collective waiting longer than `config.collective_timeout_s` raises on its rank, and a
    rank that fails or dies ends the others: the error is raised here, never a hang. `work`
    and `args` travel by pickle, so `work` is a module-level function.
    """
    if torch.cuda.is_available() and config.world_size > torch.cuda.device_count():
        raise ValueError(
            f"world_size {config.world_size} needs one GPU per rank; "
            f"{torch.cuda.device_count()} visible"
        )
    with tempfile.TemporaryDirectory(prefix="reinforge-ranks-") as folder:
        result = Path(folder) / "result.pt"
        rendezvous = Path(folder) / "rendezvous"
        arguments = (config, rendezvous, result, work, args)
        mp.start_processes(_rank, arguments, nprocs=config.world_size, start_method="spawn")
        # Through a file, not a pipe: a large result would block the rank writing it while
        # the parent waits for the rank to exit.
        return torch.load(result, weights_only=False)


def _rank(
    rank: int,
    config: TrainerConfig,
    rendezvous: Path,
    result: Path,
    work: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
    else:  # the ranks share the cores rather than each taking all of them
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // config.world_size))
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        init_method=rendezvous.as_uri(),
        rank=rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.collective_timeout_s),
    )
    try:
        value = work(*args)
        if rank == 0:
            torch.save(value, result)
    finally:
        dist.destroy_process_group()
