"""Numbers that describe a set of groups: rewards, pass@k, turns, tokens, statuses, doom
loops, reasoning levels and hack flags."""

from __future__ import annotations

import statistics
from collections import Counter
from math import comb
from typing import Any

from reinforge.envs.hacks import hack_counts
from reinforge.envs.levels import level_metrics
from reinforge.envs.loops import loop_rates
from reinforge.types import Group, Status

SCORED = (Status.OK, Status.TRUNCATED)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passes (Chen et al., 2021, eq. 1)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(groups: list[Group], pass_threshold: float, wall_s: float) -> dict[str, Any]:
    """Rewards are over the scored rollouts (`scored` of `rollouts`); those that errored or
    timed out have no reward and are counted in `errored`, with the first one's message."""
    trajectories = [t for g in groups for t in g.trajectories]
    scored = [t for t in trajectories if t.status in SCORED]
    rewards = [t.reward or 0.0 for t in scored]  # a scored rollout always has one
    failed = [t for t in trajectories if t.status not in SCORED]
    terms = sorted({name for t in scored for name in t.rewards})
    k = max((len(g.trajectories) for g in groups), default=0)
    pass_1: list[float] = []
    pass_k: list[float] = []
    for group in groups:
        n = len(group.trajectories)
        passed = sum(
            t.status in SCORED and (t.reward or 0.0) >= pass_threshold for t in group.trajectories
        )
        pass_1.append(pass_at_k(n, passed, 1))
        pass_k.append(pass_at_k(n, passed, n))
    sampled = sum(t.completion_tokens for t in trajectories)
    return {
        "tasks": len(groups),
        "rollouts": len(trajectories),
        "scored": len(scored),
        "errored": len(failed),
        "first_error": failed[0].error if failed else None,
        "reward_mean": _mean(rewards),
        "reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "rewards": {name: _mean([t.rewards.get(name, 0.0) for t in scored]) for name in terms},
        "pass@1": _mean(pass_1),
        f"pass@{k}": _mean(pass_k),
        "pass_threshold": pass_threshold,
        "turns_mean": _mean([t.turns for t in trajectories]),
        "sampled_tokens_mean": _mean([t.completion_tokens for t in trajectories]),
        "tokens_mean": _mean([len(t.token_ids) for t in trajectories]),
        "tool_errors": sum(t.tool_errors for t in trajectories),
        **loop_rates(trajectories),
        "levels": level_metrics(trajectories),
        "hack_flags": hack_counts(trajectories),
        "status": {s.value: n for s, n in Counter(t.status for t in trajectories).items()},
        "wall_s": wall_s,
        "sampled_tokens_per_s": sampled / wall_s if wall_s > 0 else 0.0,
    }


def _mean(values: list[float] | list[int]) -> float:
    return float(statistics.fmean(values)) if values else 0.0
