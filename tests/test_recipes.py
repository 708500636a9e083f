"""The recipes as a user runs them: each example config trains on the tiny model, and the
judge asks a real `reinforge serve`. A random judge writes no "Score: X", so its verdicts
are errors, never 0: that the error carries the server's own words proves the round trip.
Distillation is taught by the tiny model itself, then by another."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from reinforge.envs.recipes.config import RecipesConfig
from reinforge.envs.recipes.judge import Criterion, JudgeConfig
from reinforge.envs.registry import load_configured
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.models import load_model
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.types import Status

from .commands import LENGTH_ENV, reinforge_here, serving


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with serving() as url:
        yield f"{url}/v1"


async def test_a_judge_behind_a_real_server(judge_url, tiny_engine):
    judge = JudgeConfig(
        url=judge_url,
        model="tiny-random",
        max_tokens=16,
        criteria=[Criterion(name="polite", rubric="The reply is polite.")],
    )
    env = load_configured(RecipesConfig(name=LENGTH_ENV, judge=judge))
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    (group,) = await generate_groups(env, env.tasks(1), client, RolloutConfig(), 2, 0)
    for trajectory in group.trajectories:
        assert trajectory.status == Status.ERROR and trajectory.reward is None
        assert "reward 'polite' raised JudgeError: no 'Score: X' in the judge's reply" in (
            trajectory.error or ""
        )
    unreachable = judge.model_copy(update={"url": "http://127.0.0.1:9/v1"})
    env = load_configured(RecipesConfig(name=LENGTH_ENV, judge=unreachable))
    (group,) = await generate_groups(env, env.tasks(1), client, RolloutConfig(), 1, 0)
    (trajectory,) = group.trajectories
    assert trajectory.status == Status.ERROR
    assert "the judge at http://127.0.0.1:9/v1 failed: Connection error" in (trajectory.error or "")


@pytest.mark.parametrize("example", ["budgets", "doom_loop", "judge", "augment"])
def test_the_recipe_examples_train_on_the_tiny_model(example, tmp_path, judge_url):
    """`reinforge train examples/X.toml model.name=tiny-random run.steps=2`, with two tasks a
    step of two rollouts to keep it short, and the judge pointed at the test's server."""
    judge = [f"env.judge.url={judge_url}", "env.judge.model=tiny-random", "env.judge.max_tokens=16"]
    judge.append("loop.max_error_rate=1")  # a random judge gives no score: all are errors
    result = reinforge_here(
        *["train", f"examples/{example}.toml", "model.name=tiny-random", "run.steps=2"],
        *[f"run.dir={tmp_path}", "rollout.tasks_per_step=2", "rollout.rollouts_per_task=2"],
        *(judge if example == "judge" else []),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / example
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["loop_rate"] <= 1.0 for r in rows)
    trajectories = _trajectories(run / "trajectories" / "step_00001.jsonl")
    if example == "budgets":
        assert set(rows[0]["levels"]) <= {"low", "medium", "high"} and rows[0]["levels"]
        assert all(t["info"]["reasoning_level"] in rows[0]["levels"] for t in trajectories)
        assert all("over_budget" in t["rewards"] for t in trajectories)
    if example == "augment":  # drawn per rollout and recorded
        for trajectory in trajectories:
            harness, first = trajectory["info"]["harness"], trajectory["messages"][0]
            assert harness["system_prompt"] in (0, 1, 2)
            if harness["system_prompt"] == 2:
                assert first["role"] == "system"
                assert first["content"].startswith("Solve the problem with the tools")
            offered = ["subagent"] if harness["subagent"] else []
            assert sorted(harness["tools"]) == ["calculate", *offered]
            assert ("subagent_calls" in trajectory["info"]) == harness["subagent"]
            if harness["tool_format"] == "xml":  # told in the system prompt, not sent
                assert trajectory["tools"] is None and "<function=TOOL_NAME>" in first["content"]
            else:
                assert harness["tool_format"] == "hermes"
                assert [t["function"]["name"] for t in trajectory["tools"]] == harness["tools"]
    if example == "doom_loop":
        assert all("looping" in t["rewards"] for t in trajectories)
    if example == "judge":
        assert rows[0]["errored"] == len(trajectories)  # a random judge gives no score
        assert all("JudgeError" in t["error"] for t in trajectories)


def test_distillation_from_itself_has_no_reverse_kl_and_from_another_model_some(tmp_path):
    """`reinforge train examples/distill.toml` on the tiny model, taught by the tiny model
    itself, then by a copy with noisy weights. The student's log-prob minus the teacher's
    on its own tokens is ~0 only when the two are one model: a check of the sign and of
    the alignment of teacher and sampled tokens. A random model earns no reward, so every
    group is uniform and only distillation trains it."""
    teacher, tokenizer = load_model("tiny-random")
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in teacher.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=noise))
    teacher.save_pretrained(tmp_path / "teacher")  # not a run's directory: runs write there
    tokenizer.save_pretrained(tmp_path / "teacher")
    reverse_kl = {}
    for name, model in (("itself", "tiny-random"), ("noisy", str(tmp_path / "teacher"))):
        result = reinforge_here(
            "train",
            "examples/distill.toml",
            "model.name=tiny-random",
            "run.steps=2",
            f"run.dir={tmp_path}",
            f"run.name={name}",
            "rollout.tasks_per_step=2",
            "rollout.rollouts_per_task=2",
            f'distill.teachers=[{{model = "{model}"}}]',
        )
        assert result.returncode == 0, result.stderr[-3000:]
        rows = [
            json.loads(line)
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        for row in rows:
            assert row["zero_variance_groups"] == 0 and row["train"] is not None
            assert row["distill"]["taught_samples"] == 4
        for trajectory in _trajectories(tmp_path / name / "trajectories" / "step_00001.jsonl"):
            assert len(trajectory["teacher_logprobs"]) == sum(trajectory["loss_mask"]) > 0
        reverse_kl[name] = rows[0]["distill"]["reverse_kl"]
    # The same weights: the engine's cached decode and the teacher's one forward agree to
    # float rounding. Other weights: the student's tokens are likelier under the student.
    assert abs(reverse_kl["itself"]) < 1e-4
    assert reverse_kl["noisy"] > 0.1


def test_an_unreachable_teacher_is_one_line_and_exit_code_2(tmp_path):
    result = reinforge_here(
        "train",
        "examples/distill.toml",
        "model.name=tiny-random",
        f"run.dir={tmp_path}",
        'distill.teachers=[{model = "http://127.0.0.1:9/v1"}]',
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "reinforge train: error: cannot reach an OpenAI-compatible server at "
        "http://127.0.0.1:9/v1: Connection error."
    )
    assert "Traceback" not in result.stderr


def _trajectories(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
