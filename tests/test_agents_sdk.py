"""An unmodified OpenAI Agents SDK agent as the harness, through the episode gateway: it
sees only text over HTTP, yet the trajectory's trained tokens are exactly what the engine
sampled. The engine is the tiny random model, scripted to write the tool calls a random
model never writes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from reinforge.envs import Environment, Episode, gateway
from reinforge.envs.gateway import close_gateway, open_episode
from reinforge.envs.registry import load_environment
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import EngineConfig, SamplingConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.policy.records import sampled_texts, token_record_problems
from reinforge.policy.requests import ChatRequest
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.types import Status, Task, masked_spans

from .commands import ROOT, reinforge_here
from .conftest import Recording, require_extra
from .envs.scripted import ScriptedClient
from .test_server import ScriptedModel, script

EXAMPLE = str(ROOT / "examples" / "agents_sdk_env.py")
USER = {"role": "user", "content": "Hi"}


@pytest.fixture(autouse=True)
def _agents_sdk() -> None:
    require_extra("agents", "ecosystem")


@pytest.fixture(scope="module")
def scripted_engine() -> Iterator[tuple[Recording, ScriptedModel]]:
    model, tokenizer = load_model("tiny-random")
    scripted = ScriptedModel(model)
    engine = Recording(Engine(scripted, tokenizer, "tiny-random", EngineConfig()))  # type: ignore[arg-type]
    yield engine, scripted
    engine.close()


def call(name: str, **arguments: Any) -> str:
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{payload}\n</tool_call>"


async def test_an_agents_sdk_agent_runs_its_tool_in_the_sandbox_and_stays_token_exact(
    scripted_engine, chat_format
):
    engine, model = scripted_engine
    env = load_environment(EXAMPLE)
    (task,) = env.tasks(1, seed=2)
    turns = [call("bash", command=f"printf {task.answer} > answer.txt"), "done"]
    model.script = [token for turn in turns for token in script(turn)]
    engine.log.clear()
    client = PolicyClient.for_engine(engine, SamplingConfig())
    try:
        (group,) = await generate_groups(env, [task], client, RolloutConfig(), 1, 7)
    finally:
        model.script.clear()
        await env.aclose()
    (trajectory,) = group.trajectories
    assert trajectory.error is None and trajectory.status == Status.OK
    assert trajectory.info["answer"] == task.answer and trajectory.reward == 1.0  # it ran
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory.messages[3]["content"] == "[exit code 0]\n"
    # Trained tokens: each turn exactly the completion the engine sampled after exactly the
    # tokens before it, and nothing else.
    assert len(engine.log) == 2
    spans = masked_spans(trajectory.loss_mask)
    assert len(spans) == 2
    for (start, end), (prompt, completion) in zip(spans, engine.log, strict=True):
        assert trajectory.token_ids[:start] == prompt
        assert trajectory.token_ids[start:end] == completion.token_ids
    assert sampled_texts(trajectory.token_ids, trajectory.loss_mask, chat_format.tokenizer) == [
        *turns
    ]
    assert token_record_problems(trajectory, chat_format, trajectory.tools) == []


class _Harness(Environment):
    """A hand-written harness speaking plain HTTP to the gateway; `play` is its body."""

    def __init__(self, play) -> None:
        super().__init__()
        self.play = play

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        return [Task(id=f"t{i}", prompt=[USER]) for i in range(n)]

    async def _play(self, client, episode: Episode) -> None:
        async with open_episode(client, episode, 4) as url:
            harness = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
            try:
                await self.play(harness)
            finally:
                await harness.close()

    async def aclose(self) -> None:
        await close_gateway()


async def test_a_harness_that_rewrites_history_gets_a_400_and_its_rollout_fails(tiny_engine):
    refusals: list[openai.BadRequestError] = []

    async def play(harness: openai.AsyncOpenAI) -> None:
        first = await harness.chat.completions.create(model="policy", messages=[USER])
        answer = first.choices[0].message.model_dump(exclude_none=True)
        rewritten = [{"role": "user", "content": "Hello"}, answer, USER]
        try:
            await harness.chat.completions.create(model="policy", messages=rewritten)
        except openai.BadRequestError as error:
            refusals.append(error)  # and the harness carries on, as if nothing happened

    env = _Harness(play)
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    try:
        (group,) = await generate_groups(env, env.tasks(1), client, RolloutConfig(), 1, 3)
    finally:
        await env.aclose()
    (refused,) = refusals
    assert refused.status_code == 400 and refused.param == "messages[0]"
    assert "rewrote the conversation" in refused.message
    (trajectory,) = group.trajectories
    assert trajectory.status == Status.ERROR
    assert "rewrote the conversation" in trajectory.error
    assert "token-exactly" in trajectory.error


async def test_a_resent_message_is_the_same_however_the_harness_reserialises_it():
    """Calls compare by what they say: arguments as parsed JSON, no content as empty. The
    policy is sent its own reply as sampled, markup and all."""
    sampled = call("bash", command="ls", cwd="/")
    client = ScriptedClient([sampled, "done"])
    episode = Episode(Task(id="t", prompt=[USER]), [])
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    async with open_episode(client, episode, 8) as url:
        harness = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        first = await harness.chat.completions.create(model="x", messages=[USER], tools=tools)
        (tool_call,) = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls"
        assert first.choices[0].message.content is None  # the markup parsed out, as OpenAI's
        arguments = json.dumps(json.loads(tool_call.function.arguments), indent=2, sort_keys=True)
        function = {"name": "bash", "arguments": arguments}
        resent = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{**tool_call.model_dump(), "function": function}],
        }
        result = {"role": "tool", "tool_call_id": tool_call.id, "content": "a b"}
        second = await harness.chat.completions.create(
            model="x", messages=[USER, resent, result], tools=tools, temperature=1.7, seed=3
        )
        await harness.close()
    assert second.choices[0].message.content == "done"
    assert client.prompts[1][1]["content"] == sampled  # the reply as it was sampled
    assert client.prompts[1][2] == result
    assert episode.turns == 2 and episode.tool_calls == 1 and not episode.truncated
    assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant"]
    await close_gateway()


ASK_REFUSED = {
    "stream": dict(extra_body={"stream": True}),
    "n": dict(n=2),
    "stop": dict(stop=["x"]),
    "logprobs": dict(logprobs=True),
    "top_logprobs": dict(top_logprobs=2),
    "prompt_logprobs": dict(extra_body={"prompt_logprobs": 1}),
    "prompt_token_ids": dict(extra_body={"prompt_token_ids": [1, 2]}),
    "stop_loops": dict(extra_body={"stop_loops": True}),
}
"""A request asking each field the gateway refuses."""
ASK_IGNORED = dict(temperature=1.7, top_p=0.5, seed=3, user="someone")
HONOURED = {"max_tokens", "max_completion_tokens"}
"""The fields the gateway's own table in docs/environments.md names, besides those."""


