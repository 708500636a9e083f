"""A run across two hosts, on two Ray nodes of this machine that stand in for them
(`tests/twohosts.py`): what one host writes in its memory the other does not see, so a
weight file handed over by its path would not be found."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from .commands import ROOT, tiny_train
from .conftest import require_extra
from .test_several_engines import RELEASE_ENV, holding
from .twohosts import Host, TwoHosts, created, two_hosts

pytestmark = pytest.mark.xdist_group("two_hosts")  # on one worker, which starts `hosts` once


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
@pytest.mark.parametrize("transport", ["object_store", "broadcast"])
def test_engines_on_host_b_sample_the_trainers_weights(hosts, tmp_path, transport):
    """The trainer on host A, two engines pinned to host B: every step syncs both, through
    Ray's object store (each actor writing the weights in host B's own memory) or as a
    broadcast over a gloo group whose store listens on host A's address and whose engines'
    ends are on host B's; the run reaches the engines at host B's address, and pauses and
    resumes them around each step through their actors (partial mode, whose bound of 0
    keeps every step on-policy); and what they sampled is the trainer's checkpointed
    policy."""
    argv = tiny_train(
        tmp_path,
        "run.steps=3",
        "loop.mode=partial",
        "loop.max_staleness=0",
        "run.checkpoint_every=1",
        "cluster.backend=ray",
        f'cluster.address="{hosts.address}"',
        "engines.kind=spawned",
        "engines.count=2",
        "engines.resources.custom={host_b=1}",
        f"engines.weight_sync={transport}",
    )
    with created(hosts.a.shm) as on_a, created(hosts.b.shm) as on_b, created(hosts.b.tmp) as tmp:
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
        assert "Finished server process" in log  # copied whole, as its engine stopped
    # written in host B's temp folder, then deleted there once copied to host A
    logs_on_b = [name for name in tmp if name.startswith("reinforge-engine-")]
    assert len(logs_on_b) == 2
    assert not [name for name in logs_on_b if (hosts.b.tmp / name).exists()]

    # step 3 sampled with the weights of step 2, which the trainer checkpointed
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00002")
    lines = (run / "trajectories" / "step_00003.jsonl").read_text().splitlines()
    assert lines
    for trajectory in map(json.loads, lines):
        assert set(trajectory["policy_versions"]) == {2}
        _assert_sampled_by(trajectory, model)

    # no weight file on host B either: each engine's actor lays the buckets it took from
    # host B's store in a memory file of its own (the object store), or they come over the
    # group (the broadcast)
    assert not [name for name in on_b if name.startswith("reinforge-weights-")]
    if hosts.isolated:  # host A wrote no weight file, and host B's memory is not host A's
        assert not [name for name in on_a if name.startswith("reinforge-weights-")]
        assert os.stat(hosts.a.shm).st_dev != os.stat(hosts.b.shm).st_dev


def _engine_logs(
    host: Host, index: int, run: Path, process: subprocess.Popen[str] | None = None
) -> list[Path]:
    """The logs that `host` keeps of engine `index` of the run writing `run` (by
    `process`, where it still runs)."""
    port = _port(run / "engines" / f"engine-{index}.log", process)
    listening = f"Uvicorn running on http://{host.ip}:{port} "
    logs = host.tmp.glob(f"reinforge-engine-*/engine-{index}.log")
    return [log for log in logs if listening in log.read_text()]


def _port(log: Path, run: subprocess.Popen[str] | None = None) -> int:
    """The port an engine's log says it listens at, waiting for the log to say it (while
    `run`, where given, goes on)."""
    while "Uvicorn running on http://" not in (text := log.read_text() if log.exists() else ""):
        if run is not None and run.poll() is not None:
            raise AssertionError(f"the run ended first: {run.communicate()[1][-3000:]}")
        time.sleep(0.2)
    return int(text.split("Uvicorn running on http://")[1].split()[0].rsplit(":", 1)[1])


def _stepped(run: subprocess.Popen[str], folder: Path) -> None:
    """Until the run writing `folder` has recorded its first step (or ended)."""
    metrics = folder / "metrics.jsonl"
    while run.poll() is None and not (metrics.exists() and metrics.read_text()):
        time.sleep(0.2)


def _said_twice(log: Path, line: str, run: subprocess.Popen[str]) -> bool:
    """Until `log` holds `line` twice; False if the run ends first."""
    while run.poll() is None:
        if log.exists() and log.read_text().count(line) >= 2:
            return True
        time.sleep(0.2)
    return False


LOST = (  # either engine of host B: whichever supervisor notices first
    r"reinforge: engine [01] (died with|could not be reached through|did not answer through) "
    r"its Ray actor on node "
)
"""The supervisor's line for an engine lost with its actor, up to its node's address."""


def _held_run_on_b(hosts: TwoHosts, tmp_path: Path, release: Path) -> list[str]:
    """Four steps with two engines on host B through the object store; steps past the
    second wait until `release` exists."""
    return tiny_train(
        tmp_path,
        "run.steps=4",
        "cluster.backend=ray",
        f'cluster.address="{hosts.address}"',
        "engines.kind=spawned",
        "engines.count=2",
        "engines.resources.custom={host_b=1}",
        "engines.weight_sync=object_store",
        f"env.name={RELEASE_ENV}",
        f"env.args.release={str(release)!r}",
    )


@pytest.mark.timeout(1800)
def test_an_engine_killed_on_host_b_comes_back_and_catches_up_from_the_object_store(
    hosts, tmp_path
):
    """SIGKILL of engine 0's process on host B once step 1 is recorded: its actor starts it
    again at its port, it takes the last push from the object store, and the later steps
    sync both engines. Its log, kept on host B, reaches the run's directory as it grows:
    the restart is seen there, while the run goes on. Steps past the second wait for it
    (`release`)."""
    release = tmp_path / "release"
    argv = _held_run_on_b(hosts, tmp_path, release)
    run = subprocess.Popen(
        hosts.on_a(argv), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    unsaid = threading.Timer(900, release.touch)  # never restarted: the run ends, the test fails
    unsaid.start()
    try:
        folder = tmp_path / "r"
        _stepped(run, folder)
        logs = _engine_logs(hosts.b, 0, folder, run)  # of this run: the one its engine holds
        (engine,) = {pid for log in logs for pid in holding(log)} & hosts.b.processes()
        os.kill(engine, signal.SIGKILL)
        copy = folder / "engines" / "engine-0.log"
        port = _port(copy, run)
        came_back = _said_twice(copy, f"Uvicorn running on http://127.0.0.2:{port} ", run)
        release.touch()
        _, stderr = run.communicate(timeout=1200)
    finally:
        unsaid.cancel()
        run.kill()
    assert run.returncode == 0, stderr[-3000:]
    assert came_back  # at its port, seen in the copy while the run went on
    assert "reinforge: engine 0 exited with code -9; restarting it (1 of at most 3" in stderr
    rows = _rows(folder)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert sum(row["restarts"] for row in rows) == 1
    assert rows[-1]["sync"]["engines"] == 2  # engine 0 caught up, and takes pushes again
    assert rows[-1]["engines"][0]["requests"] > 0
    for step in (3, 4):  # sampled after the restart, on the weights their steps train
        lines = (folder / "trajectories" / f"step_{step:05d}.jsonl").read_text().splitlines()
        for rollout in map(json.loads, lines):
            assert rollout["status"] != "error", rollout["error"]
            assert set(rollout["policy_versions"]) == {step - 1}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_losing_host_b_ends_the_run_in_one_line(tmp_path, fault):
    """Host B lost once step 1 is recorded: every process of it killed at once, or stopped
    (SIGSTOP), a host that hangs rather than dies, whose engines take connections and never
    answer and whose actors and node say nothing. Either way the run ends with one line
    naming the engine and host B, and exit code 2, not a hang: the bound is the
    subprocess's timeout. Its own two hosts: this one loses B (a frozen B is let go, with
    SIGCONT, before the fixture stops it). Steps past the second never start (`release` is
    never made), so the run cannot end by finishing."""
    require_extra("ray", "ray")
    with two_hosts() as hosts:
        argv = _held_run_on_b(hosts, tmp_path, tmp_path / "release")
        returncode, stderr = _losing_host_b(hosts, argv, tmp_path, fault)
    assert returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    # the supervisor says the engine went with its actor and node, not as a process's code
    assert re.search(LOST + re.escape(hosts.b.ip), stderr), stderr[-3000:]
    assert "exited with code" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert re.match(
        rf"reinforge train: error: engine [01] \(on node {re.escape(hosts.b.ip)}\)", last
    ), last
    assert "(is its node up?)" in last or "(Ray: " in last, stderr[-3000:]


@pytest.mark.timeout(1800)
def test_trainer_ranks_on_a_frozen_host_b_end_the_run_in_one_line(tmp_path):
    """Both trainer ranks on host B, the engine on host A; host B stopped (SIGSTOP) once
    step 1 is recorded: its ranks neither answer nor die, their sockets stay open, and the
    driver's next call to them must not wait for ever. It ends with one line naming a rank
    and host B, and exit code 2, within the subprocess's timeout. Its own two hosts, as
    losing host B above."""
    require_extra("ray", "ray")
    release = tmp_path / "release"
    with two_hosts() as hosts:
        argv = tiny_train(
            tmp_path,
            "run.steps=4",
            *_ranks_on_b(hosts),
            f"env.name={RELEASE_ENV}",
            f"env.args.release={str(release)!r}",
        )
        # the next steps train, on the frozen ranks
        returncode, stderr = _losing_host_b(hosts, argv, tmp_path, "frozen", then=release.touch)
    assert returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert re.match(r"reinforge train: error: trainer rank [01] ", last), last
    assert hosts.b.ip in last, stderr[-3000:]


def _losing_host_b(
    hosts: TwoHosts,
    argv: list[str],
    tmp_path: Path,
    fault: str,
    then: Callable[[], object] | None = None,
) -> tuple[int, str]:
    """`argv` run on host A until it records its first step; then host B `killed` or
    `frozen` (let go again once the run ended), and `then()`. The run's exit code and
    stderr."""
    run = subprocess.Popen(
        hosts.on_a(argv), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        _stepped(run, tmp_path / "r")
        if fault == "killed":
            hosts.b.kill()
        else:
            hosts.b.freeze()
        if then is not None:
            then()
        _, stderr = run.communicate(timeout=900)
    finally:
        run.kill()
        if fault == "frozen":
            hosts.b.thaw()
    return run.returncode, stderr


def _ranks_on_b(hosts: TwoHosts) -> list[str]:
    """A sharded trainer's two ranks on host B; one engine on host A, which takes the
    weights by a file of the driver's node (the file transport)."""
    return [
        "cluster.backend=ray",
        f'cluster.address="{hosts.address}"',
        "trainer.world_size=2",
        "cluster.rank.custom={host_b=1}",
        "engines.kind=spawned",
        "engines.count=1",
        "engines.resources.custom={host_a=1}",
    ]


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


