"""Rubrics: named, weighted reward functions of one episode, and of a whole group.

The one convention: a `Reward` function takes the finished `Episode` and returns a float;
a `GroupReward` function takes every episode of one task and returns one float each. Either
may be async. A function that raises makes its episodes errors, never a silent 0. An
`Override` is a rule over one episode that, when it holds, sets the total outright: a
broken promise (a token budget exceeded) costs the reward whatever the answer.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reinforge.errors import describe

if TYPE_CHECKING:
    from reinforge.envs.episode import Episode

RewardFn = Callable[["Episode"], float | Awaitable[float]]
GroupRewardFn = Callable[[list["Episode"]], Sequence[float] | Awaitable[Sequence[float]]]


class GraderError(Exception):
    """A reward function raised or returned something that is not a number."""


@dataclass(frozen=True)
class Reward:
    fn: RewardFn
    weight: float = 1.0
    name: str = ""

    @property
    def key(self) -> str:
        return self.name or self.fn.__name__


@dataclass(frozen=True)
class GroupReward:
    fn: GroupRewardFn
    weight: float = 1.0
    name: str = ""

    @property
    def key(self) -> str:
        return self.name or self.fn.__name__


@dataclass(frozen=True)
class Override:
    """When `fn` holds for an episode, its total is `total` whatever the other terms say;
    reported among the rewards as 1 when it held, else 0. The first override to hold wins."""

    fn: RewardFn
    total: float = -1.0
    name: str = ""

    @property
    def key(self) -> str:
        return self.name or self.fn.__name__


@dataclass(frozen=True)
class Scores:
    rewards: dict[str, float]
    total: float


class Rubric:
    """Scores a group of episodes; `pass_threshold` decides pass@k (total >= threshold)."""

    def __init__(
        self, *terms: Reward | GroupReward | Override, pass_threshold: float = 1.0
    ) -> None:
        keys = [term.key for term in terms]
        if len(set(keys)) != len(keys):
            raise ValueError(f"reward names must be unique, got {keys}")
        self.terms = terms
        self.pass_threshold = pass_threshold

    async def score(self, episodes: list[Episode]) -> list[Scores | GraderError]:
        """One result per episode, in order. A term grades the group's episodes
        concurrently: an async grader (a test suite in a sandbox) costs the group its
        slowest run, not the sum of them."""
        values: list[dict[str, float]] = [{} for _ in episodes]
        errors: list[GraderError | None] = [None] * len(episodes)
        for term in self.terms:
            if isinstance(term, GroupReward):
                try:
                    group = await _number_list(term, episodes)
                except GraderError as error:
                    return [error] * len(episodes)
                for value, row in zip(group, values, strict=True):
                    row[term.key] = value
                continue
            pending = [i for i, error in enumerate(errors) if error is None]
            results = await asyncio.gather(
                *(_number(term, episodes[i]) for i in pending), return_exceptions=True
            )
            for index, result in zip(pending, results, strict=True):
                if isinstance(result, GraderError):
                    errors[index] = result
                elif isinstance(result, BaseException):
                    raise result
                else:
                    values[index][term.key] = result
        return [
            error or Scores(row, self._total(row))
            for row, error in zip(values, errors, strict=True)
        ]

    def _total(self, row: dict[str, float]) -> float:
        for term in self.terms:
            if isinstance(term, Override) and row[term.key]:
                return term.total
        return sum(
            term.weight * row[term.key] for term in self.terms if not isinstance(term, Override)
        )


async def _number(term: Reward | Override, episode: Episode) -> float:
    try:
        value = term.fn(episode)
        if inspect.isawaitable(value):
            value = await value
        return _as_float(term.key, value)
    except GraderError:
        raise
    except Exception as error:
        raise GraderError(f"reward {term.key!r} raised {describe(error)}") from error


async def _number_list(term: GroupReward, episodes: list[Episode]) -> list[float]:
    try:
        values = term.fn(episodes)
        if inspect.isawaitable(values):
            values = await values
        values = list(values)
    except Exception as error:
        raise GraderError(f"group reward {term.key!r} raised {describe(error)}") from error
    if len(values) != len(episodes):
        raise GraderError(
            f"group reward {term.key!r} returned {len(values)} values for {len(episodes)} episodes"
        )
    return [_as_float(term.key, v) for v in values]


def _as_float(key: str, value: object) -> float:
    if isinstance(value, bool) or isinstance(value, int | float):
        number = float(value)
        if math.isfinite(number):  # NaN or inf would poison every mean downstream
            return number
    raise GraderError(f"reward {key!r} returned {value!r}, not a finite number")
