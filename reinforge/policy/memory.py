"""The built-in engine's memory: how it tells an out-of-memory apart from other failures.

An out-of-memory fails the request that caused it, not the batch: in a prefill, the
requests being prefilled; in a decode step, the row admitted last, and the step is tried
again without it.
"""

from __future__ import annotations

import torch


class OutOfMemory(RuntimeError):
    """A request did not fit in the engine's memory: it failed alone, the others go on."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether torch ran out of memory: on CUDA it raises `torch.OutOfMemoryError`, its CPU
    allocator a plain RuntimeError ("DefaultCPUAllocator: can't allocate memory")."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


def did_not_fit(what: str, error: BaseException) -> OutOfMemory:
    """The error a request fails with when `error`, an out-of-memory, fails it alone."""
    failure = OutOfMemory(f"the request did not fit in the engine's memory: {what}")
    failure.__cause__ = error
    return failure


def release_cached(device: torch.device) -> None:
    """Hand the blocks a failed CUDA allocation left cached back to the device, so the
    step tried again (and any other process) finds them free."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
