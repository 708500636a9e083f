"""The rollout generator on the real engine: statuses, and token records that are exact."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest

from reinforge.envs import Continue, Environment, Episode, Finished, Harness, Reward, Rubric, Tool
from reinforge.envs.blocking import abandoned_threads
from reinforge.policy.client import EpisodeClient, PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.records import token_record_problems
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize
from reinforge.types import Status, Task, masked_spans

from .envs.scripted import Script, ScriptedClient


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


async def test_a_rollouts_time_is_split_into_its_parts_and_its_turns(client):
    class Slow(Chatty):
        """Each part takes a known least time: the timings must hold it where it went."""

        async def start(self, episode: Episode) -> None:
            await asyncio.sleep(0.05)

        async def stop(self, episode: Episode) -> None:
            await asyncio.sleep(0.1)

        async def respond(self, episode: Episode) -> Continue | Finished:
            await asyncio.sleep(0.03 * episode.turns)
            return await super().respond(episode)

    env = Slow(Harness(max_turns=5, max_tokens_per_turn=6), Rubric(Reward(length)))
    (group,) = await generate_groups(env, tasks(1), client, RolloutConfig(), 2, 1)
    for trajectory in group.trajectories:
        timings = trajectory.timings
        assert timings.start_s >= 0.05 and timings.stop_s >= 0.1
        assert len(timings.turns) == trajectory.turns == 3
        for turn, part in enumerate(timings.turns, start=1):
            assert part.env_s >= 0.03 * turn and part.generate_s > 0
        assert timings.tools_s == pytest.approx(sum(t.env_s for t in timings.turns))
        assert timings.generate_s >= sum(t.generate_s for t in timings.turns) - 1e-9
        parts = timings.start_s + timings.tools_s + timings.stop_s
        assert parts <= timings.env_s + 1e-6
        assert timings.generate_s + timings.env_s + timings.score_s == pytest.approx(
            timings.total_s
        )
    seconds = summarize([group], 1.0).seconds
    mean = [sum(getattr(t.timings, part) for t in group.trajectories) / 2 for part in
            ("start_s", "tools_s", "stop_s")]  # fmt: skip
    assert [seconds.start_s, seconds.tools_s, seconds.stop_s] == pytest.approx(mean)
    assert len(seconds.turns) == 3 and seconds.turns[2].env_s >= 0.09


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


async def test_an_environments_own_timeout_is_its_error_not_the_rollouts_limit(client):
    class SlowToStart(Environment):
        async def start(self, episode: Episode) -> None:
            if episode.task.id == "t0":
                raise TimeoutError("the sandbox did not start within 1 s")

    env = SlowToStart(Harness(max_tokens_per_turn=2), Rubric(Reward(lambda episode: 1.0)))
    groups = await generate_groups(env, tasks(2), client, RolloutConfig(timeout_s=60.0), 1, None)
    statuses = {g.task.id: g.trajectories[0] for g in groups}
    assert statuses["t0"].status == Status.ERROR
    assert "TimeoutError: the sandbox did not start within 1 s" in statuses["t0"].error
    assert "exceeded" not in statuses["t0"].error
    assert statuses["t1"].reward == 1.0  # the other rollout is scored


class ScriptedSource:
    """Rollouts without a model: every episode's client replies from `script` (no model
    writes a tool call on cue), and has no token record."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def episode(self, max_total_tokens: int | None, seed: int | None) -> EpisodeClient:
        client = EpisodeClient(lambda: None, max_total_tokens, seed)  # type: ignore
        client.chat = ScriptedClient(self.script).chat  # type: ignore[method-assign]
        return client


