"""The synchronous loop and trainer on real parts: the tiny random model, the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoModelForCausalLM

from reinforge.config import Config, load_config
from reinforge.envs.registry import load_environment
from reinforge.errors import UsageError
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.models import load_model, load_tokenizer
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.train.checkpoints import latest_checkpoint, resume_from, write_checkpoint
from reinforge.train.config import TrainerConfig
from reinforge.train.trainer import Trainer, select_for_training
from reinforge.types import Group, Status, Task, Trajectory

from .commands import LENGTH_ENV, ROOT, kill_after, run_here, tiny_train


def test_a_tiny_run_writes_metrics_trajectories_and_loadable_checkpoints(tmp_path):
    process = _train(
        tmp_path, "run.steps=3", "run.name=tiny", "rollout.tasks_per_step=4", "model.threads=1"
    )
    assert process.wait(timeout=300) == 0, process.stderr.read()
    assert "threads: 1 (model.threads)" in process.stderr.read()
    run = tmp_path / "tiny"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert set(row["time"]) == {
            "trainer_idle_s",
            "train_s",
            "sync_s",
            "rollout_idle_s",
            "total_s",
        }
        model = row["model"]  # the engine in this process: its share of the step
        assert model["prefill_s"] > 0 and model["decode_s"] > 0
        assert model["prefill_s"] + model["decode_s"] <= model["busy_s"] + 1e-6
        assert model["busy_s"] + model["idle_s"] == pytest.approx(row["time"]["total_s"])
        assert row["seconds"]["generate_s"] > 0 and len(row["seconds"]["turns"]) == 1
        assert row["staleness_max"] == 0 and row["dropped_stale"] == 0
        assert row["train"]["grad_norm"] > 0 and row["zero_variance_groups"] == 0
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert len((run / "trajectories" / "step_00003.jsonl").read_text().splitlines()) == 16
    assert json.loads((run / "config.json").read_text())["run"]["steps"] == 3
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step_00002", "step_00003"]
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00003")


async def test_one_step_changes_every_trainable_parameter(tiny_engine):
    env = load_environment(LENGTH_ENV)
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    groups = await generate_groups(env, env.tasks(2), client, RolloutConfig(), 4, 0)
    model, _ = load_model("tiny-random")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = load_config(Config, None, ["optim.lr=1e-3"])
    trainer = Trainer(model, config.trainer, config.optim, total_steps=1)
    metrics = trainer.step(select_for_training(groups, config.trainer).batch())
    assert metrics.trained_tokens == 8 * 8
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


def test_keep_checkpoints_deletes_older_ones_only_once_a_newer_one_is_complete(tmp_path):
    tokenizer = load_tokenizer("tiny-random")

    def save(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"weights")

    def full_disk(folder: Path) -> None:
        raise OSError(28, "No space left on device")

    def save_optimizer(folder: Path) -> None:
        dcp.save({"step": torch.zeros(())}, checkpoint_id=folder, no_dist=True)

    for step in (2, 4, 6):
        write_checkpoint(tmp_path, step, save, save_optimizer, tokenizer, {"step": step}, keep=2)
    kept = ["step_00004", "step_00006"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == kept
    with pytest.raises(OSError, match="No space"):
        write_checkpoint(tmp_path, 8, full_disk, save_optimizer, tokenizer, {"step": 8}, keep=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == kept
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_00006"


def test_a_checkpoint_missing_an_optimizer_shard_is_refused(tmp_path):
    """A rank on another machine writes its shard to its own disk unless the run directory
    is shared: the checkpoint would not resume, so it is not kept."""
    tokenizer = load_tokenizer("tiny-random")

    def elsewhere(folder: Path) -> None:
        dcp.save({"step": torch.zeros(())}, checkpoint_id=folder, no_dist=True)
        (folder / "__0_0.distcp").unlink()

    with pytest.raises(UsageError, match=r"optimizer shards __0_0\.distcp were written elsewhere"):
        write_checkpoint(tmp_path, 1, lambda folder: None, elsewhere, tokenizer, {"step": 1})
    assert latest_checkpoint(tmp_path) is None


def test_a_checkpoint_of_the_optimizer_state_kept_whole_is_refused_in_one_line(tmp_path):
    """An earlier layout kept the optimizer state in trainer_state.pt: resuming from it
    says so and what to do, rather than a traceback of the loader."""
    old = tmp_path / "checkpoints" / "step_00002"
    old.mkdir(parents=True)
    torch.save({"step": 2, "optimizer": {}}, old / "trainer_state.pt")
    with pytest.raises(UsageError, match=r"step_00002 has no optimizer/: an earlier reinforge"):
        resume_from(tmp_path)


def test_zero_variance_groups_are_counted_and_errored_rollouts_left_out():
    task = Task(id="t", prompt=[])

    def trajectory(reward: float, status: Status = Status.OK) -> Trajectory:
        return Trajectory(
            task_id="t",
            group_id="t",
            token_ids=[1, 2],
            loss_mask=[0, 1],
            logprobs=[-1.0],
            reward=reward,
            status=status,
        )

    groups = [
        Group(task=task, trajectories=[trajectory(1.0), trajectory(1.0)]),  # no signal
        Group(
            task=task,
            trajectories=[trajectory(1.0), trajectory(0.0), trajectory(5.0, Status.ERROR)],
        ),
    ]
    selection = select_for_training(groups, TrainerConfig())
    assert selection.zero_variance_groups == 1
    assert all(t.status is Status.OK for t in selection.trajectories)
    # rewards [1, 0]: mean 0.5, sample std 0.7071 -> advantages +-0.7070 (eps 1e-4)
    assert selection.advantages == pytest.approx([0.70700, -0.70700], abs=1e-4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.stepz=3"], "config run.stepz: unknown key"),
        (["run.steps=many"], "run.steps: Input should be a valid integer"),
        (["trainer.algorithm.loss.kind=ppo2"], "trainer.algorithm.loss"),
        (["novalue"], "KEY=VALUE"),
    ],
)
def test_config_errors_are_one_clear_line(overrides, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        load_config(Config, None, overrides)


def test_train_cli_reports_config_errors_with_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nsteps = 'x'\n")
    result = subprocess.run(
        [sys.executable, "-m", "reinforge", "train", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "run.steps" in result.stderr
    assert "Traceback" not in result.stderr
    unknown_env = subprocess.run(
        [
            sys.executable,
            "-m",
            "reinforge",
            "train",
            "env.name=nosuchenv",
            "model.name=tiny-random",
            f"run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown_env.returncode == 2 and "unknown environment" in unknown_env.stderr


BROKEN_ENV = ROOT / "tests" / "data" / "broken_reward_env.py"


def _line_of(path: Path, text: str) -> int:
    """The number of the line of `path` that holds `text`."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_step_past_max_error_rate_stops_the_run_with_exit_3_naming_the_first_error(tmp_path):
    argv = tiny_train(tmp_path, f"env.name={BROKEN_ENV}")  # every reward raises
    result = run_here(argv)
    assert result.returncode == 3, result.stderr[-3000:]
    first = (
        "reward 'grade' raised KeyError: 'answer' "
        f"({BROKEN_ENV}:{_line_of(BROKEN_ENV, 'episode.state[')})"
    )
    assert f"step    1/2  first error: {first}" in result.stderr.splitlines()
    assert result.stderr.splitlines()[-1] == (
        "reinforge train: error: 8 of 8 rollouts of step 1 errored or timed out, more than "
        f"loop.max_error_rate = 0.1; the first: {first}"
    )
    assert "Traceback" not in result.stderr
    rows = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(r["step"], r["errored"], r["first_error"]) for r in rows] == [(1, 8, first)]


