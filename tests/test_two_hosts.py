"""A run across two hosts, on two Ray nodes of this machine that stand in for them
(`tests/twohosts.py`): what one host writes in its memory the other does not see, so a
weight file handed over by its path would not be found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from .commands import ROOT, tiny_train
from .conftest import require_extra
from .twohosts import TwoHosts, created, two_hosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[TwoHosts]:
    require_extra("ray", "ray")
    with two_hosts() as started:
        yield started


ON_B = """
import os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(resources={"host_b": 1})
def write() -> str:
    open("/dev/shm/reinforge-two-hosts-probe", "w").close()
    return ray.util.get_node_ip_address()
print(ray.get(write.remote()))
"""


def test_host_b_is_its_own_node_with_its_own_memory(hosts):
    done = subprocess.run(
        hosts.on_a([sys.executable, "-c", ON_B, hosts.address]),
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "127.0.0.2"
    assert (hosts.b.shm / "reinforge-two-hosts-probe").exists()
    if not hosts.isolated:
        pytest.skip("this machine gives its nodes no /dev/shm of their own (needs root)")
    assert not (hosts.a.shm / "reinforge-two-hosts-probe").exists()
    assert os.stat(hosts.b.shm).st_dev not in {
        os.stat("/dev/shm").st_dev,
        os.stat(hosts.a.shm).st_dev,
    }


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_sampled_by(trajectory: dict, model: torch.nn.Module) -> None:
    """The log-probs an engine recorded for a trajectory's sampled tokens are a plain
    forward of `model` over the whole trajectory."""
    ids = torch.tensor([trajectory["token_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    sampled = [i for i, m in enumerate(trajectory["loss_mask"]) if m]
    expected = torch.stack([logp[i - 1, trajectory["token_ids"][i]] for i in sampled])
    recorded = torch.tensor(trajectory["logprobs"])
    assert torch.allclose(recorded, expected, atol=1e-5), (recorded - expected).abs().max()


@pytest.mark.timeout(1800)
def test_engines_on_host_b_sample_the_trainers_weights_through_the_object_store(hosts, tmp_path):
    """The trainer on host A, two engines pinned to host B: every step syncs both through
    Ray's object store, each actor writing the weights in host B's own memory; the run
    reaches the engines at host B's address; and what they sampled is the trainer's
    checkpointed policy."""
    argv = tiny_train(
        tmp_path,
        "run.steps=3",
        "run.checkpoint_every=1",
        "cluster.backend=ray",
        f'cluster.address="{hosts.address}"',
        "engines.kind=spawned",
        "engines.count=2",
        "engines.resources.custom={host_b=1}",
        "engines.weight_sync=object_store",
    )
    with created(hosts.a.shm) as on_a, created(hosts.b.shm) as on_b:
        done = subprocess.run(
            hosts.on_a(argv), cwd=ROOT, capture_output=True, text=True, timeout=1500
        )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "r"
    rows = _rows(run)
    assert [row["policy_version"] for row in rows] == [1, 2, 3]
    assert all(row["sync"]["engines"] == 2 for row in rows)
    for engine in range(2):  # listening at host B's address alone, reached there
        log = (run / "engines" / f"engine-{engine}.log").read_text()
        assert "Uvicorn running on http://127.0.0.2:" in log, log[-2000:]
        assert sum(row["engines"][engine]["requests"] for row in rows) > 0

    # step 3 sampled with the weights of step 2, which the trainer checkpointed
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00002")
    lines = (run / "trajectories" / "step_00003.jsonl").read_text().splitlines()
    assert lines
    for trajectory in map(json.loads, lines):
        assert set(trajectory["policy_versions"]) == {2}
        _assert_sampled_by(trajectory, model)

    weights_on_b = [name for name in on_b if name.startswith("reinforge-weights-")]
    assert len(weights_on_b) >= 2 * 3  # each engine's actor, each step, in host B's memory
    if hosts.isolated:  # host A wrote no weight file, and host B's memory is not host A's
        assert not [name for name in on_a if name.startswith("reinforge-weights-")]
        assert os.stat(hosts.a.shm).st_dev != os.stat(hosts.b.shm).st_dev


def _watching_ranks(hosts: TwoHosts, argv: list[str], logs: Path) -> tuple[int, str, set[str]]:
    """`argv` run on host A to its end: its exit code, its stderr, and the hosts ("a",
    "b") on which a trainer rank's actor was seen running meanwhile."""
    seen: set[str] = set()
    with (logs / "out.log").open("w") as out, (logs / "err.log").open("w") as err:
        process = subprocess.Popen(hosts.on_a(argv), cwd=ROOT, stdout=out, stderr=err)
        deadline = time.monotonic() + 1500
        while process.poll() is None and time.monotonic() < deadline:
            seen |= {name for name, host in (("a", hosts.a), ("b", hosts.b))
                     if host.processes("RankActor")}  # fmt: skip
            time.sleep(0.5)
        if process.poll() is None:
            process.kill()
        process.wait()
    return process.returncode, (logs / "err.log").read_text(), seen


