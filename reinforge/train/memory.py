"""Freed memory handed back to the system after each training step.

A step allocates and frees gigabytes of activations of ever-changing shapes, from whichever
thread runs it, while the engine allocates beside it. glibc's allocator keeps the freed
blocks in its arenas for reuse, and they fragment: the main job's process grew from
1.4 GiB after its first step to 5.2 GiB after its fifth and past 12 GiB by its thirtieth,
while the tensors alive stayed at 1.5 GiB (weights and AdamW state). `malloc_trim` returns
the free pages of every arena; with it after each step the process stays at ~2.2 GiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def _trim_function():  # noqa: ANN202 - a ctypes function, or None
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_MALLOC_TRIM = _trim_function()


def release_freed_memory() -> None:
    """Return the allocator's free pages to the system, where the allocator is glibc's."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
