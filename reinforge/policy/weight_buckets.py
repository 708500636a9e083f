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
from typing import Any

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


def unpack(buckets: Iterable[Bucket]) -> dict[str, torch.Tensor]:
    """The tensors, each a view of its bucket's bytes: read them (write them out, copy
    them into a model), never write to them."""
    tensors = {}
    with warnings.catch_warnings():  # a bucket from Ray's object store is read-only
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for bucket in buckets:
            tensors |= views(bucket.entries, torch.from_numpy(bucket.data))
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


def entries_of(manifest: list[list[dict[str, Any]]]) -> list[tuple[Entry, ...]]:
    """`manifest`'s buckets' entries back."""
    return [
        tuple(Entry(**{**e, "shape": tuple(e["shape"])}) for e in bucket) for bucket in manifest
    ]


def size_of(entries: tuple[Entry, ...]) -> int:
    """The bytes of a bucket holding `entries` (the last one's padding included)."""
    last = entries[-1]
    return last.offset + last.nbytes + (-last.nbytes % ALIGN)


def total_bytes(buckets: Iterable[Bucket]) -> int:
    return sum(bucket.data.nbytes for bucket in buckets)
