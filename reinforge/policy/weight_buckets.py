"""Weights as buckets of bytes with a manifest: how they travel where no file path does
(Ray's object store, a broadcast over a process group). They are cast once to the engines'
dtype (bf16 halves the bytes of an fp32 trainer's) and cut into buckets of about
`BUCKET_BYTES`, each tensor whole in one bucket, so that a receiver rebuilds every tensor
as a view of the bucket it came in.

A bucket's bytes are a numpy array: Ray stores those without pickling them, and every
process of a node reads the one copy in its object store.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from itertools import accumulate
from typing import Any

import numpy as np
import torch

from reinforge.errors import UsageError

BUCKET_BYTES = 256 * 2**20
"""Large enough that a bucket's fixed costs vanish, small enough that the first bucket can
travel while the last is packed, and that no copy of the whole model is ever made."""
ALIGN = 16
"""Every tensor starts at a multiple of this many bytes: a view as any dtype needs it."""


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in its bucket."""

    name: str
    dtype: str
    """torch's name of it: float32, bfloat16, ..."""
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    entries: tuple[Entry, ...]
    data: np.ndarray
    """uint8, the entries' bytes one after the other."""


def pack(
    weights: Mapping[str, torch.Tensor],
    dtype: torch.dtype | None = None,
    bucket_bytes: int = BUCKET_BYTES,
) -> list[Bucket]:
    """`weights` on the CPU, floating ones cast to `dtype` (None: as they are), in buckets
    of at most `bucket_bytes` unless one tensor alone is larger."""
    buckets: list[Bucket] = []
    entries: list[Entry] = []
    parts: list[np.ndarray] = []
    size = 0
    for name, tensor in weights.items():
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        flat = tensor.detach().to("cpu", cast).contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy()
        if parts and size + raw.nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(entries), np.concatenate(parts)))
            entries, parts, size = [], [], 0
        dtype_name = str(cast).removeprefix("torch.")
        entries.append(Entry(name, dtype_name, tuple(tensor.shape), size, raw.nbytes))
        padding = -raw.nbytes % ALIGN
        parts += [raw, np.zeros(padding, np.uint8)]
        size += raw.nbytes + padding
    if parts:
        buckets.append(Bucket(tuple(entries), np.concatenate(parts)))
    return buckets


def read(path: str, buckets: list[tuple[Entry, ...]]) -> dict[str, torch.Tensor]:
    """The tensors of a file of buckets laid end to end (`MemoryFile`), with their entries:
    each a view of the file mapped in memory, read-only, so that no copy is made until they
    are copied into a model."""
    sizes = [size_of(entries) for entries in buckets]
    with warnings.catch_warnings():  # torch warns that a read-only mapping is not writable
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        data = torch.from_numpy(np.memmap(path, np.uint8, mode="r"))
    if len(data) != sum(sizes):
        raise ValueError(f"{len(data)} bytes, where the buckets hold {sum(sizes)}")
    tensors, start = {}, 0
    for entries, size in zip(buckets, sizes, strict=True):
        tensors |= views(entries, data[start : start + size])
        start += size
    return tensors


def views(entries: Iterable[Entry], data: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors `entries` place in `data`, a bucket's bytes (uint8) wherever they
    arrived: views of it."""
    return {
        e.name: data[e.offset : e.offset + e.nbytes].view(getattr(torch, e.dtype)).reshape(e.shape)
        for e in entries
    }


def manifest(buckets: Iterable[Bucket]) -> list[list[dict[str, Any]]]:
    """What a receiver needs to rebuild the buckets from their bytes alone, as JSON: each
    bucket's entries, in order."""
    return [[asdict(e) for e in bucket.entries] for bucket in buckets]


def size_of(entries: tuple[Entry, ...]) -> int:
    """The bytes of a bucket holding `entries` (the last one's padding included)."""
    last = entries[-1]
    return last.offset + last.nbytes + (-last.nbytes % ALIGN)


def total_bytes(buckets: Iterable[Bucket]) -> int:
    return sum(bucket.data.nbytes for bucket in buckets)


class MemoryFile:
    """Where buckets are laid end to end for an engine of this machine to `read` (`POST
    /v1/weights` with their manifest): a file in this process's own memory (memfd), which
    the engine opens by its /proc path. Nothing of it is left in /dev/shm should the
    process be killed, and it holds the buckets' bytes as they are, one copy where a
    safetensors file took more. Each bucket is laid at its place whenever it arrives (an
    engine's actor lays each one as soon as it is on the node, while the others still
    travel). The file is emptied once the engine has the weights, so it costs the machine
    that memory only for the hand-over."""

    def __init__(self) -> None:
        if not hasattr(os, "memfd_create"):
            raise UsageError(
                "weights reach an engine in buckets through a memory file (memfd), which "
                'only Linux has: take engines.weight_sync = "file"'
            )
        self._fd = os.memfd_create("reinforge-weights", os.MFD_CLOEXEC)
        self.path = f"/proc/{os.getpid()}/fd/{self._fd}"

    @contextmanager
    def holding(self, sizes: list[int]) -> Iterator[Callable[[int, Bucket], None]]:
        """What lays bucket `index` in the file, at its place among buckets of `sizes`
        bytes, from any thread: the file holds them while the body runs."""
        offsets = list(accumulate(sizes, initial=0))

        def lay(index: int, bucket: Bucket) -> None:
            data, offset = memoryview(bucket.data), offsets[index]
            if data.nbytes != sizes[index]:  # else every bucket after it would be misread
                raise ValueError(f"bucket {index}: {data.nbytes} bytes, not {sizes[index]}")
            while data:
                written = os.pwrite(self._fd, data, offset)
                data, offset = data[written:], offset + written

        try:
            os.ftruncate(self._fd, sum(sizes))
            yield lay
        finally:  # a write that failed part way too
            os.ftruncate(self._fd, 0)

    def close(self) -> None:
        os.close(self._fd)
