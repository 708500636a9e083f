"""The rollout generator: N tasks x k rollouts, concurrent, each one a Trajectory.

A rollout that raises or times out becomes a trajectory with that status and the message;
the other rollouts go on. Groups are scored by the rubric once all their rollouts are in,
because group rewards see every rollout of a task. Rollouts and gradings run `guarded`
(`envs/blocking.py`): user code that blocks the event loop fails its own rollout instead of
stalling them all past their time limits.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest

from reinforge.envs.blocking import LoopBlocked, TimedOut, guarded, in_thread
from reinforge.envs.environment import Environment, jsonable
from reinforge.envs.episode import Episode
from reinforge.envs.recipe import Rollout
from reinforge.envs.rubric import GraderError, Scores
from reinforge.errors import describe
from reinforge.policy.client import EpisodeClient, EpisodeSource
from reinforge.rollout.config import RolloutConfig
from reinforge.types import Group, Status, Task, Timings, Trajectory, TurnTime


@dataclass
class _Done:
    trajectory: Trajectory
    episode: Episode | None
    """The finished episode, for the rubric; None when the rollout did not finish."""


async def generate_groups(
    env: Environment,
    tasks: list[Task],
    client: EpisodeSource,
    config: RolloutConfig,
    rollouts_per_task: int,
    seed: int | None,
    on_group: Callable[[Group], None] | None = None,
    on_rollout: Callable[[Trajectory], None] | None = None,
) -> list[Group]:
    """Run every task `rollouts_per_task` times; groups come back in task order. `seed` is
    the base of the sampling seeds: each rollout derives its own from it and its task
    (None: unseeded)."""
    limit = asyncio.Semaphore(config.concurrency)

    async def one_group(task: Task) -> Group:
        group = await generate_group(
            env, task, client, config, rollouts_per_task, seed, limit, on_rollout
        )
        if on_group is not None:
            on_group(group)
        return group

    return list(await asyncio.gather(*(one_group(task) for task in tasks)))


async def generate_group(
    env: Environment,
    task: Task,
    client: EpisodeSource,
    config: RolloutConfig,
    rollouts_per_task: int,
    seed: int | None,
    limit: asyncio.Semaphore,
    on_rollout: Callable[[Trajectory], None] | None = None,
) -> Group:
    """One task's rollouts, scored together; `limit` bounds the rollouts in flight across
    every group that shares it (`config.concurrency`)."""
    done = await asyncio.gather(
        *(
            _rollout(env, client, task, index, limit, config, seed, on_rollout)
            for index in range(rollouts_per_task)
        )
    )
    return await _score(env, task, done, config)


async def _rollout(
    env: Environment,
    client: EpisodeSource,
    task: Task,
    index: int,
    limit: asyncio.Semaphore,
    config: RolloutConfig,
    seed: int | None,
    on_rollout: Callable[[Trajectory], None] | None,
) -> _Done:
    rollout = Rollout(task, index, seed)
    # Drawn before the rollout's try: a recipe that cannot draw is the run's mistake (a
    # task without the field its level's budget scales by), not one rollout's error.
    drawn = [(recipe, recipe.draw(rollout)) for recipe in env.harness.recipes]
    async with limit:
        episode_client = client.episode(env.harness.max_total_tokens, _seed(rollout))
        started = time.perf_counter()
        trajectory = Trajectory(
            task_id=task.id, group_id=task.id, index=index, tools=env.harness.tool_schemas
        )
        episode: Episode | None = None

        async def play() -> Episode:
            nonlocal episode  # kept, as far as it got, when the rollout fails
            episode = await in_thread(env.new_episode, task)  # `setup` is user code
            episode.max_message_bytes = config.max_message_bytes
            for recipe, value in drawn:  # the harness's doing, not the environment's
                recipe.prepare(value, episode)
            trajectory.tools = env.request_tools(episode)
            await env.rollout(episode_client, task, episode)
            # again: an environment whose harness picks the tools as it plays knows them now
            trajectory.tools = env.request_tools(episode)
            return episode

        try:
            played = await guarded(play(), "rollout", config.timeout_s, config.max_block_s)
            trajectory.status = Status.TRUNCATED if played.truncated else Status.OK
        except TimedOut as error:
            trajectory.status, trajectory.error = Status.TIMEOUT, str(error)
        except LoopBlocked as error:
            trajectory.status, trajectory.error = Status.ERROR, str(error)
        except Exception as error:  # a broken rollout is data, not a crash
            trajectory.status = Status.ERROR
            trajectory.error = describe(error)
        _record(trajectory, episode_client, episode, time.perf_counter() - started)
        for recipe, value in reversed(drawn):  # as nested: the last to prepare records first
            recipe.record(value, trajectory.info)
    if on_rollout is not None:
        on_rollout(trajectory)
    finished = trajectory.status in (Status.OK, Status.TRUNCATED)
    return _Done(trajectory, episode if finished else None)


def _record(
    trajectory: Trajectory, client: EpisodeClient, episode: Episode | None, elapsed: float
) -> None:
    """What the rollout left, however it ended: an errored or timed-out one keeps its
    conversation up to the failure, which is what its reader needs to debug it. A finished
    episode gets the token ids the policy sampled, for its graders."""
    token_ids, mask, logprobs, versions = client.token_record()
    trajectory.token_ids, trajectory.loss_mask = token_ids, mask
    trajectory.logprobs, trajectory.policy_versions = logprobs, versions
    trajectory.timings = Timings(
        generate_s=client.generate_s, env_s=max(elapsed - client.generate_s, 0.0), total_s=elapsed
    )
    if episode is not None:
        clock, timings = episode.clock, trajectory.timings
        timings.start_s, timings.stop_s = clock.start_s, clock.stop_s
        # The last reply goes unanswered when the episode ends on it (turns or tokens spent).
        paired = zip_longest(client.turns_s, clock.turns_s, fillvalue=0.0)
        timings.turns = [TurnTime(generate_s=g, env_s=e) for g, e in paired]
        episode.sampled_token_ids = trajectory.sampled_turns
        trajectory.messages = episode.messages
        trajectory.turns = episode.turns
        trajectory.tool_errors = episode.tool_errors
        trajectory.info = jsonable(episode.state)
    else:
        trajectory.turns = len(client.turns)
    if client.loop_stops:  # turns the engine ended because they looped (`stop_loops`)
        trajectory.info["loop_stops"] = client.loop_stops


async def _score(env: Environment, task: Task, done: list[_Done], config: RolloutConfig) -> Group:
    """Score the rollouts that finished; a grader failure marks them errors, never 0. The
    rubric gets the rollouts' limits too: a hanging grader must not hold the run. What
    graders left in an episode's state (a judge's reasoning) joins its trajectory's info."""
    scorable = [d for d in done if d.episode is not None]
    started = time.perf_counter()
    episodes = [d.episode for d in scorable if d.episode is not None]
    results: list[Scores | GraderError]
    try:
        grading = env.rubric.score(episodes)
        results = await guarded(grading, "grading", config.timeout_s, config.max_block_s)
    except (TimedOut, LoopBlocked) as error:
        results = [GraderError(str(error))] * len(scorable)
    elapsed = time.perf_counter() - started
    for item, result in zip(scorable, results, strict=True):
        trajectory = item.trajectory
        trajectory.timings.score_s = elapsed / max(len(scorable), 1)
        trajectory.timings.total_s += trajectory.timings.score_s
        if item.episode is not None:
            trajectory.info.update(jsonable(item.episode.state))
        if isinstance(result, GraderError):
            trajectory.status, trajectory.error = Status.ERROR, str(result)
        else:
            trajectory.rewards, trajectory.reward = result.rewards, result.total
    return Group(task=task, trajectories=[d.trajectory for d in done])


def _seed(rollout: Rollout) -> int | None:
    if rollout.seed is None:
        return None
    # Spaced by 1000 so that per-turn seeds (seed + turn) of two rollouts never meet.
    return (zlib.crc32(rollout.key.encode()) % 2**20) * 1000