BY_VALUE = "reinforge: the trainer ranks do not see "
"""The driver's line when checkpoints go through it, the ranks not seeing the run
directory."""


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("storage", ["host_a_memory", "shared_disk"])
def test_trainer_ranks_on_host_b_train_checkpoint_and_resume(hosts, tmp_path, storage):
    """Both ranks of a sharded trainer pinned to host B, the driver and its engine on host
    A. With the run directory in host A's own memory, where host B cannot see it, rank 0
    sends the weights and each checkpoint's model to the driver, which writes them, and on
    `--resume` the driver reads the checkpoint and sends it to the ranks, as it says once.
    With it on a disk both hosts mount (the machine's), the ranks find that they see it
    and read and write the checkpoints themselves. Either way they go on from it: the
    engine samples step 3 with the step-2 checkpoint's weights."""
    name = f"rf-ranks-{os.getpid()}"
    apart = storage == "host_a_memory" and hosts.isolated
    run_dir = Path("/dev/shm", name) if apart else tmp_path / name
    # as this process sees it; host A's /dev/shm goes with the fixture
    seen_at = hosts.a.shm / name if apart else run_dir
    common = ["run.checkpoint_every=1", *_ranks_on_b(hosts)]
    code, err, seen = _watching_ranks(hosts, tiny_train(run_dir, "run.steps=2", *common), tmp_path)
    assert code == 0, _why(err, seen_at / "r")
    assert seen == {"b"}
    assert (BY_VALUE in err) == apart, err[-3000:]
    code, err, seen = _watching_ranks(
        hosts, tiny_train(run_dir, "run.steps=3", *common, "--resume"), tmp_path
    )
    assert code == 0, _why(err, seen_at / "r")
    assert seen == {"b"}
    assert (BY_VALUE in err) == apart, err[-3000:]

    run = seen_at / "r"
    assert [row["policy_version"] for row in _rows(run)] == [1, 2, 3]
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00002")
    lines = (run / "trajectories" / "step_00003.jsonl").read_text().splitlines()
    assert lines
    for trajectory in map(json.loads, lines):  # the resumed ranks' first push
        assert set(trajectory["policy_versions"]) == {2}
        _assert_sampled_by(trajectory, model)
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00003")
    assert not list(run.rglob(".reinforge-probe-*"))  # each probe gone once read

    if storage == "host_a_memory" and not hosts.isolated:
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
