"""Harness augmentation: variants drawn from the seed, applied to the prompt, the tools and
their call format, a sub-agent tool, recorded on the trajectory; an eval over fixed
variants reports reward per variant."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reinforge.envs.environment import Environment, Harness
from reinforge.envs.recipes.augment import HarnessAugmentation, Variant
from reinforge.envs.recipes.config import RecipesConfig
from reinforge.envs.recipes.subagent import SubAgentConfig
from reinforge.envs.registry import load_configured
from reinforge.envs.tools import Tool
from reinforge.errors import UsageError
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.engine_thread import Completion
from reinforge.policy.records import render_messages, token_record_problems
from reinforge.policy.sampling import SamplingParams
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize
from reinforge.types import Status, Trajectory, masked_spans

from ..commands import ROOT, reinforge_here
from .scripted import ScriptedClient

GUESS = str(ROOT / "examples" / "guess_env.py")
AUGMENT = HarnessAugmentation(
    system_prompts=["You are careful. {prompt}", "Answer briefly."],
    tool_names={"compare": ["check", "probe"]},
    tool_descriptions={"compare": ["Says whether a number is too low, too high or right."]},
    notes=["Note: binary search halves the range."],
)


def test_a_variant_is_the_same_for_the_same_key_and_differs_across_keys():
    tools = list(load_configured(RecipesConfig(name=GUESS)).harness.tools)
    variants = [AUGMENT.draw(f"0/t/{i}", i, 0, tools) for i in range(30)]
    assert variants == [AUGMENT.draw(f"0/t/{i}", i, 0, tools) for i in range(30)]
    assert len({(v.prompt, v.names["compare"], tuple(v.notes)) for v in variants}) > 3


def test_fixed_variants_start_from_the_own_harness_and_differ():
    tools = list(load_configured(RecipesConfig(name=GUESS)).harness.tools)
    fixed = HarnessAugmentation(**{**AUGMENT.model_dump(), "variants": 4})
    variants = [fixed.draw(f"0/a/{i}", i, 0, tools) for i in range(4)]
    assert variants[0] == Variant.own(fixed)  # the baseline: the environment's harness
    assert len({v.key(tools) for v in variants}) == 4
    # rollout i of any task meets variant i mod 4, the same for every task
    assert fixed.draw("0/b/5", 5, 0, tools) == variants[1]
    assert [v.number for v in variants] == [0, 1, 2, 3]
    prompt_only = HarnessAugmentation(system_prompts=["A {prompt}"], variants=3)
    # two harnesses exist (own, "A"); the third variant repeats one rather than fail
    drawn = [prompt_only.draw("k", i, 0, []).key([]) for i in range(3)]
    assert len(set(drawn)) == 2


def test_a_variant_rewrites_the_system_prompt_and_adds_its_notes():
    user = {"role": "user", "content": "hi"}
    wrap = Variant(AUGMENT, None, 0, [0], {}, {}, 0.5)
    note = "Note: binary search halves the range."
    assert wrap.messages([{"role": "system", "content": "Be kind."}, user]) == [
        {"role": "system", "content": f"You are careful. Be kind.\n\n{note}"},
        user,
    ]
    assert wrap.messages([user])[0] == {
        "role": "system",
        "content": "You are careful. \n\nNote: binary search halves the range.",
    }
    plain = Variant(AUGMENT, None, None, [], {}, {}, 0.5)
    assert plain.messages([user]) == [user]  # nothing drawn: the environment's own prompt


async def test_a_renamed_tool_is_offered_and_called_by_its_shown_name():
    env = load_configured(RecipesConfig(name=GUESS, augment=AUGMENT))
    variant = Variant(AUGMENT, None, None, [], {"compare": "probe"}, {"compare": 0}, 0.5)
    episode = env.new_episode(env.tasks(1, seed=0)[0])
    episode.tools = variant.tools(list(env.harness.tools))
    assert [t.name for t in episode.tools] == ["probe"]
    assert episode.tools[0].schema["function"]["description"].startswith("Says whether")
    assert env.harness.tools[0].name == "compare"  # the environment's own tool is unchanged
    call = {"function": {"name": "probe", "arguments": '{"number": 50}'}, "id": "c1"}
    client = ScriptedClient([])  # asked nothing: these tools need no policy
    (result,) = await env._run_tools(client, episode, {"role": "assistant", "tool_calls": [call]})
    assert result["name"] == "probe" and not result["content"].startswith("Error")
    old = {"function": {"name": "compare", "arguments": '{"number": 50}'}, "id": "c2"}
    (refused,) = await env._run_tools(client, episode, {"role": "assistant", "tool_calls": [old]})
    assert "no tool named 'compare'; tools: probe" in refused["content"]


async def test_variants_reach_the_model_and_are_recorded(tiny_engine):
    fixed = HarnessAugmentation(**{**AUGMENT.model_dump(), "variants": 2})
    env = load_configured(RecipesConfig(name=GUESS, augment=fixed, max_tokens_per_turn=4))
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    tasks = env.tasks(3, seed=0)
    groups = await generate_groups(env, tasks, client, RolloutConfig(), 4, 7)
    trajectories = [t for g in groups for t in g.trajectories]
    for trajectory in trajectories:
        assert trajectory.info["harness_variant"] == trajectory.index % 2
        if trajectory.index % 2 == 0:  # variant 0: the environment's own harness
            (task,) = [t for t in tasks if t.id == trajectory.task_id]
            own = env.harness.initial_messages(task)
            assert trajectory.messages[: len(own)] == own
            assert trajectory.info["harness"] == {
                "system_prompt": None,
                "notes": [],
                "tools": ["compare"],
                "descriptions": {},
                "tool_format": "hermes",
                "subagent": False,
            }
        shown = trajectory.info["harness"]["tools"]
        assert [t["function"]["name"] for t in trajectory.tools or []] == shown
    by_number = {t.info["harness_variant"]: t.info["harness"] for t in trajectories}
    for trajectory in trajectories:  # a fixed variant is the same for every task
        assert trajectory.info["harness"] == by_number[trajectory.info["harness_variant"]]
    summary = summarize(groups, 1.0)
    assert {n: v.rollouts for n, v in summary.variants.items()} == {"0": 6, "1": 6}
    again = await generate_groups(env, tasks, client, RolloutConfig(), 4, 7)
    assert [t.info["harness"] for g in again for t in g.trajectories] == [
        t.info["harness"] for t in trajectories
    ]


def test_a_config_naming_a_tool_the_environment_lacks_is_refused():
    augment = HarnessAugmentation(tool_names={"search": ["lookup"]})
    with pytest.raises(UsageError, match=r"does not offer: search \(its tools: compare\)"):
        load_configured(RecipesConfig(name=GUESS, augment=augment))


def test_eval_reports_reward_per_harness_variant(tmp_path: Path):
    out = tmp_path / "eval"
    done = reinforge_here(
        "eval", GUESS, "--model", "tiny-random", "--tasks", "2", "--rollouts", "1",
        "--harness-variants", "3", "--max-tokens", "4", "--out", str(out),
        'env.augment.system_prompts=["A. {prompt}", "B."]',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 6
    assert {n: v["rollouts"] for n, v in summary["variants"].items()} == {"0": 2, "1": 2, "2": 2}
    assert "harness variant 2" in done.stdout
    alike = reinforge_here("eval", "examples/reverse_env.py", "--harness-variants", "2")
    assert alike.returncode == 2 and "would all be alike" in alike.stderr
    assert len(alike.stderr.strip().splitlines()) == 1


def test_the_tool_format_and_the_subagent_are_drawn_from_the_key():
    # With only these two features, a rollout's Random(key) draws the format, then one
    # number against the sub-agent's rate (0.5). Python's Random("0/t/k") gives, for k=0..5:
    # hermes 0.79, hermes 0.85, hermes 0.69, xml 0.60, xml 0.54, xml 0.48: the sub-agent is
    # offered to rollout 5 alone.
    tools = list(load_configured(RecipesConfig(name=GUESS)).harness.tools)
    augment = HarnessAugmentation(
        tool_formats=["hermes", "xml"], subagent=SubAgentConfig(rate=0.5), shuffle_tools=False
    )
    drawn = [augment.draw(f"0/t/{k}", k, 0, tools) for k in range(6)]
    assert [(v.tool_format, v.subagent) for v in drawn] == [
        ("hermes", False), ("hermes", False), ("hermes", False),
        ("xml", False), ("xml", False), ("xml", True),
    ]  # fmt: skip
    assert drawn == [augment.draw(f"0/t/{k}", k, 0, tools) for k in range(6)]
    assert [t.name for t in drawn[5].tools(tools)] == ["compare", "subagent"]
    assert drawn[5].describe(drawn[5].tools(tools))["tool_format"] == "xml"
    # drawn after the other features, so adding them leaves those draws as they were
    both = HarnessAugmentation(
        **{**AUGMENT.model_dump(), "tool_formats": ["hermes", "xml"], "subagent": {"rate": 0.5}}
    )
    for k in range(20):
        variant, plain = both.draw(f"0/t/{k}", k, 0, tools), AUGMENT.draw(f"0/t/{k}", k, 0, tools)
        assert replace(variant, augmentation=AUGMENT, tool_format="hermes", subagent=False) == plain


def test_fixed_variants_differ_by_tool_format_where_there_are_tools_to_call():
    tools = list(load_configured(RecipesConfig(name=GUESS)).harness.tools)
    fixed = HarnessAugmentation(tool_formats=["hermes", "xml"], shuffle_tools=False, variants=2)
    own, other = (fixed.draw("k", i, 0, tools) for i in range(2))
    assert (own.tool_format, other.tool_format) == ("hermes", "xml")  # the one other harness
    assert own.key(tools) != other.key(tools) and fixed.varies(tools)
    assert fixed.draw("k", 1, 0, []).key([]) == own.key([]) and not fixed.varies([])
    always = HarnessAugmentation(subagent=SubAgentConfig(rate=1.0), shuffle_tools=False)
    assert not always.varies(tools)  # offered to every rollout: nothing differs
    assert HarnessAugmentation(subagent=SubAgentConfig(rate=0.5), shuffle_tools=False).varies([])


class ScriptedEngine:
    """The tiny engine's interface, and so the real server and client, answering each prompt
    with `script(prompt text)` in the text's canonical tokens and the EOS token: what the
    policy writes, tool calls a random model never makes included, is the test's choice."""

    def __init__(self, engine: Any, script: Callable[[str], str]) -> None:
        self.engine, self.script = engine, script
        self.prompts: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_tokens: Any = None
    ) -> Completion:
        tokenizer = self.engine.tokenizer
        self.prompts.append(tokenizer.decode(prompt_ids))
        text = self.script(self.prompts[-1])
        ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        return Completion(ids, [-1.0] * len(ids), [self.engine.version] * len(ids), "stop")


