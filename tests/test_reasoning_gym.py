"""reasoning-gym's datasets as environments (`reasoning_gym:<dataset>`), through the
registry and the real commands, on the tiny random model."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from reinforge.envs.ecosystem.reasoning_gym_env import dataset_seed
from reinforge.envs.ecosystem.reasoning_gym_env import load_environment as load_dataset
from reinforge.envs.registry import load_environment
from reinforge.errors import UsageError
from reinforge.types import Trajectory

from .commands import reinforge_here
from .conftest import require_extra
from .envs.scripted import ScriptedClient

DATASETS = ["leg_counting", "basic_arithmetic", "spell_backward"]


@pytest.fixture(autouse=True)
def _reasoning_gym() -> None:
    require_extra("reasoning_gym", "ecosystem")


def test_a_dataset_resolves_through_the_registry_by_its_source():
    env = load_environment("reasoning_gym:leg_counting", max_animals=3)
    assert env.name == "reasoning_gym:leg_counting"
    assert env.tasks(4, seed=1) == load_dataset("leg_counting", max_animals=3).tasks(4, seed=1)


def test_tasks_are_the_datasets_drawn_with_the_seed():
    env = load_dataset("leg_counting")
    tasks = env.tasks(5, seed=3)
    assert tasks == env.tasks(5, seed=3) and tasks != env.tasks(5, seed=4)
    assert [t.id for t in tasks] == [f"leg_counting-3-{i}" for i in range(5)]
    assert env.tasks(0, seed=3) == []
    # reasoning-gym draws entry i from its seed + i: seeds one apart must not share entries
    words = load_dataset("spell_backward")
    first, second = words.tasks(10, seed=0), words.tasks(10, seed=1)
    questions = {t.prompt[0]["content"] for t in first}
    assert questions.isdisjoint(t.prompt[0]["content"] for t in second)
    assert abs(dataset_seed(0) - dataset_seed(1)) > 10
    for task in tasks:
        (message,) = task.prompt
        assert message == {"role": "user", "content": task.info["entry"]["question"]}
        assert task.answer == task.info["entry"]["answer"]
    assert "<answer>" in (env.harness.system_prompt or "")


def test_the_config_reaches_the_dataset():
    for task in load_dataset("leg_counting", min_animals=2, max_animals=2).tasks(10, seed=0):
        assert len(task.info["entry"]["metadata"]["animals"]) == 2


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("<think>I count them.</think>\n<answer>{answer}</answer>", 1.0),
        ("<answer>?</answer> then <answer>{answer}</answer>", 1.0),  # the last block
        ("<answer>{answer}</answer> no, <answer>?</answer>", 0.0),
        ("<answer>?</answer>", 0.0),
        ("{answer}", 0.0),  # no <answer> block, as reasoning-gym reads it: no answer
    ],
)
async def test_the_rubric_scores_with_the_datasets_own_scorer(dataset, reply, score):
    env = load_dataset(dataset)
    for task in env.tasks(3, seed=7):
        client = ScriptedClient([reply.format(answer=task.answer)])
        episode = await env.rollout(client, task)
        (scores,) = await env.rubric.score([episode])
        assert scores.rewards == {"score_answer": score} and scores.total == score


async def test_partial_credit_is_the_scorers_own_float():
    env = load_dataset("spell_backward")
    for task in env.tasks(3, seed=0):
        almost = task.answer[:-1] + "#"
        episode = await env.rollout(ScriptedClient([f"<answer>{almost}</answer>"]), task)
        (scores,) = await env.rubric.score([episode])
        assert 0 < scores.total < 1
        assert scores.total == env.scorer.score_answer(almost, task.info["entry"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"min_animal": 3}, "config env.args.min_animal: unknown key"),
        ({"max_animals": "many"}, "config env.args.max_animals: Input should be a valid integer"),
        ({"min_animals": 5, "max_animals": 2}, "config env.args: max_animals must be >= min"),
        ({"seed": 3}, "config env.args.seed: set by the run"),
        ({"size": 10}, "config env.args.size: set by the run"),
        ({"max_turns": 2}, "config env.args.max_turns: moved to env.max_turns"),
    ],
)
def test_bad_args_are_one_line_naming_the_key(args, message):
    with pytest.raises(UsageError, match="^" + message):
        load_environment("reasoning_gym:leg_counting", **args)


def test_an_unknown_dataset_lists_close_names_and_how_to_see_all():
    with pytest.raises(UsageError) as error:
        load_environment("reasoning_gym:leg_count")
    assert "unknown reasoning-gym dataset 'leg_count'; close: leg_counting" in str(error.value)
    assert "print(sorted(DATASETS))" in str(error.value)


def test_without_reasoning_gym_the_loader_says_what_to_install(monkeypatch):
    for module in [m for m in sys.modules if m.split(".")[0] == "reasoning_gym"]:
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(UsageError, match=r"pip install 'reinforge\[ecosystem\]'"):
        load_dataset("leg_counting")


@pytest.mark.parametrize(
    ("dataset", "args"),
    [("leg_counting", {"max_animals": 3}), ("basic_arithmetic", {}), ("spell_backward", {})],
)
def test_eval_runs_a_dataset(tmp_path, dataset, args):
    out = tmp_path / "eval"
    flags = [flag for key, value in args.items() for flag in ("--env-arg", f"{key}={value}")]
    result = reinforge_here(
        "eval",
        f"reasoning_gym:{dataset}",
        *flags,
        "--model",
        "tiny-random",
        "--tasks",
        "3",
        "--rollouts",
        "2",
        "--max-tokens",
        "16",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"] == f"reasoning_gym:{dataset}"
    assert summary["scored"] == 6 and set(summary["rewards"]) == {"score_answer"}
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    tasks = {t.id: t for t in load_dataset(dataset, **args).tasks(3, seed=0)}
    assert {row["task_id"] for row in rows} == set(tasks)
    for row in rows:
        user = next(m for m in row["messages"] if m["role"] == "user")
        assert user == tasks[row["task_id"]].prompt[0]  # the arguments reached the dataset
        assert set(row["rewards"]) == {"score_answer"}


def test_eval_refuses_a_misspelt_arg_in_one_line():
    result = reinforge_here(
        "eval", "reasoning_gym:leg_counting", "--env-arg", "max_animal=3", "--model", "tiny-random"
    )
    assert result.returncode == 2
    assert "config env.args.max_animal: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


ONE_ANIMAL = {"min_animals": 1, "max_animals": 1, "max_instances": 1}
"""leg_counting with one animal: a handful of small answers, which a tiny model can hit."""


def test_train_steps_on_the_scores_reasoning_gyms_scorer_gives(tmp_path):
    """A random model never writes an `<answer>` block, so every reward would be 0 and GRPO
    would have nothing to learn from. As a user would, warm it up with `reinforge sft` on
    answers in the tags (tasks of another seed), then train: the steps must learn from the
    differences reasoning-gym's own scorer makes between a group's rollouts."""
    from reasoning_gym import create_dataset
    from reasoning_gym.utils import extract_answer

    env = load_dataset("leg_counting", **ONE_ANIMAL)
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        "".join(
            Trajectory(
                task_id=task.id,
                group_id=task.id,
                messages=[
                    *env.harness.initial_messages(task),
                    {"role": "assistant", "content": f"<answer>{task.answer}</answer>"},
                ],
                reward=1.0,
            ).model_dump_json()
            + "\n"
            for task in env.tasks(8, seed=1000)
        )
    )
    warmed = reinforge_here(
        "sft", "model.name=tiny-random", f"sft.data={answers}", "sft.epochs=25",
        "sft.batch_size=4", "optim.lr=6e-3", f"run.dir={tmp_path}", "run.name=warm",
        "run.checkpoint_every=100",
    )  # fmt: skip
    assert warmed.returncode == 0, warmed.stderr
    env_args = [f"env.args.{key}={value}" for key, value in ONE_ANIMAL.items()]
    result = reinforge_here(
        "train", "env.name=reasoning_gym:leg_counting", *env_args,
        f"model.name={tmp_path / 'warm'}", "run.steps=2", f"run.dir={tmp_path}", "run.name=r",
        "rollout.tasks_per_step=8", "env.max_tokens_per_turn=16",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = tmp_path / "r"

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["scored"] == 32 and set(r["rewards"]) == {"score_answer"} for r in rows)
    trained = [r for r in rows if r["train"] is not None]
    assert trained, "no step trained: every group's rewards were equal"
    for row in trained:
        assert row["reward_std"] > 0 and row["zero_variance_groups"] < row["tasks"]
        assert row["train"]["trained_tokens"] > 0 and row["train"]["grad_norm"] > 0
    assert rows[-1]["policy_version"] == len(trained)

    # Every reward is what reasoning-gym's own parser and scorer make of the reply.
    steps = [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted((run / "trajectories").iterdir())
    ]
    for trajectories in steps:
        for row in trajectories:
            _, seed, index = row["task_id"].rsplit("-", 2)
            dataset = create_dataset(
                "leg_counting", **ONE_ANIMAL, seed=dataset_seed(int(seed)), size=int(index) + 1
            )
            reply = extract_answer(row["messages"][-1]["content"])
            assert row["rewards"] == {
                "score_answer": dataset.score_answer(reply, dataset[int(index)])
            }
    assert {row["task_id"] for row in steps[0]} != {row["task_id"] for row in steps[1]}

    # And the steps changed the warmed-up weights.
    (warm,) = (tmp_path / "warm" / "checkpoints").iterdir()
    before = load_file(warm / "model.safetensors")
    after = load_file(run / "checkpoints" / "step_00002" / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[name], after[name]) for name in before)
