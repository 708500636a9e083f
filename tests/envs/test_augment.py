"""Harness augmentation: variants drawn from the seed, applied to the prompt and the tools,
recorded on the trajectory; an eval over fixed variants reports reward per variant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reinforge.envs.augment import HarnessAugmentation, Variant
from reinforge.envs.config import EnvConfig
from reinforge.envs.registry import load_configured
from reinforge.errors import UsageError
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize

from ..commands import ROOT, reinforge

GUESS = str(ROOT / "examples" / "guess_env.py")
AUGMENT = HarnessAugmentation(
    system_prompts=["You are careful. {prompt}", "Answer briefly."],
    tool_names={"compare": ["check", "probe"]},
    tool_descriptions={"compare": ["Says whether a number is too low, too high or right."]},
    notes=["Note: binary search halves the range."],
)


def test_a_variant_is_the_same_for_the_same_key_and_differs_across_keys():
    tools = list(load_configured(EnvConfig(name=GUESS)).harness.tools)
    variants = [AUGMENT.draw(f"0/t/{i}", i, 0, tools) for i in range(30)]
    assert variants == [AUGMENT.draw(f"0/t/{i}", i, 0, tools) for i in range(30)]
    assert len({(v.prompt, v.names["compare"], tuple(v.notes)) for v in variants}) > 3


def test_fixed_variants_start_from_the_own_harness_and_differ():
    tools = list(load_configured(EnvConfig(name=GUESS)).harness.tools)
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
    env = load_configured(EnvConfig(name=GUESS, augment=AUGMENT))
    variant = Variant(AUGMENT, None, None, [], {"compare": "probe"}, {"compare": 0}, 0.5)
    episode = env.new_episode(env.tasks(1, seed=0)[0])
    episode.tools = variant.tools(list(env.harness.tools))
    assert [t.name for t in episode.tools] == ["probe"]
    assert episode.tools[0].schema["function"]["description"].startswith("Says whether")
    assert env.harness.tools[0].name == "compare"  # the environment's own tool is unchanged
    call = {"function": {"name": "probe", "arguments": '{"number": 50}'}, "id": "c1"}
    (result,) = await env._run_tools(episode, {"role": "assistant", "tool_calls": [call]})
    assert result["name"] == "probe" and not result["content"].startswith("Error")
    old = {"function": {"name": "compare", "arguments": '{"number": 50}'}, "id": "c2"}
    (refused,) = await env._run_tools(episode, {"role": "assistant", "tool_calls": [old]})
    assert "no tool named 'compare'; tools: probe" in refused["content"]


async def test_variants_reach_the_model_and_are_recorded(tiny_engine):
    fixed = HarnessAugmentation(**{**AUGMENT.model_dump(), "variants": 2})
    env = load_configured(EnvConfig(name=GUESS, augment=fixed, max_tokens_per_turn=4))
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
        load_configured(EnvConfig(name=GUESS, augment=augment))


def test_eval_reports_reward_per_harness_variant(tmp_path: Path):
    out = tmp_path / "eval"
    done = reinforge(
        "eval", GUESS, "--model", "tiny-random", "--tasks", "2", "--rollouts", "1",
        "--harness-variants", "3", "--max-tokens", "4", "--out", str(out),
        'env.augment.system_prompts=["A. {prompt}", "B."]',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 6
    assert {n: v["rollouts"] for n, v in summary["variants"].items()} == {"0": 2, "1": 2, "2": 2}
    assert "harness variant 2" in done.stdout
    alike = reinforge("eval", "examples/reverse_env.py", "--harness-variants", "2")
    assert alike.returncode == 2 and "would all be alike" in alike.stderr
    assert len(alike.stderr.strip().splitlines()) == 1
