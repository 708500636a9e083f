"""The built-in engine's memory: the budget its running batch's KV cache keeps within, and
how an out-of-memory fails the one request that caused it.

The batch's cache is left-padded, so it holds its rows times its longest row's columns.
The engine admits a waiting request only while that product, counted at each row's final
length (its prompt plus its `max_tokens`, at most the context), stays within the budget:
a fraction (`engine.kv_memory_fraction`) of the memory free when the engine starts, its
weights loaded. An out-of-memory that happens anyway (a prefill's temporaries, another
process taking memory) fails the request that caused it, not the batch: in a prefill, the
requests being prefilled; in a decode step, the row admitted last, and the step runs again
without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PretrainedConfig

from reinforge.policy.cgroups import CGROUP_ROOT, cgroup_folders, read
from reinforge.policy.engine_thread import Request

FRACTION_KEY = "engine.kv_memory_fraction"


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


def free_memory(device: torch.device, cgroup_root: Path = CGROUP_ROOT) -> int:
    """Bytes free on `device` now: on CUDA the GPU's free memory (other processes' use
    counted) and what torch's allocator holds unused in this process; on the CPU,
    /proc/meminfo's MemAvailable, capped by what the process's cgroup still allows (its
    limit less its usage), which MemAvailable does not see."""
    if device.type == "cuda":
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + unused
    available = _mem_available()
    allowed = cgroup_memory_left(cgroup_root)
    return available if allowed is None else max(0, min(available, allowed))


def kv_budget(device: torch.device, fraction: float, cgroup_root: Path = CGROUP_ROOT) -> int:
    """The running batch's KV budget in bytes: `fraction` of the memory free now."""
    return int(fraction * free_memory(device, cgroup_root))


def kv_token_bytes(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token holds: layers x 2 x KV heads x head size x the
    element size."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * dtype.itemsize


def cgroup_memory_left(root: Path = CGROUP_ROOT) -> int | None:
    """Bytes the process's cgroup may still use (`memory.max` less `memory.current` in
    cgroup v2, the v1 limit less its usage), or None where none is set (v1 writes "no
    limit" as a huge number, which caps nothing)."""
    for folder, v2 in cgroup_folders("memory", root):
        limit, usage = (_read_int(folder / name) for name in memory_files(v2))
        if limit is not None and usage is not None:
            return limit - usage
    return None


def memory_files(v2: bool) -> tuple[str, str]:
    """A cgroup's memory limit and usage files, in cgroup v2 or v1."""
    return (
        ("memory.max", "memory.current")
        if v2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    )


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # in kB
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def _read_int(path: Path) -> int | None:
    """The number in a cgroup file; None where it is absent or says "max"."""
    text = read(path)
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True)
class KvBudget:
    """How many requests, of which lengths, the running batch's KV cache may hold."""

    max_bytes: int
    token_bytes: int
    """Keys and values of one token (`kv_token_bytes`)."""
    max_context: int

    def final_length(self, request: Request) -> int:
        """The columns a request's row may grow to: its prompt and max_tokens, within the
        context."""
        return min(len(request.prompt_ids) + request.params.max_tokens, self.max_context)

    def admissible(self, running: Sequence[Request], waiting: Sequence[Request]) -> int:
        """How many of `waiting`, in arrival order, may join the `running` rows; the first
        that does not fit and those after it wait, so that a long request is not passed
        over for ever by shorter ones."""
        rows, longest = len(running), max(map(self.final_length, running), default=0)
        for taken, request in enumerate(waiting):
            rows, longest = rows + 1, max(longest, self.final_length(request))
            if rows * longest * self.token_bytes > self.max_bytes:
                return taken
        return len(waiting)

    def oversized(self, request: Request) -> OutOfMemory | None:
        """Why `request` can never join the batch, even alone; None if it can."""
        final = self.final_length(request)
        if final * self.token_bytes <= self.max_bytes:
            return None
        return OutOfMemory(
            f"the request needs the KV states of {final} tokens (a prompt of "
            f"{len(request.prompt_ids)} and max_tokens {request.params.max_tokens}), "
            f"{_size(final * self.token_bytes)}, more than the engine's KV budget of "
            f"{_size(self.max_bytes)} ({FRACTION_KEY} of the memory free when it "
            "started): ask for fewer tokens or raise the fraction"
        )


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"
