"""A key/value cache that appends a decode step's states in place.

transformers' `DynamicLayer` concatenates on every update, so each decode step copies the
whole cache of every layer: at batch 32 on the arithmetic prompts that copy was ~15% of a
float32 decode step of SmolLM2-135M on the 2-core CPU. `RoomyLayer` keeps spare columns
after the states and writes new ones there; `keys` and `values` are views of that room.
Code that replaces `keys` or `values` outright (the engine's merge and retire) needs no
care: the next update sees a tensor that is not its room's view and makes new room.
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
        """The `keys` and `values` the last update returned: while they are still the
        layer's, they are the rooms' first columns and the next update needs no checks."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        written, added = self._written, key_states.shape[-2]
        if written is not None and written[0] is self.keys and written[1] is self.values:
            assert self._key_room is not None and self._value_room is not None
            length, room = self.keys.shape[-2], self._key_room
            if length + added <= room.shape[-2] and key_states.dtype == room.dtype:
                self._key_room.narrow(-2, length, added).copy_(key_states)
                self._value_room.narrow(-2, length, added).copy_(value_states)
                self.keys = self._key_room.narrow(-2, 0, length + added)
                self.values = self._value_room.narrow(-2, 0, length + added)
                self._written = self.keys, self.values
                return self.keys, self.values
        self.keys, self._key_room = _append(self.keys, self._key_room, key_states)
        self.values, self._value_room = _append(self.values, self._value_room, value_states)
        self._written = self.keys, self.values
        return self.keys, self.values


def cache_keyword(model: PreTrainedModel) -> str:
    """What the model's forward calls its cache: `cache` since transformers 5.24,
    `past_key_values` before (vLLM's CPU build pins transformers below 5.20, and an
    unknown keyword would be swallowed silently, decoding without the cache)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def roomy_cache() -> Cache:
    """An empty cache of `RoomyLayer`s, one made per layer on first use."""
    return Cache(layer_class_to_replicate=RoomyLayer)


def _append(
    states: torch.Tensor, room: torch.Tensor | None, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`states` (B, H, L, D) followed by `new` (B, H, N, D), as a view of `room`.

    `states` is written into new room unless it is a prefix view of `room` with space for
    `new` after it. Returns the view (B, H, L + N, D) and the room behind it.
    """
    length, added = (states.shape[-2] if states.numel() else 0), new.shape[-2]
    if room is None or not _is_prefix_of(states, room, length + added, new.dtype):
        batch, heads, _, dim = new.shape
        room = new.new_empty((batch, heads, length + added + ROOM, dim))
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