def turn(prompt: str) -> int:
    """Which assistant turn of its conversation a prompt asks for, from 0."""
    return prompt.count("<|im_start|>assistant") - 1


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def _one_rollout(env: Environment, engine: ScriptedEngine) -> Trajectory:
    client = PolicyClient.for_engine(engine, SamplingConfig())
    (group,) = await generate_groups(env, env.tasks(1, seed=1), client, RolloutConfig(), 1, 7)
    (trajectory,) = group.trajectories
    assert trajectory.status is Status.OK, trajectory.error
    return trajectory


async def test_an_xml_harness_is_told_in_the_prompt_and_its_calls_run(tiny_engine, chat_format):
    env = load_configured(
        RecipesConfig(name=GUESS, augment=HarnessAugmentation(tool_formats=["xml"]))
    )
    call = "Let me check.\n<function=compare>\n<parameter=number>\n50\n</parameter>\n</function>"
    malformed = "<function=compare>50</function>"
    replies = [call, malformed, "<answer>18</answer>"]  # the secret of seed 1's task is 18
    engine = ScriptedEngine(tiny_engine, lambda prompt: replies[turn(prompt)])
    trajectory = await _one_rollout(env, engine)
    assert trajectory.info["harness"]["tool_format"] == "xml"
    # the tools and the format are in the system prompt; none went to the server, which
    # would have added its Hermes instructions
    assert "<function=TOOL_NAME>" in engine.prompts[0] and '"name":"compare"' in engine.prompts[0]
    assert "<tool_call>" not in engine.prompts[0] and trajectory.tools is None
    messages = trajectory.messages
    assert [m["role"] for m in messages[2:]] == ["assistant", "tool"] * 2 + ["assistant"]
    # the calls stay the text the policy wrote, with no `tool_calls` beside it
    assert [m for m in messages if m["role"] == "assistant"] == [
        {"role": "assistant", "content": reply} for reply in replies
    ]
    assert messages[3]["name"] == "compare"
    assert messages[3]["content"] == "The secret number is lower than 50."
    assert messages[5] == {
        "role": "tool",
        "content": f"Error: invalid tool call {malformed!r}: text outside the "
        "<parameter=ARGUMENT>...</parameter> blocks",
    }
    assert trajectory.tool_errors == 1 and trajectory.info["compared"] == [50]
    # token in, token out: the record is what was sampled, and the messages render to it
    assert token_record_problems(trajectory, chat_format, trajectory.tools) == []
    rendered = render_messages(messages, chat_format, trajectory.tools)
    assert rendered == (trajectory.token_ids, trajectory.loss_mask)


