"""Weights as buckets of bytes with a manifest: how they travel where no file path does
(Ray's object store, a broadcast over a process group). They are cast once to the engines'
dtype (bf16 halves the bytes of an fp32 trainer's) and cut into buckets of about
`BUCKET_BYTES`, each tensor whole in one bucket, so that a receiver rebuilds every tensor
as a view of the bucket it came in.

A bucket's bytes are a numpy array: Ray stores those without pickling them, and every
process of a node reads the one copy in its object store.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

import numpy as np
import torch

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


def write(buckets: Iterable[Bucket], out: BinaryIO) -> None:
    """The buckets' bytes one after another, from where `out` stands: what `read` takes
    back with their manifest."""
    for bucket in buckets:
        out.write(memoryview(bucket.data))


def read(path: str, buckets: list[tuple[Entry, ...]]) -> dict[str, torch.Tensor]:
    """The tensors of a file `write` wrote with `buckets`' entries, each a view of the file
    mapped in memory, read-only: no copy is made until they are copied into a model."""
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
