"""Runs that stop and resume cleanly: Ctrl-C in a step's rollouts or in its training, a run
killed before its first checkpoint, a metrics file cut mid-line, `--overwrite`; and a run
that trains nothing says so. Real `reinforge train` subprocesses on the tiny model."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from reinforge.config import Config, load_config
from reinforge.errors import Interrupted, UsageError
from reinforge.orchestrate import loop as training_loop
from reinforge.orchestrate.loop import train
from reinforge.train.checkpoints import load_progress, open_run

from .commands import LENGTH_ENV, ROOT, kill_after, tiny_train

HELD_ENV = str(ROOT / "tests" / "data" / "held_env.py")
UNIFORM_ENV = str(ROOT / "tests" / "data" / "uniform_env.py")


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(run: Path) -> list[str]:
    return sorted(path.name for path in (run / "checkpoints").iterdir())


def _interrupted(
    args: list[str], cue: Callable[[str], bool], sent: signal.Signals = signal.SIGINT
) -> str:
    """Run `reinforge *args` in its own process group, press Ctrl-C there (SIGINT to the
    group, as a terminal does; or `sent`, SIGTERM as a scheduler does) at the first stderr
    line that `cue` accepts, and return its stderr once it has exited with 128 + `sent`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "reinforge", *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if cue(line):
                os.killpg(process.pid, sent)
                break
        stderr = process.stderr.read()
        assert process.wait(timeout=120) == 128 + sent, stderr
        return stderr
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_ctrl_c_abandons_the_step_in_flight_saves_the_last_and_says_how_to_resume(tmp_path):
    # steps after the first hold their rollouts until cancelled: Ctrl-C lands in step 2's
    args = tiny_train(tmp_path, f"env.name={HELD_ENV}", "run.steps=4")[3:]  # after -m reinforge
    stderr = _interrupted(args, lambda line: line.startswith("step    1/4  reward"))
    (said,) = [line for line in stderr.splitlines() if "interrupted" in line]
    resume = f"reinforge {shlex.join([*args, '--resume'])}"
    assert said == (
        "reinforge train: interrupted: step 2 abandoned, its rollouts discarded; "
        f"checkpoint of step 1 saved; resume with: {resume}"
    )
    run = tmp_path / "r"
    assert _steps(run) == [1] and _checkpoints(run) == ["step_00001"]  # checkpoint_every 10

    # as it says, with the rollouts no longer held
    again = [sys.executable, "-m", *shlex.split(resume), "env.args.hold=false"]
    resumed = subprocess.run(again, cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["policy_version"]) for row in rows] == [(s, s) for s in (1, 2, 3, 4)]


def test_sigterm_to_a_sandboxed_run_stops_it_as_ctrl_c_does(tmp_path):
    """A scheduler's SIGTERM, to every process of the job: the step in flight is abandoned,
    the last one saved, the line says so and how to resume, exit 143. The sandbox pool,
    which on its own cleans up and dies on SIGTERM, leaves it to the command."""
    coding = ["env.name=coding", "env.args.split=train", 'env.args.tiers=["easy"]']
    coding += ["env.max_turns=1", "env.max_tokens_per_turn=8", "rollout.rollouts_per_task=2"]
    args = tiny_train(tmp_path, *coding, "run.steps=50", "run.checkpoint_every=100")[3:]
    stderr = _interrupted(args, lambda line: line.startswith("step    1/50"), signal.SIGTERM)
    (said,) = [line for line in stderr.splitlines() if "terminated" in line]
    assert said.startswith("reinforge train: terminated: step ")
    assert f"resume with: reinforge {shlex.join([*args, '--resume'])}" in said
    run = tmp_path / "r"
    done = _steps(run)
    assert done and _checkpoints(run) == [f"step_{done[-1]:05d}"]