async def test_the_subagent_runs_its_task_as_a_nested_episode(tiny_engine, chat_format):
    augment = HarnessAugmentation(subagent=SubAgentConfig(max_turns=2), shuffle_tools=False)
    env = load_configured(RecipesConfig(name=GUESS, augment=augment))
    task = "Compare 50 with the secret number."
    outer = [hermes("subagent", {"task": task}), "<answer>18</answer>"]
    helper = [hermes("compare", {"number": 50}), "It is lower than 50."]

    def script(prompt: str) -> str:
        return (outer if "I am thinking" in prompt else helper)[turn(prompt)]

    engine = ScriptedEngine(tiny_engine, script)
    trajectory = await _one_rollout(env, engine)
    assert trajectory.info["harness"]["subagent"] is True
    assert trajectory.info["harness"]["tools"] == ["compare", "subagent"]
    assert trajectory.info["subagent_calls"] == 1 and trajectory.tool_errors == 0
    # the helper's conversation is its own: the task, and the tools but the sub-agent
    helper_prompts = [p for p in engine.prompts if "I am thinking" not in p]
    assert len(helper_prompts) == 2 and task in helper_prompts[0]
    assert '"name":"compare"' in helper_prompts[0] and '"name":"subagent"' not in helper_prompts[0]
    # its call ran on the rollout's state, and its final answer is the tool's result
    assert trajectory.info["compared"] == [50]
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    result = trajectory.messages[2]
    assert result["name"] == "subagent"
    assert result["content"] == "It is lower than 50."
    # of the four turns sampled, the trajectory's tokens hold the outer two only
    assert len(masked_spans(trajectory.loss_mask)) == 2
    assert token_record_problems(trajectory, chat_format, trajectory.tools) == []