def test_the_gateways_field_table_is_what_it_does():
    docs = (ROOT / "docs" / "environments.md").read_text()
    table = docs.split("The request fields, as for `reinforge serve`")[1].split("\n\n")[1]
    named = {
        name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    assert named == set(gateway.REFUSED) | set(gateway.IGNORED) | HONOURED
    assert named <= set(ChatRequest.model_fields)
    assert set(ASK_REFUSED) == set(gateway.REFUSED) and set(ASK_IGNORED) == set(gateway.IGNORED)


async def test_fields_the_gateway_cannot_honour_are_refused_naming_them():
    client = ScriptedClient(["sampled as ever"])
    episode = Episode(Task(id="t", prompt=[USER]), [])
    async with open_episode(client, episode, 8) as url:
        harness = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        refused = {
            **ASK_REFUSED,
            "top_k": dict(extra_body={"top_k": 5}),
            "tool_choice": dict(tool_choice="required", tools=[]),
        }
        messages = {}
        for field, asked in refused.items():
            with pytest.raises(openai.BadRequestError) as caught:
                await harness.chat.completions.create(model="x", messages=[USER], **asked)
            assert caught.value.param == field, field
            messages[field] = caught.value.message
        assert "not a field" in messages["top_k"]
        assert "answers each turn whole" in messages["stream"]
        assert client.prompts == []
        ignored = await harness.chat.completions.create(model="x", messages=[USER], **ASK_IGNORED)
        models = [m.id async for m in harness.models.list()]
        await harness.close()
    assert ignored.choices[0].message.content == "sampled as ever"
    assert models == ["policy"] and client.prompts == [[USER]]
    stale = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):  # the episode is over: its URL answers no more
        await stale.chat.completions.create(model="x", messages=[USER])
    await stale.close()
    await close_gateway()


async def test_a_long_tool_result_reaches_the_policy_cut_and_may_be_resent_whole():
    """The policy is sent what an environment's own tool result would be, cut at
    `rollout.max_message_bytes`; the harness keeps its whole copy, and re-sending it is no
    rewrite."""
    client = ScriptedClient([call("bash", command="ls"), "read it", "done"])
    episode = Episode(Task(id="t", prompt=[USER]), [], max_message_bytes=8)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    async with open_episode(client, episode, 8) as url:
        harness = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        first = await harness.chat.completions.create(model="x", messages=[USER], tools=tools)
        answer = first.choices[0].message.model_dump(exclude_none=True)
        (tool_call,) = first.choices[0].message.tool_calls
        result = {"role": "tool", "tool_call_id": tool_call.id, "content": "x" * 100}
        sent = [USER, answer, result]
        second = await harness.chat.completions.create(model="x", messages=sent, tools=tools)
        sent += [second.choices[0].message.model_dump(exclude_none=True), USER]
        third = await harness.chat.completions.create(model="x", messages=sent, tools=tools)
        await harness.close()
    assert third.choices[0].message.content == "done"
    cut = client.prompts[1][2]["content"]
    assert cut.startswith("x" * 8 + "\n[cut at 8 bytes of 100") and "x" * 9 not in cut
    assert client.prompts[2][2]["content"] == cut
    assert episode.messages[2]["content"] == cut
    await close_gateway()


async def test_an_episode_out_of_tokens_answers_as_the_server_does_and_ends_truncated(
    tiny_engine,
):
    policy = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    client = policy.episode(max_total_tokens=3, seed=1)
    episode = Episode(Task(id="t", prompt=[USER]), [])
    async with open_episode(client, episode, 8) as url:
        harness = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
        first = await harness.chat.completions.create(model="x", messages=[USER])
        assert first.usage.completion_tokens == 3 and first.choices[0].finish_reason == "length"
        answer = first.choices[0].message.model_dump(exclude_none=True)
        refusals = []
        try:
            await harness.chat.completions.create(model="x", messages=[USER, answer, USER])
        except openai.BadRequestError as error:
            refusals.append(error)
            raise  # the harness gives up; leaving the block ends the episode truncated
        finally:
            await harness.close()
    (refused,) = refusals
    assert refused.code == "context_length_exceeded"
    assert episode.truncated and episode.turns == 1
    await close_gateway()


def test_the_example_runs_under_eval(tmp_path):
    result = reinforge_here(
        "eval", EXAMPLE, "--model", "tiny-random", "--tasks", "2", "--max-tokens", "8",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(r) for r in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["status"] != "error" for r in rows), rows
    assert all(r["messages"][0]["role"] == "system" for r in rows)  # the SDK's instructions
    assert all(sum(r["loss_mask"]) > 0 for r in rows)
