"""Keys and values of finished sequences, reused when a new prompt starts the same way.

In a multi-turn episode every turn's prompt is the previous turn's prompt and completion
plus a few template and environment tokens; without reuse the engine would prefill the
whole conversation again each turn. A hit also covers a shared system prompt or task text.

Entries are dropped least recently used first, past a byte budget, and all at once when
the weights change (keys and values computed by old weights are not the new policy's).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class PrefixHit:
    length: int
    """How many leading prompt tokens the cached states cover."""
    keys: list[torch.Tensor]
    """Per layer, (H, length, D)."""
    values: list[torch.Tensor]


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[list[torch.Tensor], list[torch.Tensor]]]
        self._entries = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def store(
        self, tokens: tuple[int, ...], keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> None:
        """Keep the states (per layer, (H, len(tokens), D)) of a finished sequence."""
        if self.max_bytes <= 0 or tokens in self._entries:
            return
        size = sum(t.numel() * t.element_size() for t in (*keys, *values))
        if size > self.max_bytes:
            return
        self._entries[tokens] = (keys, values)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (old_keys, old_values) = self._entries.popitem(last=False)
            self._bytes -= sum(t.numel() * t.element_size() for t in (*old_keys, *old_values))

    def lookup(self, prompt: list[int]) -> PrefixHit | None:
        """The longest cached prefix of `prompt`, leaving at least one token to compute."""
        best_tokens, best_length = None, 0
        limit = len(prompt) - 1
        for tokens in self._entries:
            length = _common_prefix(tokens, prompt, limit)
            if length > best_length:
                best_tokens, best_length = tokens, length
        if best_tokens is None:
            return None
        self._entries.move_to_end(best_tokens)
        keys, values = self._entries[best_tokens]
        self.hits += 1
        self.reused_tokens += best_length
        return PrefixHit(
            best_length,
            [k[:, :best_length] for k in keys],
            [v[:, :best_length] for v in values],
        )

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y or length >= limit:
            break
        length += 1
    return length
