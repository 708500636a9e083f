"""Numbers that describe a set of groups: rewards, pass@k, turns, tokens, statuses, doom
loops, reasoning levels and hack flags."""

from __future__ import annotations

import statistics
from collections import Counter
from math import comb

from reinforge.envs.harbor.hacks import hack_counts
from reinforge.envs.recipes.augment import VariantStats, variant_metrics
from reinforge.envs.recipes.levels import LevelStats, level_metrics
from reinforge.envs.recipes.loops import loop_rates
from reinforge.errors import TooManyErrors
from reinforge.types import Group, Record, Status, Trajectory, TurnTime

SCORED = (Status.OK, Status.TRUNCATED)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passes (Chen et al., 2021, eq. 1)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


class RolloutSeconds(Record):
    """Where a rollout's time went, each part's mean over the rollouts (`Timings`): the
    policy's replies, the environment's start, answers and stop (a sandbox task's grading),
    the rubric; and each turn's, over the rollouts that reached it. Rollouts run
    concurrently, so these are not shares of the step's wall time."""

    generate_s: float
    start_s: float
    tools_s: float
    stop_s: float
    score_s: float
    total_s: float
    turns: list[TurnTime]


class RolloutSummary(Record):
    """What a set of groups did: the numbers `reinforge eval` reports and every metrics line
    of a training step starts with, under the same names."""

    tasks: int
    rollouts: int
    scored: int
    """Rollouts that ended ok or truncated: the ones with a reward."""
    errored: int
    """Rollouts that errored or timed out: they have no reward and are in no mean of one."""
    first_error: str | None
    reward_mean: float
    """Over the scored rollouts."""
    reward_std: float
    rewards: dict[str, float]
    """Each reward term's mean over the scored rollouts."""
    pass_threshold: float
    """The reward at which a rollout passes (the rubric's)."""
    pass_rate: float
    """pass@1: the chance that one rollout passes, unbiased from each group, averaged."""
    k: int
    """The largest group's size: the k of `pass_at_k`."""
    pass_at_k: float
    """pass@k with k = `k`: the fraction of tasks with at least one passing rollout."""
    turns_mean: float
    completion_tokens_mean: float
    """Sampled tokens per rollout (all turns)."""
    tokens_mean: float
    """Whole sequence per rollout: prompt, sampled, tool and environment tokens."""
    truncation_rate: float
    tool_errors: int
    loop_rate: float
    """Fraction of rollouts with a turn that repeats itself (a doom loop)."""
    loop_truncation_rate: float
    """Fraction of truncated rollouts whose last turn loops."""
    levels: dict[str, LevelStats]
    """Per reasoning level; empty when the environment has none."""
    variants: dict[str, VariantStats]
    """Per fixed harness variant (`env.augment.variants`); empty without them."""
    hack_flags: dict[str, int]
    """Rollouts carrying each hack detector's flag."""
    status: dict[str, int]
    """Rollouts by how they ended."""
    seconds: RolloutSeconds


def summarize(groups: list[Group], pass_threshold: float) -> RolloutSummary:
    trajectories = [t for g in groups for t in g.trajectories]
    scored = [t for t in trajectories if t.status in SCORED]
    rewards = [t.reward or 0.0 for t in scored]  # a scored rollout always has one
    failed = [t for t in trajectories if t.status not in SCORED]
    terms = sorted({name for t in scored for name in t.rewards})
    pass_1: list[float] = []
    pass_k: list[float] = []
    for group in groups:
        n = len(group.trajectories)
        passed = sum(
            t.status in SCORED and (t.reward or 0.0) >= pass_threshold for t in group.trajectories
        )
        pass_1.append(pass_at_k(n, passed, 1))
        pass_k.append(pass_at_k(n, passed, n))
    status = Counter(t.status for t in trajectories)
    loop_rate, loop_truncation_rate = loop_rates(trajectories)
    return RolloutSummary(
        tasks=len(groups),
        rollouts=len(trajectories),
        scored=len(scored),
        errored=len(failed),
        first_error=failed[0].error if failed else None,
        reward_mean=_mean(rewards),
        reward_std=statistics.pstdev(rewards) if rewards else 0.0,
        rewards={name: _mean([t.rewards.get(name, 0.0) for t in scored]) for name in terms},
        pass_threshold=pass_threshold,
        pass_rate=_mean(pass_1),
        k=max((len(g.trajectories) for g in groups), default=0),
        pass_at_k=_mean(pass_k),
        turns_mean=_mean([t.turns for t in trajectories]),
        completion_tokens_mean=_mean([t.completion_tokens for t in trajectories]),
        tokens_mean=_mean([len(t.token_ids) for t in trajectories]),
        truncation_rate=status[Status.TRUNCATED] / len(trajectories) if trajectories else 0.0,
        tool_errors=sum(t.tool_errors for t in trajectories),
        loop_rate=loop_rate,
        loop_truncation_rate=loop_truncation_rate,
        levels=level_metrics(trajectories),
        variants=variant_metrics(trajectories),
        hack_flags=hack_counts(trajectories),
        status={s.value: n for s, n in status.items()},
        seconds=_seconds(trajectories),
    )


def _seconds(trajectories: list[Trajectory]) -> RolloutSeconds:
    timings = [t.timings for t in trajectories]
    turns = [
        [t.turns[turn] for t in timings if len(t.turns) > turn]
        for turn in range(max((len(t.turns) for t in timings), default=0))
    ]
    return RolloutSeconds(
        generate_s=_mean([t.generate_s for t in timings]),
        start_s=_mean([t.start_s for t in timings]),
        tools_s=_mean([t.tools_s for t in timings]),
        stop_s=_mean([t.stop_s for t in timings]),
        score_s=_mean([t.score_s for t in timings]),
        total_s=_mean([t.total_s for t in timings]),
        turns=[
            TurnTime(
                generate_s=_mean([t.generate_s for t in reached]),
                env_s=_mean([t.env_s for t in reached]),
            )
            for reached in turns
        ],
    )


def check_errors(summary: RolloutSummary, limit: float, key: str, what: str = "rollouts") -> None:
    """Raise `TooManyErrors` when more than `limit` of the rollouts errored or timed out,
    with the first error, where a fix starts. `key` names the setting that holds `limit`,
    `what` the rollouts ("rollouts of step 3")."""
    if summary.errored / max(summary.rollouts, 1) > limit:
        raise TooManyErrors(
            f"{summary.errored} of {summary.rollouts} {what} errored or timed out, more than "
            f"{key} = {limit}; the first: {summary.first_error}"
        )


def _mean(values: list[float] | list[int]) -> float:
    return float(statistics.fmean(values)) if values else 0.0
