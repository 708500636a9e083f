"""Rubrics: named, weighted reward functions of one episode, and of a whole group.

The one convention: a `Reward` function takes the finished `Episode` and returns a float;
a `GroupReward` function takes every episode of one task and returns one float each. Either
may be async; a sync one runs in a thread (`blocking.call`), so that one that hangs leaves
the event loop, and the grading's time limit, working. A function that raises, or returns
anything but a number that stays finite as a float32 (the trainer's dtype), makes its
episodes errors, never a silent 0. An `Override` is a rule over one episode that, when it
holds, sets the total outright: a broken promise (a token budget exceeded) costs the reward
whatever the answer.
"""

from __future__ import annotations

import asyncio
import math
import reprlib
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reinforge.envs.blocking import call, spawn
from reinforge.errors import defined_at, describe

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


Term = Reward | GroupReward | Override


@dataclass(frozen=True)
class Scores:
    rewards: dict[str, float]
    total: float


class Rubric:
    """Scores a group of episodes; `pass_threshold` decides pass@k (total >= threshold)."""

    def __init__(self, *terms: Term, pass_threshold: float = 1.0) -> None:
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
                *(spawn(_number(term, episodes[i])) for i in pending), return_exceptions=True
            )
            for index, result in zip(pending, results, strict=True):
                if isinstance(result, GraderError):
                    errors[index] = result
                elif isinstance(result, BaseException):
                    raise result
                else:
                    values[index][term.key] = result
        return [error or self._scores(row) for row, error in zip(values, errors, strict=True)]

    def _scores(self, row: dict[str, float]) -> Scores | GraderError:
        """Finite terms can still weigh up to a total past float32's range."""
        total = self._total(row)
        if _finite_float32(total):
            return Scores(row, total)
        return GraderError(
            f"the weighted total of rewards {row} is {total!r}, not a finite float32 number"
        )

    def _total(self, row: dict[str, float]) -> float:
        for term in self.terms:
            if isinstance(term, Override) and row[term.key]:
                return term.total
        return sum(
            term.weight * row[term.key] for term in self.terms if not isinstance(term, Override)
        )


async def _number(term: Reward | Override, episode: Episode) -> float:
    label = f"reward {term.key!r}"
    try:
        value = await call(term.fn, episode)
    except Exception as error:
        raise GraderError(f"{label} raised {describe(error)}") from error
    return _as_float(label, value, term.fn)


async def _number_list(term: GroupReward, episodes: list[Episode]) -> list[float]:
    label = f"group reward {term.key!r}"
    try:
        values = list(await call(term.fn, episodes))
    except Exception as error:
        raise GraderError(f"{label} raised {describe(error)}") from error
    if len(values) != len(episodes):
        raise _returned(label, f"{len(values)} values for {len(episodes)} episodes", term.fn)
    return [_as_float(label, v, term.fn) for v in values]


def _as_float(label: str, value: object, fn: Callable[..., object]) -> float:
    """`value` as a reward; else an error naming `fn` and where it is defined, as a raising
    one names where it raised."""
    if not isinstance(value, int | float):  # bool is an int
        problem = f"{reprlib.repr(value)} ({type(value).__name__}), not a number"
    else:
        try:
            number = float(value)
        except OverflowError:  # an int past float64's range
            number = math.inf
        if _finite_float32(number):
            return number
        problem = f"{reprlib.repr(value)}, not a finite float32 number"
    raise _returned(label, problem, fn)


def _returned(label: str, problem: str, fn: Callable[..., object]) -> GraderError:
    where = defined_at(fn)
    return GraderError(f"{label} returned {problem}" + (f" ({where})" if where else ""))


def _finite_float32(number: float) -> bool:
    """Whether `number` stays finite as the float32 the trainer computes advantages in:
    1e39 is finite here and inf there, where it makes the whole group's advantages NaN."""
    return math.isfinite(struct.unpack("f", struct.pack("f", number))[0])
