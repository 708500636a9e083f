"""A conciseness bonus (`env.conciseness`): within a group, shorter episodes score more."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reinforge.envs.episode import Episode


def conciseness(episodes: list[Episode]) -> list[float]:
    """0.5 - (tokens - fewest) / (most - fewest), over the tokens each episode sampled:
    0.5 for the group's shortest, -0.5 for its longest, 0 for all when they are equally
    long. Kimi k1.5's length reward (Kimi Team, 2025) without its split by correctness,
    which a term cannot see: weighted below the reward gap between a right and a wrong
    answer, it orders answers of equal worth by length and never lifts a short wrong
    answer above a right one. Pinned by `test_conciseness_is_relative_to_the_group`."""
    lengths = [sum(len(turn) for turn in e.sampled_token_ids) for e in episodes]
    fewest, most = min(lengths, default=0), max(lengths, default=0)
    if most == fewest:
        return [0.0] * len(episodes)
    return [0.5 - (length - fewest) / (most - fewest) for length in lengths]
