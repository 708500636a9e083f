"""`reinforge diff` over a run directory written with the real types and the real metrics
function: four steps of two tasks x two rollouts, where steps 3-4 answer right more often
and say "let me compute" where steps 1-2 said "I guess"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from reinforge.config import Config
from reinforge.orchestrate.metrics import StepTime, step_metrics
from reinforge.rollout.store import RolloutWriter
from reinforge.rollout.summary import summarize
from reinforge.rundirs import diff
from reinforge.rundirs.dash.app import create_app
from reinforge.train.trainer import select_for_training
from reinforge.types import Group, Status, Task, Trajectory

from .commands import reinforge_here

ANSWERS = {"t0": 7, "t1": 12}
LOOP = [5] * 40
"""Sampled token ids that repeat one token 40 times: a doom loop by `loops.py`'s rule."""


def _trajectory(step: int, task_id: str, index: int) -> Trajectory:
    """Steps 1-2 answer right only on t0's first rollout; steps 3-4 on all but t1's second.
    Step 1's t1/1 loops, step 2's t1/0 writes a malformed tool call, step 3's t1/1 passes
    invalid arguments, and step 4's t1/1 is truncated and touched a test file."""
    later = step >= 3
    right = (task_id, index) != ("t1", 1) if later else (task_id, index) == ("t0", 0)
    answer = ANSWERS[task_id] + (0 if right else 1)
    text = (
        f"Let me compute: the answer is {answer}." if later else f"I guess the answer is {answer}."
    )
    sampled = list(range(10 if later else 6))
    if (step, task_id, index) == (1, "t1", 1):
        sampled = LOOP
    messages = [
        {"role": "user", "content": f"Task {task_id}"},
        {"role": "assistant", "content": text},
    ]
    tool_errors, info, status = 0, {}, Status.OK
    if (step, task_id, index) == (2, "t1", 0):
        messages.append({"role": "tool", "content": "Error: invalid tool call '{': bad JSON"})
        tool_errors = 1
    if (step, task_id, index) == (3, "t1", 1):
        error = "Error: invalid arguments for add: a is required"
        messages.append({"role": "tool", "name": "add", "content": error})
        tool_errors = 1
    if (step, task_id, index) == (4, "t1", 1):
        status, info = Status.TRUNCATED, {"hack_flags": ["touched_tests"]}
    return Trajectory(
        task_id=task_id,
        group_id=task_id,
        index=index,
        messages=messages,
        token_ids=[100, 101] + sampled,
        loss_mask=[0, 0] + [1] * len(sampled),
        logprobs=[-0.5] * len(sampled),
        policy_versions=[step - 1] * len(sampled),
        rewards={"correct": float(right)},
        reward=float(right),
        status=status,
        turns=1,
        tool_errors=tool_errors,
        info=info,
    )


