"""A run over several processes, as a user starts it: a sharded trainer (two gloo ranks)
with the run's own engines, on this machine and on a local Ray cluster that the run starts
and stops; a checkpoint of two ranks resumed on one; a trainer rank killed mid-run stops
the run in one line, leaves no process, and `--resume` goes on from the last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from reinforge.config import Config, load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.ray_cluster import hidden_gpus

from .commands import ROOT, tiny_train
from .conftest import require_extra
from .test_several_engines import gone
from .twohosts import session


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _node_logs(run: Path) -> list[Path]:
    """The logs that the Ray run writing `run` left on its engines' node (this machine's
    temp folder): each found by its copy in the run's directory."""
    copies = {log.read_bytes() for log in (run / "engines").glob("engine-*.log")}
    kept = Path(tempfile.gettempdir()).glob("reinforge-engine-*/engine-*.log")
    return [log for log in kept if log.read_bytes() in copies]


def _train(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_a_sharded_run_on_a_local_ray_cluster_leaves_no_ray_process(tmp_path):
    """Its Ray cluster's daemons and workers stay in the session of the run's process, as
    every process it starts does: none of the session is left once the run ended (others'
    clusters, of other tests, may run meanwhile)."""
    require_extra("ray", "ray")
    argv = tiny_train(
        tmp_path,
        "run.steps=3",
        "cluster.backend=ray",
        "engines.kind=spawned",
        "engines.count=2",
        "trainer.world_size=2",
    )
    run = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    _, stderr = run.communicate(timeout=900)
    assert run.returncode == 0, stderr[-3000:]
    rows = _rows(tmp_path / "r")
    assert [row["policy_version"] for row in rows] == [1, 2, 3]  # each step trained
    assert all(row["sync"]["engines"] == 2 for row in rows)
    assert sum(engine["requests"] for row in rows for engine in row["engines"]) > 0
    AutoModelForCausalLM.from_pretrained(tmp_path / "r" / "checkpoints" / "step_00003")
    copies = list((tmp_path / "r" / "engines").glob("engine-*.log"))
    assert len(copies) == 2  # whole, with the engines' last words; then gone from the node
    assert all("Finished server process" in copy.read_text() for copy in copies)
    assert not _node_logs(tmp_path / "r")
    deadline = time.monotonic() + 60  # the cluster's daemons take a moment to exit
    while session(run.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not session(run.pid)


def test_a_run_of_two_ranks_resumes_on_one(tmp_path):
    done = _train(tiny_train(tmp_path, "trainer.world_size=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["policy_version"] for row in _rows(tmp_path / "r")] == [1, 2]
    done = _train(tiny_train(tmp_path, "run.steps=3", "--resume"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["policy_version"] for row in _rows(tmp_path / "r")] == [1, 2, 3]


def _ranks_of(pid: int) -> list[int]:
    """The trainer rank processes a run started (spawned children, not its engines)."""
    ranks = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and b"spawn_main" in cmdline:
            ranks.append(int(stat.parts[2]))
    return sorted(ranks)


def test_a_rank_killed_mid_run_stops_it_in_one_line_and_resume_goes_on(tmp_path):
    argv = tiny_train(tmp_path, "run.steps=4", "run.checkpoint_every=1", "trainer.world_size=2")
    run = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    metrics = tmp_path / "r" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while run.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().count("\n") >= 2:
            break
        time.sleep(0.1)
    ranks = _ranks_of(run.pid)
    assert len(ranks) == 2
    os.kill(ranks[-1], signal.SIGKILL)
    _, stderr = run.communicate(timeout=600)
    assert run.returncode == 2, stderr[-3000:]
    assert "reinforge train: error: trainer rank " in stderr
    assert "Traceback" not in stderr
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks)
    assert gone(tmp_path / "r" / "engines")

    done = _train(tiny_train(tmp_path, "run.steps=4", "trainer.world_size=2", "--resume"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["step"] for row in _rows(tmp_path / "r")][-1] == 4


def test_a_ray_cluster_with_gpus_refuses_processes_that_ask_for_none():
    """Ray hides the GPUs from an actor that asks for none: such a run would train and
    decode on CPUs without a word."""
    config = load_config(Config, None, ["cluster.backend=ray", "trainer.world_size=2"])
    line = hidden_gpus(config, 8.0)
    assert line is not None and "\n" not in line
    assert "cluster.rank.gpus and engines.resources.gpus = 0" in line
    spawned = ["engines.kind=spawned", "engines.count=2"]
    asked = ["cluster.rank.gpus=1", "engines.kind=spawned", "engines.resources.gpus=0.5"]
    assert hidden_gpus(load_config(Config, None, [*asked, "trainer.world_size=2"]), 8.0) is None
    engines = load_config(Config, None, ["cluster.backend=ray", *spawned])
    assert hidden_gpus(engines, 8.0).endswith(  # type: ignore[union-attr]
        'set engines.resources.gpus = 1, or model.device = "cpu" for CPUs'
    )
    on_cpus = load_config(Config, None, [*spawned, 'model.device="cpu"'])
    assert hidden_gpus(on_cpus, 8.0) is None
    assert hidden_gpus(config, 0.0) is None  # a cluster of CPUs
    one_process = load_config(Config, None, ["cluster.backend=ray"])
    assert hidden_gpus(one_process, 8.0) is None  # trainer and engine in the driver: no actor


def test_custom_resources_are_rays_and_custom():
    """They say where a process goes: processes of this machine have nowhere else to go."""
    pinned = ["engines.kind=spawned", "engines.resources.custom={host_b=1}"]
    config = load_config(Config, None, ["cluster.backend=ray", *pinned])
    assert config.engines.resources.custom == {"host_b": 1.0}  # type: ignore[union-attr]
    with pytest.raises(
        ConfigError, match='engines.resources.custom .* needs cluster.backend = "ray"$'
    ):
        load_config(Config, None, pinned)
    with pytest.raises(ConfigError, match="cluster.rank.custom: GPU is not custom"):
        load_config(Config, None, ["cluster.backend=ray", "cluster.rank.custom={GPU=1}"])
    with pytest.raises(ConfigError, match="x = 0: ask for more than 0"):
        load_config(Config, None, ["cluster.backend=ray", "cluster.rank.custom={x=0}"])