def test_a_reward_past_float32_is_an_error_and_a_step_within_max_error_rate_goes_on(tmp_path):
    """1e39 is finite in float64 and inf in the trainer's float32: one task's rewards are
    1e39, half of each step's rollouts, which `loop.max_error_rate = 0.5` allows."""
    argv = tiny_train(
        tmp_path,
        f"env.name={BROKEN_ENV}",
        'env.args.bad="1e39"',
        "env.args.broken=1",
        "loop.max_error_rate=0.5",
    )
    result = run_here(argv)
    assert result.returncode == 0, result.stderr[-3000:]
    first = (
        "reward 'grade' returned 1e+39, not a finite float32 number "
        f"({BROKEN_ENV}:{_line_of(BROKEN_ENV, 'def grade(')})"
    )
    lines = result.stderr.splitlines()
    assert f"step    1/2  first error: {first}" in lines
    assert f"step    2/2  first error: {first}" in lines
    rows = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(r["step"], r["errored"], r["trained_samples"]) for r in rows] == [(1, 4, 4), (2, 4, 4)]


def _train(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        tiny_train(run_dir, "run.steps=4", "run.checkpoint_every=2", *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _task_ids_by_step(run: Path) -> list[list[str]]:
    steps = sorted((run / "trajectories").glob("step_*.jsonl"))
    return [[json.loads(line)["task_id"] for line in p.read_text().splitlines()] for p in steps]


def test_a_killed_run_resumes_with_the_same_data_order(tmp_path):
    whole = _train(tmp_path / "whole")
    assert whole.wait(timeout=300) == 0, whole.stderr.read()

    killed_dir = tmp_path / "killed"
    killed = _train(killed_dir)
    metrics = killed_dir / "r" / "metrics.jsonl"
    kill_after(killed, metrics, 3)  # past the step-2 checkpoint, before the end

    again = _train(killed_dir)  # without --resume the run directory is not overwritten
    assert again.wait(timeout=120) == 2 and "--resume" in again.stderr.read()

    resumed = _train(killed_dir, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert _task_ids_by_step(killed_dir / "r") == _task_ids_by_step(tmp_path / "whole" / "r")
    whole_rows = (tmp_path / "whole" / "r" / "metrics.jsonl").read_text().splitlines()
    assert [r["policy_version"] for r in rows] == [
        json.loads(line)["policy_version"] for line in whole_rows
    ]
    assert [r["train"]["lr"] for r in rows] == [
        json.loads(line)["train"]["lr"] for line in whole_rows
    ]

    finished = _train(killed_dir, "--resume")
    assert finished.wait(timeout=300) == 2
    assert "has finished its 4 steps: nothing to resume" in finished.stderr.read()


def test_the_example_configs_validate():
    for path in (ROOT / "examples").glob("*.toml"):
        config = load_config(Config, path, [])
        load_environment(config.env.name, **config.env.args)