def _why(err: str, run: Path) -> str:
    """A failed run's stderr, and its first engine's log."""
    log = run / "engines" / "engine-0.log"
    return err[-3000:] + (log.read_text()[-3000:] if log.exists() else "")


@pytest.mark.timeout(1800)
def test_trainer_ranks_on_host_b_train_checkpoint_and_resume_without_the_run_directory(
    hosts, tmp_path
):
    """Both ranks of a sharded trainer pinned to host B, the driver and its engine on host
    A, the run directory in host A's own memory where host B cannot see it: rank 0 sends
    the weights and each checkpoint's model to the driver, which writes them, and on
    `--resume` the driver reads the checkpoint and sends it to the ranks, which go on from
    it: the engine samples step 3 with the step-2 checkpoint's weights."""
    name = f"rf-ranks-{os.getpid()}"
    run_dir = Path("/dev/shm", name) if hosts.isolated else tmp_path / name
    # as this process sees it; host A's /dev/shm goes with the fixture
    seen_at = hosts.a.shm / name if hosts.isolated else run_dir
    common = [
        "run.checkpoint_every=1",
        "cluster.backend=ray",
        f'cluster.address="{hosts.address}"',
        "trainer.world_size=2",
        "cluster.rank.custom={host_b=1}",
        "engines.kind=spawned",
        "engines.count=1",
        "engines.resources.custom={host_a=1}",  # the file transport: the driver's node
    ]
    code, err, seen = _watching_ranks(hosts, tiny_train(run_dir, "run.steps=2", *common), tmp_path)
    assert code == 0, _why(err, seen_at / "r")
    assert seen == {"b"}
    code, err, seen = _watching_ranks(
        hosts, tiny_train(run_dir, "run.steps=3", *common, "--resume"), tmp_path
    )
    assert code == 0, _why(err, seen_at / "r")
    assert seen == {"b"}

    run = seen_at / "r"
    assert [row["policy_version"] for row in _rows(run)] == [1, 2, 3]
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00002")
    lines = (run / "trajectories" / "step_00003.jsonl").read_text().splitlines()
    assert lines
    for trajectory in map(json.loads, lines):  # the resumed ranks' first push
        assert set(trajectory["policy_versions"]) == {2}
        _assert_sampled_by(trajectory, model)
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00003")

    if not hosts.isolated:
        pytest.skip("this machine gives its nodes no /dev/shm of their own (needs root)")
    assert not (hosts.b.shm / name).exists()  # nothing was written by its path on B


@pytest.mark.timeout(1800)
def test_a_rank_on_each_host_trains_as_one_trainer(hosts, tmp_path):
    """Two ranks, one per host (each asks for the one `rank_slot` a host offers), their
    collectives across the hosts; the engine on host B takes rank 0's weights, wherever
    rank 0 runs, through the object store: step 2 samples the step-1 checkpoint."""
    argv = tiny_train(
        tmp_path,
        "run.checkpoint_every=1",
        "cluster.backend=ray",
        f'cluster.address="{hosts.address}"',
        "trainer.world_size=2",
        "cluster.rank.custom={rank_slot=1}",
        "engines.kind=spawned",
        "engines.count=1",
        "engines.resources.custom={host_b=1}",
        "engines.weight_sync=object_store",
    )
    code, err, seen = _watching_ranks(hosts, argv, tmp_path)
    assert code == 0, _why(err, tmp_path / "r")
    assert seen == {"a", "b"}
    run = tmp_path / "r"
    assert [row["policy_version"] for row in _rows(run)] == [1, 2]
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00001")
    lines = (run / "trajectories" / "step_00002.jsonl").read_text().splitlines()
    assert lines
    for trajectory in map(json.loads, lines):
        assert set(trajectory["policy_versions"]) == {1}
        _assert_sampled_by(trajectory, model)
