"""A bucket of weights (`policy/weight_buckets.py`) as its change from the same bucket one
push earlier: what moves when few elements change.

Between two optimizer steps at a small learning rate most bf16 weights round to the same
value (about 2% of elements change at lr 1e-5), while nearly every fp32 one changes, and
every 4 KiB block has some change: so a delta names single elements, by their positions
(int32) or by a bitmask, whichever is smaller, with their new values. It is sent only when
smaller than the bucket. The receiver applies it to the bucket it holds of the base
version and checks the result against the checksum of the bucket it stands for, so it
hands its engine exactly the bytes a full push would, or knows it must fetch them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from reinforge.policy.weight_buckets import Bucket

SAMPLE = 64
"""A bucket is first compared at every this-many-th element: where that shows a delta
would be no smaller, the bucket goes whole without a full comparison."""


@dataclass(frozen=True)
class Delta:
    """One bucket as the elements that changed since `base`'s push."""

    base: int
    """The version of the bucket it applies to."""
    word: int
    """The bytes of the elements compared: the bucket's smallest element size."""
    bitmask: bool
    """`where` is a bitmask of the changed elements (np.packbits), else their positions."""
    where: np.ndarray
    values: np.ndarray
    """The changed elements' new bytes, as unsigned words of `word` bytes."""
    checksum: bytes
    """Of the whole resulting bucket (`checksum`)."""

    @property
    def nbytes(self) -> int:
        return self.where.nbytes + self.values.nbytes


def checksum(data: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(data), digest_size=16).digest()


def encode(old: Bucket, new: Bucket, base: int) -> Delta | None:
    """`new` as its change from `old`, pushed as version `base`; None where the layout
    differs or the delta would be no smaller than `new` itself."""
    if old.entries != new.entries or old.data.nbytes != new.data.nbytes:
        return None
    word = element_bytes(new)
    old_words, new_words = as_words(old.data, word), as_words(new.data, word)
    size = old_words.size
    position = np.int32 if size < 2**31 else np.int64
    # every SAMPLE-th element first: nearly all changed (fp32) is known at a small cost
    sampled = np.count_nonzero(old_words[::SAMPLE] != new_words[::SAMPLE])
    if _delta_bytes(sampled * size // -(-size // SAMPLE), size, word, position) >= new.data.nbytes:
        return None
    changed = old_words != new_words
    count = int(np.count_nonzero(changed))
    if _delta_bytes(count, size, word, position) >= new.data.nbytes:
        return None
    positions = np.flatnonzero(changed)
    bitmask = -(-size // 8) < count * np.dtype(position).itemsize
    where = np.packbits(changed) if bitmask else positions.astype(position)
    return Delta(base, word, bitmask, where, new_words[positions], checksum(new.data))


def _delta_bytes(count: int, size: int, word: int, position: type) -> int:
    """A delta's bytes for `count` changed words of `size`: positions or a bitmask, the
    smaller, and their values."""
    return min(count * np.dtype(position).itemsize, -(-size // 8)) + count * word


def apply(old: Bucket, version: int | None, delta: Delta) -> Bucket | None:
    """The bucket `delta` stands for, built on a copy of `old`, pushed as `version`; None
    where `old` is not its base: another version, or a result whose checksum does not
    match. The receiver then fetches the bucket whole: it never guesses."""
    if version != delta.base or old.data.nbytes % delta.word:
        return None
    data = old.data.copy()
    words = as_words(data, delta.word)
    if delta.bitmask:
        changed = np.unpackbits(delta.where, count=words.size).view(bool)
        if np.count_nonzero(changed) != delta.values.size:
            return None
        words[changed] = delta.values
    else:
        if delta.where.size and int(delta.where[-1]) >= words.size:
            return None
        words[delta.where] = delta.values
    return Bucket(old.entries, data) if checksum(data) == delta.checksum else None


def element_bytes(bucket: Bucket) -> int:
    """The size of the words a delta compares: the bucket's smallest element's."""
    return min(getattr(torch, e.dtype).itemsize for e in bucket.entries)


def as_words(data: np.ndarray, word: int) -> np.ndarray:
    return data.view(np.dtype(f"u{word}"))
