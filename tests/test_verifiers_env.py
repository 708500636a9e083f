"""Environments written for `verifiers` (0.4), run by reinforge: `env.name = "verifiers:..."`.

The environments under tests/data/vf_*.py are written in verifiers' own style. verifiers
plays each rollout with its own harness, runtime and tool servers; the model is the tiny
random one behind reinforge's episode client. What these tests prove: the name resolves
through the entry point, verifiers' rewards are the trajectory's terms (names, weights,
values as verifiers scores them), every trained token is one the engine sampled, the
environment's answers and tools reach the policy, and `reinforge eval` and `reinforge
train` run each kind of environment.
"""

from __future__ import annotations

import json

import pytest

from reinforge.envs.registry import load_environment
from reinforge.errors import ConfigError, UsageError
from reinforge.policy.client import EpisodeMisuse, PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.records import token_record_problems
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.types import Status, Trajectory, masked_spans

from .commands import ROOT, reinforge_here
from .conftest import require_extra
from .envs.scripted import ScriptedClient

DATA = ROOT / "tests" / "data"
SINGLE = str(DATA / "vf_single_env.py")
MULTI_TURN = str(DATA / "vf_multiturn_env.py")
TOOL = str(DATA / "vf_tool_env.py")


@pytest.fixture(autouse=True)
def verifiers_installed() -> None:
    require_extra("verifiers", "ecosystem")


def _verifiers(path: str, **args: object):
    env = load_environment(f"verifiers:{path}", **args)
    env.harness.max_tokens_per_turn = 8
    return env


async def _rollouts(env, engine, tasks: int = 2, rollouts: int = 2) -> list[Trajectory]:
    client = PolicyClient.for_engine(engine, SamplingConfig())
    try:
        groups = await generate_groups(
            env, env.tasks(tasks, seed=3), client, RolloutConfig(), rollouts, 3
        )
    finally:
        await env.aclose()
    return [t for g in groups for t in g.trajectories]


def test_without_verifiers_the_loader_says_how_to_install_it(monkeypatch):
    from reinforge.envs.ecosystem import verifiers_env

    monkeypatch.setattr(verifiers_env, "find_spec", lambda name: None)
    with pytest.raises(UsageError) as raised:
        load_environment(f"verifiers:{SINGLE}")
    assert str(raised.value) == (
        "verifiers environments need the verifiers package: pip install 'reinforge[ecosystem]'"
    )


def test_the_rubric_is_the_tasks_rewards_by_name_and_weight():
    env = _verifiers(SINGLE)
    assert env.name == f"verifiers:{SINGLE}"
    assert env.env.config.agent.harness.id == "null"  # no shell unless asked for
    assert env.env.config.agent.runtime.type == "subprocess"
    assert [(t.key, t.weight) for t in env.rubric.terms] == [("length", 0.5), ("said_word", 2.0)]
    tasks = env.tasks(6, seed=0)  # 4 tasks, cycled past that
    assert [t.id for t in tasks] == ["0", "1", "2", "3", "0#4", "1#5"]
    assert tasks[0].prompt == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Repeat the word apple."},
    ]
    assert len(env.tasks(2, seed=0)) == 2


def test_args_reach_the_taskset_and_bad_ones_are_one_line():
    assert len(_verifiers(SINGLE, taskset={"split": "test"}).tasks(9)) == 9
    assert {t.id for t in _verifiers(SINGLE, taskset={"split": "test"}).tasks(9)} == {
        "0",
        "1",
    } | {f"{i % 2}#{i}" for i in range(2, 9)}
    assert len(_verifiers(SINGLE, num_tasks=1).pool) == 1
    with pytest.raises(ConfigError, match=r"^config env\.args\.taskset\.splt: unknown key$"):
        _verifiers(SINGLE, taskset={"splt": "test"})
    with pytest.raises(UsageError, match="harness 'nope' not found"):
        _verifiers(SINGLE, harness={"id": "nope"})
    with pytest.raises(UsageError, match="no verifiers environment at missing.py"):
        load_environment("verifiers:missing.py")


async def test_rewards_are_what_verifiers_scores_on_the_same_reply(tiny_engine):
    import verifiers.v1 as vf
    from verifiers.v1.dialects import parse_message

    env = _verifiers(SINGLE)
    trajectories = await _rollouts(env, tiny_engine)
    for trajectory in trajectories:
        assert trajectory.status in (Status.OK, Status.TRUNCATED), trajectory.error
        task = env.verifiers_task(env.tasks(4, seed=0)[int(trajectory.task_id)])
        trace = vf.Trace(
            task=vf.TraceTask(type="WordTask", data=task.data),
            agent=vf.AgentInfo(config=vf.AgentConfig()),
            nodes=[
                vf.MessageNode(message=parse_message(m), sampled=m["role"] == "assistant")
                for m in trajectory.messages
            ],
        )
        await task.score(trace)
        assert trajectory.rewards == {name: r.score for name, r in trace.rewards.items()}
        assert trajectory.reward == pytest.approx(trace.reward)
        assert trajectory.rewards["length"] > 0  # a random reply has a length


@pytest.mark.parametrize("path", [SINGLE, MULTI_TURN, TOOL], ids=["single", "multi", "tool"])
async def test_trained_tokens_are_exactly_what_the_engine_sampled(path, tiny_engine, chat_format):
    trajectories = await _rollouts(_verifiers(path), tiny_engine)
    sampled_for: dict[tuple[int, ...], list[list[int]]] = {}
    for prompt, completion in tiny_engine.log:
        sampled_for.setdefault(tuple(prompt), []).append(completion.token_ids)
    for trajectory in trajectories:
        assert trajectory.error is None
        assert token_record_problems(trajectory, chat_format, trajectory.tools) == []
        spans = masked_spans(trajectory.loss_mask)
        assert len(spans) == trajectory.turns >= 1
        for start, end in spans:
            prefix = tuple(trajectory.token_ids[:start])
            assert trajectory.token_ids[start:end] in sampled_for[prefix]