def _groups(step: int) -> list[Group]:
    return [
        Group(
            task=Task(id=task_id, prompt=[], answer=str(answer)),
            trajectories=[_trajectory(step, task_id, index) for index in range(2)],
        )
        for task_id, answer in ANSWERS.items()
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run's directory as `RunRecorder` leaves it, without checkpoints."""
    config = Config.model_validate(
        {
            "model": {"name": "tiny-random"},
            "env": {"name": "arithmetic"},
            "run": {"name": "r", "dir": str(tmp_path_factory.mktemp("runs")), "steps": 4},
        }
    )
    directory = config.run_dir
    (directory / "trajectories").mkdir(parents=True)
    (directory / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
    time_split = StepTime(
        trainer_idle_s=1.0, train_s=1.0, sync_s=0.1, rollout_idle_s=0.0, total_s=2.2
    )
    with (directory / "metrics.jsonl").open("w") as metrics:
        for step in range(1, 5):
            groups = _groups(step)
            row = step_metrics(
                step,
                summarize(groups, 1.0),
                select_for_training(groups, config.trainer),
                None,
                trained_version=step - 1,
                policy_version=step,
                dropped_stale=0,
                time=time_split,
                rollout_tokens_per_s=100.0,
                synced=None,
                traffic=[],
            )
            metrics.write(row.model_dump_json() + "\n")
            with (directory / "trajectories" / f"step_{step:05d}.jsonl").open("w") as out:
                out.writelines(t.model_dump_json() + "\n" for g in groups for t in g.trajectories)
    return directory


def test_the_numbers_side_by_side(run: Path) -> None:
    report = diff.compare(*diff.run_sides(run, 1, 4))
    assert (report.before, report.after) == ("steps 1-2", "steps 3-4")  # window 3, clipped
    assert report.sizes == "steps 1-2: 8 rollouts of 2 tasks; steps 3-4: 8 rollouts of 2 tasks"
    rows = {row.metric: diff.cells(row)[1:] for row in report.rows}
    assert rows == {
        # before: 2 of 8 right; after: 6 of 8
        "reward (mean)": ("0.250", "0.750", "+0.500"),
        "  correct": ("0.250", "0.750", "+0.500"),
        # pass@1 is a mean over tasks: before t0 2/4, t1 0/4; after t0 4/4, t1 2/4
        "pass rate (reward >= 1)": ("0.250", "0.750", "+0.500"),
        "turns (mean)": ("1.00", "1.00", "+0.00"),
        # before: 7 x 6 tokens + the 40 of the loop = 82 over 8; after: 10 each
        "completion tokens (mean)": ("10.2", "10.0", "-0.2"),
        "tool errors per rollout": ("0.125 (1)", "0.125 (1)", "+0.000"),
        "  invalid arguments": ("0.000 (0)", "0.125 (1)", "+0.125"),
        "  malformed tool call": ("0.125 (1)", "0.000 (0)", "-0.125"),
        "loop rate": ("0.125 (1)", "0.000 (0)", "-0.125"),
        "hack: touched_tests": ("0.000 (0)", "0.125 (1)", "+0.125"),
        "status: ok": ("1.000 (8)", "0.875 (7)", "-0.125"),
        "status: truncated": ("0.000 (0)", "0.125 (1)", "+0.125"),
    }


def test_ngrams_that_rose_and_fell(run: Path) -> None:
    report = diff.compare(*diff.run_sides(run, 1, 4))
    rose = [(g.text, g.before, g.after) for g in report.rose]
    fell = [(g.text, g.before, g.after) for g in report.fell]
    # The new phrase is in every later rollout (1000 per 1000) and no earlier one; its
    # shorter n-grams, in the same rollouts, are not listed apart. "is 7": 2 of 8 rollouts
    # before (t0's right one, two steps), 4 of 8 after; "is 8" and "is 12" are in 2 only,
    # under the minimum count of 3.
    assert rose == [
        ("compute the answer", 0, 1000),
        ("let me compute", 0, 1000),
        ("me compute the", 0, 1000),
        ("answer is 7", 250, 500),
    ]
    assert fell == [
        ("guess the answer", 1000, 0),
        ("i guess the", 1000, 0),
        ("answer is 13", 500, 250),
    ]


def test_the_same_task_before_and_after(run: Path) -> None:
    pairs = diff.compare(*diff.run_sides(run, 1, 4)).pairs
    # Both tasks' mean reward rose by 0.5 (t0 0.5 -> 1, t1 0 -> 0.5): by id on a tie.
    assert [(p.task_id, p.before_reward, p.after_reward) for p in pairs] == [
        ("t0", 0.5, 1.0),
        ("t1", 0.0, 0.5),
    ]
    assert pairs[1].before == diff.Example(0.0, "ok", "I guess the answer is 13.")
    assert pairs[1].after == diff.Example(1.0, "ok", "Let me compute: the answer is 12.")


def test_command_prints_the_table_and_writes_markdown(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "diff.md"
    result = reinforge_here("diff", str(run), "--from", "1", "--to", "4", "--markdown", str(out))
    assert result.returncode == 0, result.stderr
    assert "reward (mean)" in result.stdout and "let me compute" in result.stdout
    text = out.read_text()
    assert "| reward (mean) | 0.250 | 0.750 | +0.500 |" in text
    assert "| &nbsp;&nbsp;malformed tool call | 0.125 (1) | 0.000 (0) | -0.125 |" in text
    assert "| `let me compute` | 0 | 1000 |" in text
    assert "### t1" in text and "Let me compute: the answer is 12." in text


def test_two_evals_pair_their_tasks(run: Path, tmp_path: Path) -> None:
    for name, step in (("before", 1), ("after", 4)):
        writer = RolloutWriter(tmp_path / name)
        for group in _groups(step):
            writer.write_group(group)
        writer.write_summary(summarize(_groups(step), 1.0))
        writer.close()
    report = diff.compare(*diff.eval_sides(tmp_path / "before", tmp_path / "after"))
    assert (report.before, report.after) == ("before", "after")
    assert diff.cells(report.rows[0]) == ("reward (mean)", "0.250", "0.750", "+0.500")
    assert [p.task_id for p in report.pairs] == ["t0", "t1"]
    result = reinforge_here("diff", str(tmp_path / "before"), str(tmp_path / "after"))
    assert result.returncode == 0, result.stderr
    assert "task t1" in result.stdout


def test_dashboard_serves_the_report(run: Path) -> None:
    client = TestClient(create_app(run.parent))
    answer = client.get("/api/diff", params={"run": "r", "from": 1, "to": 4})
    assert answer.status_code == 200
    report = diff.compare(*diff.run_sides(run, 1, 4))
    assert answer.json() == json.loads(json.dumps(dataclasses.asdict(report)))
    missing = client.get("/api/diff", params={"run": "r", "from": 1, "to": 9})
    assert missing.status_code == 400 and "no trajectories for step 9" in missing.json()["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("RUN", "--from", "1", "--to", "9"), "has no trajectories for step 9 (it has steps 1-4)"),
        (("MISSING", "--from", "1", "--to", "4"), "no such run: "),
        (("RUN", "--from", "1", "--to", "2"), "the windows around steps 1 and 2 overlap"),
        (("RUN",), "give --from STEP and --to STEP"),
    ],
)
def test_a_mistake_is_one_line(run: Path, args: tuple[str, ...], message: str) -> None:
    paths = {"RUN": str(run), "MISSING": str(run.parent / "missing")}
    result = reinforge_here("diff", *(paths.get(a, a) for a in args))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stderr.startswith("reinforge diff: error: ")
