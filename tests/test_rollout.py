"""The rollout generator on the real engine: statuses, and token records that are exact."""

from __future__ import annotations

import asyncio

import pytest

from reinforge.envs import Continue, Environment, Episode, Finished, Harness, Reward, Rubric
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.records import token_record_problems
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize
from reinforge.types import Status, Task, masked_spans


def tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", prompt=[{"role": "user", "content": f"task {i}"}]) for i in range(n)]


class Chatty(Environment):
    """Three turns: each reply gets a tool-style result and a user nudge."""

    name = "chatty"

    async def respond(self, episode: Episode) -> Continue | Finished:
        if episode.turns >= 3:
            return Finished()
        return Continue(
            [
                {"role": "tool", "content": f"result {episode.turns}"},
                {"role": "user", "content": "continue"},
            ]
        )


def length(episode: Episode) -> float:
    return float(len(episode.completion))


@pytest.fixture
def client(tiny_engine) -> PolicyClient:
    return PolicyClient.for_engine(tiny_engine, SamplingConfig())


async def test_multi_turn_records_are_exactly_what_the_engine_sampled(
    tiny_engine, client, chat_format
):
    env = Chatty(Harness(max_turns=5, max_tokens_per_turn=6), Rubric(Reward(length)))
    # tiny-random never samples EOS: every turn is cut at 6 tokens and closed by the template.
    groups = await generate_groups(env, tasks(2), client, RolloutConfig(), 2, 1)
    sampled_for: dict[tuple[int, ...], list[list[int]]] = {}
    for prompt, completion in tiny_engine.log:
        sampled_for.setdefault(tuple(prompt), []).append(completion.token_ids)
    for trajectory in (t for g in groups for t in g.trajectories):
        assert trajectory.turns == 3 and trajectory.status == Status.TRUNCATED  # last turn cut
        spans = masked_spans(trajectory.loss_mask)
        assert len(spans) == 3
        for start, end in spans:
            # The context before each sampled span is exactly a prompt the engine saw, and
            # the span is exactly what it sampled for that prompt.
            context = tuple(trajectory.token_ids[:start])
            assert trajectory.token_ids[start:end] in sampled_for[context]
        assert len(trajectory.logprobs) == sum(trajectory.loss_mask) == 18
        assert token_record_problems(trajectory, chat_format) == []


async def test_failures_are_statuses_and_the_run_goes_on(client):
    class Flaky(Environment):
        async def respond(self, episode: Episode) -> Finished:
            if episode.task.id == "t1":
                raise ValueError("environment bug")
            if episode.task.id == "t2":
                await asyncio.sleep(30)
            return Finished()

    def grader(episode: Episode) -> float:
        if episode.task.id == "t3":
            raise ZeroDivisionError("grader bug")
        return 1.0

    env = Flaky(Harness(max_tokens_per_turn=3), Rubric(Reward(grader)))
    config = RolloutConfig(timeout_s=2.0)
    groups = await generate_groups(env, tasks(4), client, config, 2, None)
    by_task = {g.task.id: g.trajectories for g in groups}
    assert [t.status for t in by_task["t0"]] == [Status.TRUNCATED] * 2  # 3 tokens, no EOS
    assert all(t.reward == 1.0 for t in by_task["t0"])
    here = f"{__file__}:"
    for trajectory in by_task["t1"]:
        assert trajectory.status == Status.ERROR and "environment bug" in trajectory.error
        assert here in trajectory.error  # where it was raised, to fix it
    assert all(t.status == Status.TIMEOUT for t in by_task["t2"])
    for trajectory in by_task["t1"] + by_task["t2"]:
        # The conversation up to the failure is kept: the prompt and the sampled reply.
        assert [m["role"] for m in trajectory.messages] == ["user", "assistant"]
        assert trajectory.reward is None and trajectory.token_ids
    for trajectory in by_task["t3"]:
        assert trajectory.status == Status.ERROR and "grader bug" in trajectory.error
        assert here in trajectory.error
        assert trajectory.rewards == {} and trajectory.reward is None  # never a silent 0
    summary = summarize(groups, 1.0)
    assert (summary.scored, summary.errored) == (2, 6)
    assert summary.reward_mean == 1.0 and "environment bug" in (summary.first_error or "")


async def test_episode_token_budget_truncates(client):
    env = Chatty(Harness(max_turns=5, max_tokens_per_turn=6, max_total_tokens=10))
    (group,) = await generate_groups(env, tasks(1), client, RolloutConfig(), 1, None)
    (trajectory,) = group.trajectories
    assert trajectory.status == Status.TRUNCATED
    assert sum(trajectory.loss_mask) == 10  # 6 + the 4 left in the budget


async def test_a_failed_start_is_stopped_and_a_hanging_grader_is_an_error(client):
    class Leaky(Environment):
        stopped: list[str] = []

        async def start(self, episode: Episode) -> None:
            episode.resources["held"] = episode.task.id
            if episode.task.id == "t0":
                raise RuntimeError("start failed after acquiring")

        async def stop(self, episode: Episode) -> None:
            self.stopped.append(episode.resources.pop("held"))

    async def hangs(episode: Episode) -> float:
        if episode.task.id == "t1":
            await asyncio.sleep(30)
        return 1.0

    env = Leaky(Harness(max_tokens_per_turn=2), Rubric(Reward(hangs)))
    groups = await generate_groups(env, tasks(3), client, RolloutConfig(timeout_s=2.0), 1, None)
    assert sorted(env.stopped) == ["t0", "t1", "t2"]  # released, the failed start too
    statuses = {g.task.id: g.trajectories[0] for g in groups}
    assert statuses["t0"].status == Status.ERROR and "start failed" in statuses["t0"].error
    assert statuses["t1"].status == Status.ERROR and "grading exceeded" in statuses["t1"].error
    assert statuses["t2"].reward == 1.0
