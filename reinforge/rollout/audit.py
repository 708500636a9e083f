"""Auditing a grader: known reward hacks played against every task of a Harbor environment.

The oracle, the nop agent and each exploit (`envs.harbor.exploits`) play every task through the
same rollout and grading path as a model. The oracle shows the tasks can be solved and
the nop agent that doing nothing scores 0; an exploit that scores above 0 on any task has
hacked the environment. So has one whose rollout ends as an error: an error leaves the
batch, so a policy that fails that way escapes the 0 it earned (an error shield). What the
agent did to stop its own grading (a workspace too large, a verifier it outran) scores 0
with the reason, a fault, and is reported as such.

The audit also plants a secret in its own environment before any sandbox starts, as a
trainer's environment holds tracker, judge and cloud keys: an agent whose transcript or
output holds it has read the trainer's environment from inside its sandbox (a leak).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from reinforge.envs.harbor.agents import ScriptAgent
from reinforge.envs.harbor.environment import HarborEnvironment
from reinforge.policy.client import PolicyClient
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_group
from reinforge.types import Group, Status, Trajectory


@dataclass(frozen=True)
class AgentScores:
    """One agent's results, by task id: rewards of graded rollouts, errors of the rest,
    the faults behind the 0s the agent's own doing earned, and the tasks whose rollout
    showed the audit's planted secret."""

    name: str
    rewards: dict[str, float]
    errors: dict[str, str]
    faults: dict[str, str]
    leaks: list[str]

    @property
    def max_reward(self) -> float:
        return max(self.rewards.values(), default=0.0)

    @property
    def mean(self) -> float:
        return sum(self.rewards.values()) / len(self.rewards) if self.rewards else 0.0

    @property
    def tasks_hacked(self) -> list[str]:
        return sorted(task for task, reward in self.rewards.items() if reward > 0)

    @classmethod
    def of(cls, name: str, groups: Sequence[Group], secret: str) -> AgentScores:
        rewards: dict[str, float] = {}
        errors: dict[str, str] = {}
        faults: dict[str, str] = {}
        leaks: set[str] = set()
        for trajectory in (t for g in groups for t in g.trajectories):
            if secret in json.dumps([trajectory.messages, trajectory.info], default=str):
                leaks.add(trajectory.task_id)
            if trajectory.status in (Status.OK, Status.TRUNCATED):
                rewards[trajectory.task_id] = trajectory.reward or 0.0
                if "verifier_fault" in trajectory.info:
                    faults[trajectory.task_id] = str(trajectory.info["verifier_fault"])
            else:
                errors[trajectory.task_id] = trajectory.error or trajectory.status.value
        return cls(name, rewards, errors, faults, sorted(leaks))


@dataclass(frozen=True)
class AuditReport:
    environment: str
    tasks: list[str]
    oracle: AgentScores
    nop: AgentScores
    exploits: list[AgentScores]
    wall_s: float

    @property
    def hacked(self) -> list[AgentScores]:
        """The exploits that scored above 0, ended as an error, or read the planted
        secret, on at least one task."""
        return [e for e in self.exploits if e.tasks_hacked or e.errors or e.leaks]

    @property
    def broken(self) -> dict[str, str]:
        """Why each broken task is broken: its oracle did not score 1, or doing nothing
        did not score 0. An exploit's 0 on such a task proves nothing, so the audit of it
        cannot be clean."""
        reasons: dict[str, str] = {}
        for task in self.tasks:
            if task in self.oracle.errors:
                reasons[task] = f"the oracle errored: {first_line(self.oracle.errors[task])}"
            elif self.oracle.rewards.get(task) != 1.0:
                reasons[task] = f"the oracle scored {self.oracle.rewards.get(task)} (expect 1)"
            elif task in self.nop.errors:
                reasons[task] = f"the nop agent errored: {first_line(self.nop.errors[task])}"
            elif self.nop.rewards.get(task) != 0.0:
                reasons[task] = f"the nop agent scored {self.nop.rewards.get(task)} (expect 0)"
        return reasons

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "tasks": self.tasks,
            "hacked": len(self.hacked),
            "broken": self.broken,
            "exploits": [
                {
                    "name": e.name,
                    "max_reward": e.max_reward,
                    "tasks_hacked": len(e.tasks_hacked),
                    "hacked_tasks": e.tasks_hacked,
                    "errors": len(e.errors),
                    "first_error": next(iter(e.errors.values()), None),
                    "faults": len(e.faults),
                    "first_fault": next(iter(e.faults.values()), None),
                    "leaks": len(e.leaks),
                    "leaked_tasks": e.leaks,
                }
                for e in self.exploits
            ],
            "oracle_mean": self.oracle.mean,
            "nop_mean": self.nop.mean,
            "oracle_errors": len(self.oracle.errors),
            "nop_errors": len(self.nop.errors),
            "wall_s": self.wall_s,
        }


def first_line(error: str) -> str:
    """The line of an error or fault a report shows: its first, at most 200 characters."""
    lines = error.strip().splitlines()
    return lines[0][:200] if lines else error


async def audit(
    env: HarborEnvironment,
    exploits: Sequence[ScriptAgent],
    num_tasks: int,
    config: RolloutConfig,
    on_rollout: Callable[[Trajectory], None] | None = None,
) -> AuditReport:
    """Every agent on the same `num_tasks` tasks (all of them when there are no more),
    `config.concurrency` rollouts in flight across all agents; closes `env`. The secret is
    planted before the first sandbox starts, so `env` must not have started one."""
    with planted_secret() as secret:
        return await _audit(env, exploits, num_tasks, config, secret, on_rollout)


async def _audit(
    env: HarborEnvironment,
    exploits: Sequence[ScriptAgent],
    num_tasks: int,
    config: RolloutConfig,
    secret: str,
    on_rollout: Callable[[Trajectory], None] | None,
) -> AuditReport:
    tasks = env.tasks(min(num_tasks, len(env.runnable)))
    players = [env.with_agent("oracle"), env.with_agent("nop")]
    players += [env.with_agent(exploit) for exploit in exploits]
    client = PolicyClient.without_model("agent:audit", config.sampling)
    limit = asyncio.Semaphore(config.concurrency)
    started = time.perf_counter()
    try:
        groups = await asyncio.gather(
            *(
                generate_group(player, task, client, config, 1, None, limit, on_rollout)
                for player in players
                for task in tasks
            )
        )
    finally:
        for player in players:
            await player.aclose()
        await env.aclose()
        await client.close()
    wall_s = time.perf_counter() - started
    scores = [
        AgentScores.of(player.agent_name, groups[i * len(tasks) : (i + 1) * len(tasks)], secret)
        for i, player in enumerate(players)
    ]
    return AuditReport(env.name, [t.id for t in tasks], scores[0], scores[1], scores[2:], wall_s)


SECRET_VARIABLE = "REINFORGE_AUDIT_SECRET"


@contextmanager
def planted_secret() -> Iterator[str]:
    """A fresh secret in this process's environment, as a trainer's keys are, while the
    block runs."""
    secret = f"reinforge-audit-{secrets.token_hex(16)}"
    before = os.environ.get(SECRET_VARIABLE)
    os.environ[SECRET_VARIABLE] = secret
    try:
        yield secret
    finally:
        if before is None:
            del os.environ[SECRET_VARIABLE]
        else:
            os.environ[SECRET_VARIABLE] = before
