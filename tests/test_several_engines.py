"""`engines.kind = "spawned"`, `engines.count = 2`: the run starts two `reinforge serve`
processes, routes its episodes over them, syncs the weights to both each step, and leaves
no engine behind, however it ends. Real processes and the tiny model throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch

from reinforge.config import Config, ServeConfig, load_config
from reinforge.errors import ConfigError, UsageError
from reinforge.orchestrate.config import SpawnedEngines
from reinforge.orchestrate.engine_processes import EngineProcesses, settings_toml
from reinforge.orchestrate.engines import open_engine
from reinforge.policy.models import load_model
from reinforge.train.trainer import Trainer

from .commands import ROOT, kill_after, run_here, tiny_train
from .conftest import require_vllm
from .test_remote_engine import assert_samples_with

TWO = ("engines.kind=spawned", "engines.count=2")
RELEASE_ENV = str(ROOT / "tests" / "data" / "release_env.py")


def holding(folder: Path) -> set[int]:
    """Processes with a file under `folder` open: an engine holds its log while it runs."""
    pids = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd).startswith(str(folder)):
                pids.add(int(fd.parts[2]))
        except OSError:
            continue
    return pids


def gone(folder: Path) -> bool:
    """Whether every process holding `folder` has exited (waiting a while for them)."""
    deadline = time.monotonic() + 60
    while holding(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not holding(folder)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["sync", "async", "partial"])
def test_a_run_samples_from_two_engines_and_syncs_both(tmp_path, mode):
    argv = tiny_train(tmp_path, "run.steps=3", *TWO, f"loop.mode={mode}")
    process = run_here(argv)
    assert process.returncode == 0, process.stderr
    run = tmp_path / "r"
    rows = _rows(run)
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert all(r["sync"]["engines"] == 2 and r["sync"]["bytes"] > 0 for r in rows)
    for engine in range(2):  # both took requests
        assert sum(r["engines"][engine]["requests"] for r in rows) > 0
    for step in (1, 2, 3):
        lines = (run / "trajectories" / f"step_{step:05d}.jsonl").read_text().splitlines()
        for versions in (json.loads(line)["policy_versions"] for line in lines):
            assert versions and all(v <= step - 1 for v in versions)
            assert versions == sorted(versions)  # a carried-over rollout only moves on
            if mode == "sync":  # sampled by the weights the step trains
                assert set(versions) == {step - 1}
            else:
                assert step - 1 - min(versions) <= 1  # loop.max_staleness
    assert not holding(run / "engines")


def test_a_run_samples_from_two_vllm_engines_and_syncs_both(tmp_path):
    require_vllm()
    argv = tiny_train(tmp_path, "model.engine=vllm", *TWO)
    process = run_here(argv)
    assert process.returncode == 0, process.stderr[-3000:]
    rows = _rows(tmp_path / "r")
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["sync"]["engines"] == 2 and r["sync"]["bytes"] > 0 for r in rows)
    for engine in range(2):
        assert sum(r["engines"][engine]["requests"] for r in rows) > 0
    for step in (1, 2):  # sync: every token sampled by the weights the step trains
        lines = (tmp_path / "r" / "trajectories" / f"step_{step:05d}.jsonl").read_text()
        assert all(
            set(json.loads(line)["policy_versions"]) == {step - 1} for line in lines.splitlines()
        )
    assert gone(tmp_path / "r" / "engines")


def test_the_main_job_runs_on_two_engines(tmp_path):
    # Nothing trains (a random model never answers arithmetic), so this is sampling only.
    argv = [sys.executable, "-m", "reinforge", "train", str(ROOT / "examples" / "arithmetic.toml"),
            "model.name=tiny-random", "run.steps=3", *TWO,
            f"run.dir={tmp_path}", "run.name=r"]  # fmt: skip
    process = run_here(argv)
    assert process.returncode == 0, process.stderr
    rows = _rows(tmp_path / "r")
    assert len(rows) == 3 and all(sum(e["requests"] for e in r["engines"]) > 0 for r in rows)
    assert not holding(tmp_path / "r" / "engines")


def test_a_killed_run_leaves_no_engine(tmp_path):
    argv = tiny_train(tmp_path, "run.steps=50", *TWO)
    killed = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_after(killed, tmp_path / "r" / "metrics.jsonl", 1)  # SIGKILL: no cleanup of its own
    assert gone(tmp_path / "r" / "engines")


def _until_said(run: subprocess.Popen[str], line: str) -> str:
    """The run's stderr up to and with the first line holding `line` (or to its end)."""
    assert run.stderr is not None
    said = ""
    for text in run.stderr:
        said += text
        if line in text:
            break
    return said