async def test_the_environment_answers_each_reply_in_one_token_record(tiny_engine):
    trajectories = await _rollouts(_verifiers(MULTI_TURN), tiny_engine)
    for trajectory in trajectories:
        roles = [m["role"] for m in trajectory.messages]
        assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert trajectory.turns == 3 and trajectory.rewards["guesses"] == 1.0
        assert trajectory.messages[2]["content"] in (
            "That is not a number. Guess a number from 1 to 10.",
            "Higher.",
            "Lower.",
        )


async def test_the_tools_the_harness_offered_are_the_trajectorys(tiny_engine, chat_format):
    (trajectory, *_) = await _rollouts(_verifiers(TOOL), tiny_engine, tasks=1, rollouts=1)
    (tool,) = trajectory.tools or []
    assert tool["function"]["name"] == "calc_add"
    assert tool["function"]["description"] == "Add two integers."
    prompt = chat_format.tokenizer.decode(trajectory.token_ids)
    assert "calc_add" in prompt  # the policy saw the tool


async def test_a_tool_call_runs_the_verifiers_tool_and_its_result_comes_back():
    env = _verifiers(TOOL)
    task = env.tasks(3, seed=0)[1]  # 40 + 2
    call = '<tool_call>\n{"name": "calc_add", "arguments": {"a": 40, "b": 2}}\n</tool_call>'
    client = ScriptedClient([call, lambda messages: f"It is {messages[-1]['content']}."])
    try:
        episode = await env.rollout(client, task)
    finally:
        await env.aclose()
    assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
    assert episode.messages[2]["content"] == "42"
    assert episode.messages[-1]["content"] == "It is 42."
    assert episode.turns == 2 and episode.tool_calls == 1
    (scores,) = await env.rubric.score([episode])
    assert scores.rewards == {"correct": 1.0, "length": 0.045, "used_tool": 1.0}
    assert scores.total == pytest.approx(1.2045)


async def test_a_harness_that_rewrites_the_conversation_is_refused():
    """verifiers' bash harness compacts its context: the call after the summary starts
    the conversation over, which the policy did not sample from."""
    env = _verifiers(
        TOOL, harness={"id": "bash", "edit": False, "compaction": {"summarize_at_tokens": 1}}
    )
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi"}}\n</tool_call>'
    client = ScriptedClient([call, "The summary.", "Never asked."])
    try:
        with pytest.raises(EpisodeMisuse) as raised:
            await env.rollout(client, env.tasks(1)[0])
    finally:
        await env.aclose()
    assert str(raised.value).startswith(
        "call 3 changed the conversation the policy has seen, from its message 2 on;"
    )
    assert len(client.prompts) == 2  # the summary was asked for; the call after it refused
    assert client.prompts[1][-1]["role"] == "user"  # verifiers' request for a summary


async def test_a_second_agent_run_in_one_episode_is_refused():
    import verifiers.v1 as vf
    from verifiers.v1.errors import ProviderError

    from reinforge.envs.ecosystem.verifiers_client import Conversation

    conversation = Conversation(ScriptedClient(["Hi."]), max_turns=5, max_tokens_per_turn=8)
    request = vf.Request(messages=[vf.UserMessage(content="Hello.")])
    reply = await conversation.respond(request, "policy", None, "trace-1")
    assert reply.message.content == "Hi."
    with pytest.raises(ProviderError, match="^a second agent run called the policy"):
        await conversation.respond(request, "policy", None, "trace-2")


async def test_the_turn_limit_ends_the_episode_truncated_and_scored(tiny_engine):
    env = _verifiers(MULTI_TURN)
    env.harness.max_turns = 2
    trajectories = await _rollouts(env, tiny_engine, tasks=1, rollouts=1)
    (trajectory,) = trajectories
    assert trajectory.status == Status.TRUNCATED and trajectory.turns == 2
    assert trajectory.rewards["guesses"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("path", [SINGLE, MULTI_TURN, TOOL], ids=["single", "multi", "tool"])
def test_reinforge_eval_runs_it(path, tmp_path):
    out = tmp_path / "eval"
    result = reinforge_here(
        "eval",
        f"verifiers:{path}",
        "--model",
        "tiny-random",
        "--tasks",
        "2",
        "--rollouts",
        "2",
        "--max-tokens",
        "8",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    terms = {SINGLE: {"length", "said_word"}, MULTI_TURN: {"guesses", "length", "found"}}
    for row in rows:
        assert row["status"] in ("ok", "truncated") and row["error"] is None
        assert set(row["rewards"]) == terms.get(path, {"correct", "length", "used_tool"})
        assert sum(row["loss_mask"]) == len(row["logprobs"]) > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"] == f"verifiers:{path}" and summary["rollouts"] == 4


@pytest.mark.parametrize("path", [SINGLE, MULTI_TURN, TOOL], ids=["single", "multi", "tool"])
def test_reinforge_train_takes_steps_on_it(path, tmp_path):
    result = reinforge_here(
        "train",
        "model.name=tiny-random",
        f"env.name=verifiers:{path}",
        "env.max_tokens_per_turn=8",
        "run.steps=1",
        f"run.dir={tmp_path}",
        "run.name=r",
        "rollout.tasks_per_step=2",
        "rollout.rollouts_per_task=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert row["step"] == 1 and row["errored"] == 0
    assert row["train"]["grad_norm"] > 0
