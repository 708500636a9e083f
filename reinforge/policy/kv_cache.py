"""A key/value cache that appends a decode step's states in place.

transformers' `DynamicLayer` concatenates on every update, so each decode step copies the
whole cache of every layer: at batch 32 on the arithmetic prompts that copy was ~15% of a
float32 decode step of SmolLM2-135M on the 2-core CPU. `RoomyLayer` keeps spare columns
after the states and writes new ones there; `keys` and `values` are views of that room.
Rows that leave the batch (`keep`) are cut inside the room too: the rows after them move
up and leading columns that became padding are skipped, not copied, so the next update
still writes in place. Rows that join (the engine's merge) are written with the running
ones into one new room (`joined_room`, `take_room`): one copy of the cache, where joining
by `cat` and padding copied it two or three times, counting the room the next update
would make. Code that replaces `keys` or `values` outright needs no care: the next update
sees a tensor that is not its room's view and makes new room.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

ROOM = 64
"""Spare columns made at a time: a new room costs one copy of the cache, as a `cat` does."""


class RoomyLayer(DynamicLayer):
    """A `DynamicLayer` whose updates write into preallocated room instead of copying."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._key_room: torch.Tensor | None = None
        self._value_room: torch.Tensor | None = None
        self._written: tuple[torch.Tensor, torch.Tensor] | None = None
        """The `keys` and `values` the last update or `keep` set: while they are still the
        layer's, they are the rooms' first rows from column `_start` on, and the next
        update needs no checks."""
        self._start = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        added = key_states.shape[-2]
        if self._owns_views():
            assert self._key_room is not None and self._value_room is not None
            end = self._start + self.keys.shape[-2]
            if end + added <= self._key_room.shape[-2] and key_states.dtype == self._key_room.dtype:
                rows = self.keys.shape[0]
                self._key_room[:rows].narrow(-2, end, added).copy_(key_states)
                self._value_room[:rows].narrow(-2, end, added).copy_(value_states)
                self._view(rows, end + added)
                return self.keys, self.values
        self.keys, self._key_room = _append(self.keys, self._key_room, key_states)
        self.values, self._value_room = _append(self.values, self._value_room, value_states)
        self._start = 0
        self._written = self.keys, self.values
        return self.keys, self.values

    def keep(self, index: torch.Tensor, first_moved: int, start: int) -> None:
        """Keep the rows `index` (B',), ascending, and the columns from `start` on.

        In the layer's own room only the rows from `first_moved` on are copied (up, to
        close the gaps) and the cut columns are skipped, so the room outlives the cut:
        at batch 32 a cut by copy cost a whole cache twice, once to select and again to
        make room at the next update. States set from outside are selected by copy.
        """
        rows = len(index)
        if not self._owns_views():
            if first_moved >= rows:  # the first rows stay where they are: views, no copy
                self.keys, self.values = self.keys[:rows, :, start:], self.values[:rows, :, start:]
            else:
                self.keys = self.keys.index_select(0, index)[:, :, start:]
                self.values = self.values.index_select(0, index)[:, :, start:]
            return
        assert self._key_room is not None and self._value_room is not None
        end = self._start + self.keys.shape[-2]
        self._start += start
        if first_moved < rows:
            sources = index[first_moved:]
            for room in (self._key_room, self._value_room):
                window = room[:, :, self._start : end]
                window[first_moved:rows] = window.index_select(0, sources)
        self._view(rows, end)

    def take_room(self, key_room: torch.Tensor, value_room: torch.Tensor, length: int) -> None:
        """States written into new rooms from outside (`joined_room`): every row of the
        rooms, their first `length` columns; the next update appends in place."""
        self._key_room, self._value_room, self._start = key_room, value_room, 0
        self._view(key_room.shape[0], length)

    def cut(self, length: int) -> None:
        """Drop the columns past `length` that a step appended before it failed, so that
        the step can run again; the room stays the layer's."""
        if self._owns_views():
            self._view(self.keys.shape[0], self._start + min(length, self.keys.shape[-2]))
        else:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]

    def whole_rows(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`keys` and `values` widened to their rooms' whole rows (B, H, W, D), and the
        column where they start there; states set from outside as they are, from 0.

        A view of some of each row's columns is not one block of memory, and a bfloat16
        batched matmul on CPU copies it before multiplying: at 12 rows of 1,500 columns,
        more time than the product. The whole rows are one block; the columns around the
        view are zeros or states of rows that left, finite, for attention to mask.
        """
        if not self._owns_views():
            return self.keys, self.values, 0
        assert self._key_room is not None and self._value_room is not None
        rows = self.keys.shape[0]
        return self._key_room[:rows], self._value_room[:rows], self._start

    def _owns_views(self) -> bool:
        """Whether `keys` and `values` are still the views of the room that this layer set."""
        written = self._written
        return written is not None and written[0] is self.keys and written[1] is self.values

    def _view(self, rows: int, end: int) -> None:
        """Point `keys` and `values` at the rooms' first `rows` rows, columns `_start`..`end`."""
        assert self._key_room is not None and self._value_room is not None
        length = end - self._start
        self.keys = self._key_room[:rows].narrow(-2, self._start, length)
        self.values = self._value_room[:rows].narrow(-2, self._start, length)
        self._written = self.keys, self.values


def cache_keyword(model: PreTrainedModel) -> str:
    """What the model's forward calls its cache: `cache` since transformers 5.24,
    `past_key_values` before (vLLM's CPU build pins transformers below 5.20, and an
    unknown keyword would be swallowed silently, decoding without the cache)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def roomy_cache() -> Cache:
    """An empty cache of `RoomyLayer`s, one made per layer on first use."""
    return Cache(layer_class_to_replicate=RoomyLayer)


def joined_room(old: torch.Tensor, new: torch.Tensor, width: int) -> torch.Tensor:
    """`old` (B, H, Lo, D) above `new` (R, H, Ln, D) in a new room (B + R, H, width + ROOM,
    D): each right-aligned at column `width`, zeros before it (padding the mask hides,
    but which attention still multiplies by 0), and `ROOM` spare columns of zeros after."""
    rows, heads, _, dim = old.shape
    room = old.new_empty((rows + new.shape[0], heads, width + ROOM, dim))
    room[:, :, width:].zero_()
    for part, states in ((room[:rows], old), (room[rows:], new)):
        padding = width - states.shape[-2]
        part[:, :, :padding].zero_()
        part[:, :, padding:width] = states
    return room


def _append(
    states: torch.Tensor, room: torch.Tensor | None, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`states` (B, H, L, D) followed by `new` (B, H, N, D), as a view of `room`.

    `states` is written into new room unless it is a prefix view of `room` with space for
    `new` after it; a new room's spare columns are zeros. Returns the view (B, H, L + N, D)
    and the room behind it.
    """
    length, added = (states.shape[-2] if states.numel() else 0), new.shape[-2]
    if room is None or not _is_prefix_of(states, room, length + added, new.dtype):
        batch, heads, _, dim = new.shape
        room = new.new_empty((batch, heads, length + added + ROOM, dim))
        room[:, :, length + added :].zero_()
        if length:
            room[:, :, :length] = states
    room[:, :, length : length + added] = new
    return room[:, :, : length + added], room


def _is_prefix_of(
    states: torch.Tensor, room: torch.Tensor, needed: int, dtype: torch.dtype
) -> bool:
    """Whether `states` is a non-empty view of `room`'s first columns, and `room` holds
    `needed` columns of `dtype`."""
    return (
        states.numel() > 0
        and states.data_ptr() == room.data_ptr()
        and states.stride() == room.stride()
        and states.shape[:2] == room.shape[:2]
        and room.shape[-2] >= needed
        and room.dtype == dtype
    )