def _kill_engine_once_stepped(run: subprocess.Popen[str], folder: Path, index: int) -> None:
    """SIGKILL engine `index` of the run writing `folder` once its first step is recorded:
    the next step's rollouts are in flight then."""
    metrics = folder / "metrics.jsonl"
    while run.poll() is None and not (metrics.exists() and metrics.read_text()):
        time.sleep(0.1)
    (engine,) = holding(folder / "engines" / f"engine-{index}.log")
    os.kill(engine, signal.SIGKILL)


@pytest.mark.parametrize("transport", ["file", "broadcast"])
def test_an_engine_killed_mid_run_is_restarted_and_no_rollout_fails(tmp_path, transport):
    # Steps 3 and 4 wait for `release`, made once the run has said it restarts the engine:
    # a tiny model's steps could otherwise all end before its supervisor looks again.
    release = tmp_path / "release"
    env = [f"env.name={RELEASE_ENV}", f"env.args.release={str(release)!r}"]
    argv = tiny_train(tmp_path, "run.steps=4", *TWO, *env, f"engines.weight_sync={transport}")
    run = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    folder = tmp_path / "r"
    _kill_engine_once_stepped(run, folder, 1)
    said = "reinforge: engine 1 exited with code -9; restarting it (1 of at most 3"
    unsaid = threading.Timer(300, release.touch)  # never said: the run ends, the test fails
    unsaid.start()
    stderr = _until_said(run, said)
    release.touch()
    unsaid.cancel()
    stderr += run.communicate(timeout=600)[1]
    assert run.returncode == 0, stderr
    assert said in stderr
    rows = _rows(folder)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["restarts"] for r in rows) == 1
    for step in (1, 2, 3, 4):  # every rollout finished, on the weights its step trains
        lines = (folder / "trajectories" / f"step_{step:05d}.jsonl").read_text().splitlines()
        for rollout in map(json.loads, lines):
            assert rollout["status"] != "error", rollout["error"]
            assert set(rollout["policy_versions"]) == {step - 1}
    assert gone(folder / "engines")


def test_an_engine_that_dies_past_the_bound_stops_the_run_in_one_line(tmp_path):
    argv = tiny_train(tmp_path, "run.steps=50", *TWO, "engines.restarts=0")
    run = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    _kill_engine_once_stepped(run, tmp_path / "r", 1)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 2, stderr
    assert "engine 1 exited with code -9 after 0 restarts" in stderr
    assert "(engines.restarts = 0): stopping the run" in stderr
    assert "Traceback" not in stderr
    assert gone(tmp_path / "r" / "engines")


async def test_after_a_sync_both_engines_sample_the_pushed_weights(tmp_path):
    config = load_config(Config, None, ["model.name=tiny-random", *TWO, f"run.dir={tmp_path}"])
    model, tokenizer = load_model("tiny-random")
    trainer = Trainer(model, config.trainer, config.optim, total_steps=1)
    engine = await open_engine(config, trainer, tokenizer, version=0)
    try:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
        engine.sync.push(trainer, 5)
        assert engine.version == 5
        for url in engine.sync.urls:
            assert_samples_with(url, model, 5)
    finally:
        await engine.aclose()
    assert not holding(tmp_path / "run" / "engines")


async def test_an_engine_that_cannot_start_is_one_line_and_leaves_none_behind(tmp_path):
    missing = tmp_path / "no-model"
    overrides = [f"model.name={missing}", f"run.dir={tmp_path}"]
    config = load_config(Config, None, overrides)
    expected = "engine 0 .reinforge serve. exited with code 2 before it answered: reinforge serve"
    with pytest.raises(UsageError, match=expected) as raised:
        await EngineProcesses.start(config, SpawnedEngines(count=2))
    assert f"unknown model '{missing}'" in str(raised.value)
    assert not holding(tmp_path / "run" / "engines")


def test_each_engine_serves_the_runs_settings(tmp_path):
    overrides = ["model.name=tiny-random", "engine.dtype=bfloat16", "engine.vllm.compile=true",
                 "rollout.sampling.temperature=0.7", *TWO]  # fmt: skip
    config = load_config(Config, None, overrides)
    wanted = EngineProcesses([1, 2], tmp_path, config, SpawnedEngines()).serve
    assert ServeConfig.model_validate(tomllib.loads(settings_toml(wanted))) == wanted
    assert wanted.engine == config.engine and wanted.server.sampling.temperature == 0.7


def test_a_served_engine_takes_no_count():
    served = ["engines.kind=served", "engines.url=http://x:1/v1", "engines.count=2"]
    with pytest.raises(ConfigError) as refused:
        load_config(Config, None, served)
    assert str(refused.value) == (
        'config engines.count: a key of engines.kind = "spawned", not of "served"'
    )