async def test_a_subagent_call_samples_a_seeded_nested_episode_from_the_engine(tiny_engine):
    augment = HarnessAugmentation(tool_formats=["xml"], subagent=SubAgentConfig(max_turns=1))
    env = load_configured(RecipesConfig(name=GUESS, augment=augment, max_tokens_per_turn=8))
    episode = env.new_episode(env.tasks(1, seed=1)[0])
    variant = Variant(augment, None, None, [], {}, {}, None, "xml", True)
    variant.apply(episode, list(env.harness.tools))
    assert env.request_tools(episode) is None  # told in the system prompt: none go with requests
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig()).episode(None, 11)
    call = "<function=subagent>\n<parameter=task>\nSay hello.\n</parameter>\n</function>"
    message = {"role": "assistant", "content": call}
    before = len(tiny_engine.log)
    (result,) = await env._run_tools(client, episode, message)
    (prompt, completion), *_ = tiny_engine.log[before:]
    assert len(tiny_engine.log) == before + 1  # one turn, the helper's only one
    shown = tiny_engine.tokenizer.decode(prompt)
    assert "Say hello." in shown and "<function=TOOL_NAME>" in shown
    assert '"name":"compare"' in shown and '"name":"subagent"' not in shown
    # a random model runs into the token limit: the helper gave no answer
    assert completion.finish_reason == "length" and len(completion.token_ids) == 8
    assert result["name"] == "subagent" and result["content"].startswith(
        "Error: the sub-agent did not finish"
    )
    assert episode.tool_errors == 1 and episode.state["subagent_calls"] == 1
    assert client.turns == []  # nothing of the helper joins the rollout's token record
    await env._run_tools(client, episode, message)
    assert tiny_engine.log[-1][1].token_ids == completion.token_ids  # seeded: the same helper
    assert episode.state["subagent_calls"] == 2


def test_a_subagent_beside_a_tool_of_that_name_is_refused():
    def subagent(task: str) -> str:
        """Someone else's."""
        return task

    env = Environment(Harness(tools=[Tool(subagent)]))
    augment = HarnessAugmentation(subagent=SubAgentConfig())
    with pytest.raises(UsageError, match="has a tool named 'subagent' already"):
        RecipesConfig(augment=augment).apply(env)
