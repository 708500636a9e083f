"""Doom loops: a completion that repeats itself until a limit cuts it off.

The rule, over the token ids one turn sampled (it works on any sequence: words in tests):

- **a looping tail**: the turn ends in at least `MIN_COPIES` back-to-back copies of one
  unit of at most `MAX_PERIOD` tokens, the copies covering at least `MIN_SPAN` tokens (so
  "no, no, no, no" is not a loop; 32 newlines, or one sentence said four times, are); or
- **repeated n-grams**: at least `MIN_SPAN` tokens long, and at least `NGRAM_SHARE` of its
  `NGRAM`-token windows already appeared earlier in it: a paragraph said three times, even
  if the model then broke out and answered.

The tail rule (`tail_loop`) lives in `reinforge/policy/repetition.py`, beside the engines
that can stop a sample whose tail loops (`stop_loops`, finish reason "loop").

An episode loops when one of its turns does. A truncated episode was truncated by a loop
when its last turn loops: the limit cut off a model that was still repeating itself, or
the engine stopped it there.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from reinforge.policy.repetition import MIN_SPAN, tail_loop
from reinforge.types import Status, Trajectory

if TYPE_CHECKING:
    from reinforge.envs.episode import Episode

NGRAM = 8
NGRAM_SHARE = 0.5


def repeated_ngram_share(sequence: Sequence[Hashable], n: int = NGRAM) -> float:
    """The fraction of the n-token windows of `sequence` that occurred earlier in it."""
    windows = [tuple(sequence[i : i + n]) for i in range(len(sequence) - n + 1)]
    seen: set[tuple[Hashable, ...]] = set()
    repeats = 0
    for window in windows:
        repeats += window in seen
        seen.add(window)
    return repeats / len(windows) if windows else 0.0


def loops(sequence: Sequence[Hashable]) -> bool:
    """Whether one turn is a doom loop by the rule above."""
    if len(sequence) < MIN_SPAN:
        return False
    return tail_loop(sequence) is not None or repeated_ngram_share(sequence) >= NGRAM_SHARE


def looping(episode: Episode) -> float:
    """1 when a turn of the episode loops, else 0: a rubric term (with a negative weight,
    a penalty). Reads the token ids the policy sampled, which the rollout generator puts on
    the episode; an episode without them (a server that returns no token ids) never loops."""
    return float(any(loops(turn) for turn in episode.sampled_token_ids))


def loop_rates(trajectories: list[Trajectory]) -> tuple[float, float]:
    """The fraction of rollouts that loop, and the fraction of truncated rollouts whose last
    turn loops (0 when none was truncated)."""
    turns = [t.sampled_turns for t in trajectories]
    looped = [any(loops(turn) for turn in each) for each in turns]
    truncated = [
        bool(each) and loops(each[-1])
        for t, each in zip(trajectories, turns, strict=True)
        if t.status == Status.TRUNCATED
    ]
    return (
        sum(looped) / len(looped) if looped else 0.0,
        sum(truncated) / len(truncated) if truncated else 0.0,
    )