async def test_hanging_sync_env_tool_and_reward_code_times_out_and_the_run_goes_on():
    release = threading.Event()  # the hung threads end with the test

    def stuck(note: str) -> str:
        """Hang until the test ends."""
        release.wait()
        return note

    class Hangs(Environment):
        def setup(self, task: Task) -> dict:
            if task.id == "t1":
                release.wait()
            return {}

        async def respond(self, episode: Episode) -> Finished:
            if episode.task.id == "t4":
                time.sleep(60)  # async code that blocks the event loop
            return Finished()

    def graded(episode: Episode) -> float:
        if episode.task.id == "t3":
            release.wait()
        return 1.0

    def reply(messages: list) -> str:  # t2's first turn calls the tool
        if messages[0]["content"] == "task 2" and len(messages) == 1:
            return '<tool_call>\n{"name": "stuck", "arguments": {"note": "x"}}\n</tool_call>'
        return "done"

    env = Hangs(Harness(tools=[Tool(stuck)], max_turns=2), Rubric(Reward(graded)))
    config = RolloutConfig(timeout_s=5.0, max_block_s=0.5)
    try:
        groups = await generate_groups(env, tasks(5), ScriptedSource(reply), config, 2, None)
        by_task = {g.task.id: g.trajectories for g in groups}
        assert all(t.status == Status.OK and t.reward == 1.0 for t in by_task["t0"])
        for trajectory in by_task["t1"]:  # a sync environment hook
            assert trajectory.status == Status.TIMEOUT
            assert trajectory.error == (
                "rollout exceeded 5.0 s; left running in abandoned threads: Environment.new_episode"
            )
        for trajectory in by_task["t2"]:  # a sync tool
            assert trajectory.status == Status.TIMEOUT
            assert trajectory.error.endswith("abandoned threads: " + stuck.__qualname__)
            assert [m["role"] for m in trajectory.messages] == ["user", "assistant"]
        for trajectory in by_task["t3"]:  # a sync reward
            assert trajectory.status == Status.ERROR and trajectory.reward is None
            assert trajectory.error.startswith("grading exceeded 5.0 s; left running in ")
        line = inspect.getsourcelines(Hangs.respond)[1] + 2
        for trajectory in by_task["t4"]:  # async environment code
            assert trajectory.status == Status.ERROR
            assert trajectory.error.startswith("rollout held the event loop for ")
            assert f"at {__file__}:{line}, past rollout.max_block_s (0.5 s)" in trajectory.error
        assert abandoned_threads() >= 6
    finally:
        release.set()


async def test_async_code_that_blocks_the_loop_fails_only_its_own_rollouts(client):
    class Sleepy(Environment):
        async def respond(self, episode: Episode) -> Finished:
            if episode.task.id == "t1":
                time.sleep(60)
            return Finished()

    config = RolloutConfig(timeout_s=120.0, max_block_s=0.5)
    started = time.monotonic()
    groups = await generate_groups(
        Sleepy(Harness(max_tokens_per_turn=3)), tasks(3), client, config, 2, None
    )
    assert time.monotonic() - started < 60  # the sleeps were cut short
    by_task = {g.task.id: g.trajectories for g in groups}
    for trajectory in by_task["t0"] + by_task["t2"]:  # the engine served them meanwhile
        assert trajectory.status == Status.TRUNCATED and trajectory.token_ids
    for trajectory in by_task["t1"]:
        assert trajectory.status == Status.ERROR and "held the event loop" in trajectory.error


async def test_huge_tool_results_and_environment_messages_are_cut_with_a_note():
    def dump() -> str:
        """Print a lot."""
        return "y" * 100_000_000

    class Verbose(Environment):
        async def respond(self, episode: Episode) -> Continue | Finished:
            if episode.turns == 2:
                return Continue([{"role": "user", "content": "z" * 100_000_000}])
            return Finished()

    script = iter(['<tool_call>\n{"name": "dump", "arguments": {}}\n</tool_call>', "a", "b"])
    env = Verbose(Harness(tools=[Tool(dump)], max_turns=3))
    config = RolloutConfig(max_message_bytes=1000)
    (group,) = await generate_groups(
        env, tasks(1), ScriptedSource(lambda _: next(script)), config, 1, None
    )
    (trajectory,) = group.trajectories
    assert trajectory.status == Status.OK
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    for message, letter in zip(trajectory.messages[2::2], "yz", strict=True):
        assert message["content"] == letter * 1000 + (
            "\n[cut at 1000 bytes of 100000000: messages from tools and the environment are "
            "cut at rollout.max_message_bytes]"
        )


async def test_a_huge_environment_message_does_not_stall_the_next_turn(client):
    class Verbose(Environment):
        async def respond(self, episode: Episode) -> Continue | Finished:
            if episode.turns == 1:
                return Continue([{"role": "user", "content": "z " * 50_000_000}])
            return Finished()

    env = Verbose(Harness(max_turns=2, max_tokens_per_turn=2))
    config = RolloutConfig(timeout_s=60.0, max_message_bytes=2000)
    (group,) = await generate_groups(env, tasks(1), client, config, 1, None)
    (trajectory,) = group.trajectories
    assert trajectory.status == Status.TRUNCATED and trajectory.turns == 2  # sampled after it
    assert len(trajectory.messages[2]["content"].encode()) < 2200


def test_cutting_keeps_whole_characters_and_text_parts_share_the_limit():
    episode = Episode(Task(id="t", prompt=[]), [], max_message_bytes=5)
    parts = [{"type": "text", "text": "abc"}, {"type": "text", "text": "déf"}]
    episode.add([{"role": "user", "content": "ééé"}, {"role": "user", "content": parts}])
    assert episode.messages[0]["content"].startswith("éé\n[cut at 5 bytes of 6:")
    first, second = episode.messages[1]["content"]
    assert first == {"type": "text", "text": "abc"}
    assert second["text"].startswith("d\n[cut at 2 bytes of 4:")
