"""Sandbox tools inside real episodes: a scripted agent works in a real local sandbox."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from reinforge.envs.registry import load_environment
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.types import Status

from .commands import reinforge_here
from .envs.scripted import ScriptedClient

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "sandbox_env.py")


def call(name: str, **arguments) -> str:
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{payload}\n</tool_call>"


def tool_results(client: ScriptedClient) -> list[str]:
    final = client.prompts[-1]
    return [m["content"] for m in final if m["role"] == "tool"]


async def test_an_agent_solves_the_task_with_its_tools():
    env = load_environment(EXAMPLE)
    (task,) = env.tasks(1, seed=3)
    client = ScriptedClient(
        [
            call("read_file", path="numbers.txt"),
            call("bash", command="awk '{s+=$1} END {print s}' numbers.txt > answer.txt"),
            call("edit", path="answer.txt", old="\n", new=""),
            call("bash", command="cat answer.txt"),
            "Done.",
        ]
    )
    try:
        episode = await env.rollout(client, task)
        results = tool_results(client)
        assert results[0].split() == [str(n) for n in task.info["numbers"]]
        assert results[1] == "[exit code 0]\n"
        assert results[2] == "edited answer.txt"
        assert results[3] == f"[exit code 0]\n{task.answer}"
        assert str(task.answer) not in str(client.prompts[0])  # the answer never went in
        assert episode.state["answer"] == str(task.answer)
        assert (await env.rubric.score([episode]))[0].total == 1.1
        assert "sandbox" not in episode.resources
        assert not env._pool.lent  # returned to the pool, destroyed
    finally:
        await env.aclose()


async def test_tool_errors_go_back_to_the_model_and_are_counted():
    env = load_environment(EXAMPLE, timeout_s=0.5)  # bash's per-call timeout
    (task,) = env.tasks(1)
    client = ScriptedClient(
        [
            call("read_file", path="missing.txt"),
            call("edit", path="numbers.txt", old="no such text", new="x"),
            call("bash", command="sleep 5"),
            "I give up.",
        ]
    )
    try:
        episode = await env.rollout(client, task)
        results = tool_results(client)
        assert results[0] == "Error: FileNotFoundError: missing.txt (no such regular file)"
        assert "occurs 0 times" in results[1]
        assert results[2].startswith("[timed out]")
        assert episode.tool_errors == 2
    finally:
        await env.aclose()


async def test_a_timed_out_rollout_still_releases_its_sandbox(tiny_engine):
    env = load_environment(EXAMPLE)

    async def stall(episode):
        await asyncio.sleep(30)

    env.respond = stall  # the environment hangs after the first turn
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    try:
        groups = await generate_groups(
            env, env.tasks(2), client, RolloutConfig(timeout_s=2), 2, None
        )
        assert all(t.status == Status.TIMEOUT for g in groups for t in g.trajectories)
        assert not env._pool.lent
    finally:
        await env.aclose()


def test_the_example_runs_under_eval(tmp_path):
    small = ["--model", "tiny-random", "--tasks", "2", "--rollouts", "2", "--max-tokens", "8"]
    result = reinforge_here("eval", EXAMPLE, *small, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(rows) == 4 and all(json.loads(r)["status"] != "error" for r in rows)


async def test_file_tools_refuse_a_fifo_at_once():
    """Opening a FIFO waits for its other end: the file tools refuse anything but a regular
    file before opening it for good, so the turn goes on (the tools' timeout is 1 hour)."""
    env = load_environment(EXAMPLE, timeout_s=3600.0)
    (task,) = env.tasks(1)
    client = ScriptedClient(
        [
            call("bash", command="mkfifo pipe"),
            call("read_file", path="pipe"),  # no writer
            call("write_file", path="pipe", content="x"),  # no reader
            call("edit", path="pipe", old="a", new="b"),
            call("read_file", path="/dev/zero"),  # a device that never ends
            "Done.",
        ]
    )
    try:
        episode = await env.rollout(client, task)
        results = tool_results(client)
        assert results[0] == "[exit code 0]\n"
        not_regular = "Error: FileNotFoundError: {} (no such regular file)"
        assert results[1] == results[3] == not_regular.format("pipe")
        assert results[4] == not_regular.format("/dev/zero")
        assert results[2].startswith("Error: SandboxError: write_files failed")
        assert results[2].endswith("/pipe: not a regular file\n")
        assert episode.tool_errors == 4
    finally:
        await env.aclose()
