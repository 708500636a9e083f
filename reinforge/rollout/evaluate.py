"""Evaluation: rollouts of an environment's tasks, scored, summarised and written to disk."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from reinforge.envs.environment import Environment
from reinforge.envs.registry import draw_tasks
from reinforge.policy.client import PolicyClient
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.store import RolloutWriter
from reinforge.rollout.summary import RolloutSummary, summarize
from reinforge.types import Group, Trajectory


class EvalSummary(RolloutSummary):
    """An eval's `summary.json`: the groups' numbers and what produced them."""

    environment: str
    model: str
    seed: int
    wall_s: float
    sampled_tokens_per_s: float
    """Sampled tokens of all rollouts over the eval's wall time."""


async def evaluate(
    env: Environment,
    client: PolicyClient,
    num_tasks: int,
    rollouts_per_task: int,
    config: RolloutConfig,
    seed: int,
    out: Path,
    on_rollout: Callable[[Trajectory], None] | None = None,
) -> tuple[list[Group], EvalSummary]:
    """Run `num_tasks` x `rollouts_per_task`; trajectories are written group by group.
    `seed` draws the tasks and seeds the sampling."""
    tasks = draw_tasks(env, num_tasks, seed)
    writer = RolloutWriter(out)
    started = time.perf_counter()
    try:
        groups = await generate_groups(
            env,
            tasks,
            client,
            config,
            rollouts_per_task,
            seed,
            on_group=writer.write_group,
            on_rollout=on_rollout,
        )
        wall_s = time.perf_counter() - started
        sampled = sum(t.completion_tokens for g in groups for t in g.trajectories)
        summary = EvalSummary(
            **dict(summarize(groups, env.rubric.pass_threshold)),
            environment=env.name,
            model=client.model,
            seed=seed,
            wall_s=wall_s,
            sampled_tokens_per_s=sampled / wall_s if wall_s > 0 else 0.0,
        )
        writer.write_summary(summary)
    finally:
        writer.close()
        await env.aclose()
    return groups, summary