def test_ctrl_c_before_the_first_checkpoint_says_so_and_the_run_resumes_from_step_0(tmp_path):
    args = tiny_train(tmp_path, f"env.name={HELD_ENV}", "env.args.hold_first=true")[3:]
    stderr = _interrupted(args, lambda line: line == "holding\n")  # step 1 in flight
    (said,) = [line for line in stderr.splitlines() if "interrupted" in line]
    resume = f"reinforge {shlex.join([*args, '--resume'])}"
    assert said == (
        "reinforge train: interrupted: step 1 abandoned, its rollouts discarded; "
        f"no step done, nothing to save; resume with: {resume}"
    )
    run = tmp_path / "r"
    assert (run / "metrics.jsonl").read_text() == "" and not (run / "checkpoints").exists()

    # as it says, with the rollouts no longer held: from step 0, as no checkpoint was due
    again = [sys.executable, "-m", *shlex.split(resume), "env.args.hold=false"]
    resumed = subprocess.run(again, cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"no checkpoint in {run}: the run starts from step 0" in resumed.stderr
    assert _steps(run) == [1, 2] and _checkpoints(run) == ["step_00002"]


def test_ctrl_c_while_a_step_trains_lets_it_finish_and_checkpoints_it(tmp_path, monkeypatch):
    config = load_config(
        Config,
        None,
        ["model.name=tiny-random", f"env.name={LENGTH_ENV}", f"run.dir={tmp_path}",
         "run.name=r", "run.steps=3", "rollout.tasks_per_step=2"],
    )  # fmt: skip
    train_and_sync = training_loop.train_and_sync

    async def interrupted_while_training() -> None:
        run = asyncio.current_task()
        assert run is not None
        loop = asyncio.get_running_loop()

        def interrupt_then_train(engine, trainer, batch):  # in the training thread
            loop.call_soon_threadsafe(run.cancel)  # what asyncio.run does on Ctrl-C
            return train_and_sync(engine, trainer, batch)

        monkeypatch.setattr(training_loop, "train_and_sync", interrupt_then_train)
        await train(config, lambda metrics: None)

    with pytest.raises(Interrupted) as stopped:
        asyncio.run(interrupted_while_training())
    assert str(stopped.value) == "step 1 finished, as it was training; checkpoint of step 1 saved"
    run = tmp_path / "r"
    assert _steps(run) == [1] and _checkpoints(run) == ["step_00001"]
    state = load_progress(run / "checkpoints" / "step_00001")
    assert state["step"] == 1 and state["policy_version"] == 1


def test_a_run_killed_before_its_first_checkpoint_resumes_from_step_0(tmp_path):
    argv = tiny_train(tmp_path, "run.steps=4")  # its first checkpoint: the last step
    run = tmp_path / "r"
    killed = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.DEVNULL)
    kill_after(killed, run / "metrics.jsonl", 1)
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"tasks": 2, "rollouts": 8, "sco')  # step 2's line, cut by a full disk

    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 2
    assert "already holds a run: pass --resume to continue it, --overwrite" in again.stderr

    resumed = subprocess.run([*argv, "--resume"], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"no checkpoint in {run}: the run starts from step 0" in resumed.stderr
    assert f"{run / 'metrics.jsonl'}: dropped its last line, cut short mid-write" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert _steps(run) == [1, 2, 3, 4] and _checkpoints(run) == ["step_00004"]

    over = subprocess.run([*argv, "run.steps=2", "--overwrite"], cwd=ROOT, capture_output=True)
    assert over.returncode == 0, over.stderr
    assert _steps(run) == [1, 2] and _checkpoints(run) == ["step_00002"]
    assert sorted(p.name for p in (run / "trajectories").iterdir()) == [
        "step_00001.jsonl",
        "step_00002.jsonl",
    ]


def test_a_resumed_run_drops_the_cut_line_and_what_the_steps_after_its_checkpoint_wrote(
    tmp_path, caplog
):
    lines = [json.dumps({"step": step}) for step in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "rew')
    (tmp_path / "trajectories").mkdir()
    for step in (1, 2, 3, 4):
        (tmp_path / "trajectories" / f"step_{step:05d}.jsonl").write_text('{"task_id": "a"')
    with caplog.at_level(logging.WARNING):
        open_run(tmp_path, "{}", start_step=2, resume=True, overwrite=False).close()
    assert _steps(tmp_path) == [1, 2]
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == [
        "step_00001.jsonl",
        "step_00002.jsonl",
    ]
    assert caplog.messages == [
        f"{tmp_path / 'metrics.jsonl'}: dropped its last line, cut short mid-write"
    ]

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "rew\n{"step": 2}\n')
    with pytest.raises(UsageError, match="metrics.jsonl: line 1 is not a metrics record"):
        open_run(tmp_path, "{}", start_step=2, resume=True, overwrite=False)


def test_overwrite_deletes_only_what_a_run_wrote(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoints" / "step_00001").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="--overwrite to delete it and start over"):
        open_run(tmp_path, "{}", start_step=0, resume=False, overwrite=False)
    open_run(tmp_path, "{}", start_step=0, resume=False, overwrite=True).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "metrics.jsonl",
        "notes.txt",
    ]
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_a_run_that_trains_nothing_says_so_once_and_counts_it_at_the_end(tmp_path):
    argv = tiny_train(tmp_path, f"env.name={UNIFORM_ENV}", "env.args.varying=0", "run.steps=3")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert warnings == [
        "warning: step 1 trained nothing: every group's rewards were equal (zero variance), "
        "so no rollout was better than another; try an SFT warm-up (reinforge sft), more "
        "rollouts per task (rollout.rollouts_per_task), or a graded reward that gives "
        "partial credit"
    ]
    assert lines[-1] == "3 of 3 steps trained nothing (every group's rewards were equal)"
