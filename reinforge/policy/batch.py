"""The built-in engine's running batch: which rows decode together and the KV states they
share, kept apart from the engine's request handling.

Rows join with their own prompt lengths and leave when they finish, so the shared cache is
left-padded: row r's states sit right-aligned, and the attention mask marks which columns
are real. Joining pads the narrower side on the left; leaving cuts the columns that have
become padding in every remaining row, so the batch never attends over dead width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import torch
from transformers.cache_utils import Cache

from reinforge.policy.kv_cache import RoomyLayer, joined_room, roomy_cache
from reinforge.policy.prefix_cache import PrefixHit

Row = TypeVar("Row")
"""What the engine keeps per running request; the batch only orders them."""


class Batch(Generic[Row]):
    """The running rows: their requests, a shared left-padded KV cache and its mask."""

    def __init__(self) -> None:
        self.requests: list[Row] = []
        self.cache: Cache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)  # (B, L)

    def merge(self, arrivals: Sequence[Row], cache: Cache, mask: torch.Tensor) -> None:
        """Append newly prefilled rows (their cache and mask) below the running ones."""
        if self.cache is None or not self.requests:
            self.requests, self.cache, self.mask = list(arrivals), cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        # Every layer is joined before any is replaced: if memory runs out on the way, the
        # batch is as it was. At its peak a join holds the old rooms and the new ones, as
        # joining by `cat` held the old states and the joined ones.
        joined = [
            (joined_room(old.keys, new.keys, width), joined_room(old.values, new.values, width))
            for old, new in zip(self.cache.layers, cache.layers, strict=True)
        ]
        mask = torch.cat([_left_pad_mask(self.mask, width), _left_pad_mask(mask, width)])
        for layer, (keys, values) in zip(self.cache.layers, joined, strict=True):
            assert isinstance(layer, RoomyLayer)  # every cache here is a `roomy_cache`
            layer.take_room(keys, values, width)
        self.mask = mask
        self.requests.extend(arrivals)

    def cut(self, width: int) -> None:
        """Drop the cache's columns past `width` that a decode step appended before it
        failed (the mask was not widened yet), so that the step can run again."""
        assert self.cache is not None
        for layer in self.cache.layers:
            assert isinstance(layer, RoomyLayer)  # every cache here is a `roomy_cache`
            layer.cut(width)

    def retire(self, rows: list[int]) -> None:
        if not rows:
            return
        gone = set(rows)
        keep = [i for i in range(len(self.requests)) if i not in gone]
        self.requests = [self.requests[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.zeros((0, 0), dtype=torch.long)
            return
        index = torch.tensor(keep, device=self.mask.device)
        # Columns that are padding in every remaining row are dead weight: cut them.
        mask = self.mask.index_select(0, index)  # (B', L)
        start = int((mask.sum(dim=0) > 0).nonzero()[0])
        self.mask = mask[:, start:]
        first_moved = next((j for j, row in enumerate(keep) if j != row), len(keep))
        assert self.cache is not None
        for layer in self.cache.layers:
            assert isinstance(layer, RoomyLayer)  # every cache here is a `roomy_cache`
            layer.keep(index, first_moved, start)

    def row_states(self, row: int) -> tuple[int, list[torch.Tensor], list[torch.Tensor]]:
        """One row's states without its padding: (how many, keys and values per layer,
        each (H, L, D))."""
        assert self.cache is not None
        columns = self.mask[row].nonzero().squeeze(1)  # (L,)
        keys = [layer.keys[row].index_select(1, columns) for layer in self.cache.layers]
        values = [layer.values[row].index_select(1, columns) for layer in self.cache.layers]
        return len(columns), keys, values


def layout(
    new: list[list[int]], cached: list[int], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of new tokens after cached prefixes of the given lengths, left-padded:
    [pad | cached prefix | pad | new tokens]. Returns the new tokens' ids (R, N) and the
    attention mask over prefix and new columns (R, C+N), on `device`: built on the host
    row by row, then copied over once."""
    c_width, n_width = max(cached), max(len(tokens) for tokens in new)
    ids = torch.full((len(new), n_width), pad_id, dtype=torch.long)  # (R, N)
    mask = torch.zeros((len(new), c_width + n_width), dtype=torch.long)  # (R, C+N)
    for row, (tokens, length) in enumerate(zip(new, cached, strict=True)):
        ids[row, n_width - len(tokens) :] = torch.tensor(tokens)
        mask[row, c_width - length : c_width] = 1
        mask[row, c_width + n_width - len(tokens) :] = 1
    return ids.to(device), mask.to(device)


def cache_with_prefixes(hits: list[PrefixHit | None], width: int) -> Cache:
    """A cache holding each row's cached prefix, right-aligned in `width` columns."""
    cache = roomy_cache()
    found = [hit for hit in hits if hit is not None]
    if not found:
        return cache
    for layer, reference in enumerate(found[0].keys):
        heads, _, dim = reference.shape
        keys = reference.new_zeros((len(hits), heads, width, dim))  # (U, H, C, D)
        values = reference.new_zeros((len(hits), heads, width, dim))
        for row, hit in enumerate(hits):
            if hit is not None:
                keys[row, :, width - hit.length :] = hit.keys[layer]
                values[row, :, width - hit.length :] = hit.values[layer]
        cache.update(keys, values, layer)
    return cache


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return torch.nn.functional.pad(mask, (missing, 0)) if missing else mask
