"""The run's Ray actors on a local Ray cluster that a test starts, and what the run says
when one dies: an engine whose actor dies is said to have died with it, where and why (not
as a process's exit code), and comes back by a new actor at its URL; a trainer rank whose
actor dies stops the run in one line saying the same. An engine's log leaves its node once
copied whole to the run's directory, and stays there otherwise."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

from reinforge.config import Config, load_config
from reinforge.orchestrate import weight_sync
from reinforge.orchestrate.cluster import open_cluster
from reinforge.orchestrate.engines import RemoteEngine, open_engine
from reinforge.orchestrate.ray_cluster import RayCluster
from reinforge.orchestrate.supervisor import Supervisor
from reinforge.policy.models import load_model
from reinforge.train.ranks import RankFailed
from reinforge.train.trainer import Trainer

from .commands import loaded_by
from .conftest import require_extra
from .test_remote_engine import assert_samples_with
from .test_several_engines import holding


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temp folder of the Ray cluster's processes, which inherit it (short: Ray's
    sockets live under it)."""
    folder = Path(tempfile.mkdtemp(prefix="rf-node-"))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_an_engines_actor_imports_no_model_stack():
    """Ray imports the engine's actor module in every engine actor's process: that process
    starts `reinforge serve` and moves weight bytes, and pays nothing for the trainer's or
    the model's modules (4-5 s of CPU at each actor's start on a small host)."""
    heavy = ["transformers", "peft", "reinforge.train.trainer", "reinforge.policy.engine"]
    assert loaded_by("reinforge.orchestrate.ray_engine_actor", heavy) == []


def _with_engines(tmp_path: Path, test: Callable[[RemoteEngine, Trainer], Awaitable[None]]) -> None:
    """`test(engine, trainer)` with two engines of the tiny model as actors of a Ray cluster
    this process starts; the engines stop once it returns."""
    require_extra("ray", "ray")
    overrides = ["model.name=tiny-random", f"run.dir={tmp_path / 'run'}",
                 "cluster.backend=ray", "engines.kind=spawned", "engines.count=2"]  # fmt: skip
    config = load_config(Config, None, overrides)
    model, tokenizer = load_model("tiny-random")
    trainer = Trainer(model, config.trainer, config.optim, total_steps=1)

    async def run() -> None:
        with open_cluster(config) as cluster:
            engine = await open_engine(config, trainer, tokenizer, 3, cluster.engines)
            assert isinstance(engine, RemoteEngine)
            try:
                await test(engine, trainer)
            finally:
                await engine.aclose()

    asyncio.run(run())


def _node_log(node: Path, index: int) -> Path:
    """Engine `index`'s log in the node's temp folder: the one its engine holds now."""
    (log,) = [log for log in node.glob(f"reinforge-engine-*/engine-{index}.log") if holding(log)]
    return log


def test_the_run_reaches_its_engines_through_their_actors(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine takes pauses, resumes and weights from loopback connections alone, which
    the run cannot open to an engine on another machine: it posts them through the
    engine's actor, on the engine's node. Here the run's own posts are cut off (on one
    machine they would reach), and every pause, resume and push still arrives."""

    def cut_off(url: str) -> None:
        raise AssertionError(f"the run posted to the engine at {url} itself")

    monkeypatch.setattr(weight_sync, "loopback", cut_off)

    def paused(url: str) -> bool:
        return httpx.get(f"{url.removesuffix('/v1')}/health", timeout=10.0).json()["paused"]

    async def test(engine: RemoteEngine, trainer: Trainer) -> None:
        answers = engine.sync.post_all("/pause", {"lease_s": 60.0}, "pause decoding")
        assert [answer["paused"] for answer in answers] == [True, True]
        assert all(paused(url) for url in engine.sync.urls)
        engine.sync.post_all("/resume", {}, "resume decoding")
        assert not any(paused(url) for url in engine.sync.urls)
        with torch.no_grad():
            for parameter in trainer.model.parameters():
                parameter.mul_(0.9)
        assert engine.sync.push(trainer, 4).engines == 2
        for url in engine.sync.urls:
            assert_samples_with(url, trainer.model, 4)

    _with_engines(tmp_path, test)


def test_an_engine_whose_actor_dies_is_said_to_and_comes_back_by_a_new_actor(
    tmp_path, node, capsys
):
    async def test(engine: RemoteEngine, trainer: Trainer) -> None:
        processes = engine.processes
        assert processes is not None
        assert await processes.ended(1) is None
        url = engine.sync.urls[1]
        logs.append(_node_log(node, 1))
        (server,) = holding(logs[0])
        actor = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
        supervisor = Supervisor(engine, load_config(Config, None, ["engines.kind=spawned"]).engines)
        watching = asyncio.create_task(supervisor.watch())
        try:
            os.kill(actor, signal.SIGKILL)  # the actor's process: its engine dies with it
            while supervisor.restarts == 0 or 1 in engine.router.down:
                assert not watching.done(), watching.exception()
                await asyncio.sleep(0.2)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        said = capsys.readouterr().err
        host = url.split("//")[1].split(":")[0]
        assert (
            f"reinforge: engine 1 died with its Ray actor on node {host} (Ray: The actor is "
            "dead because its worker process has died); restarting it (1 of at most 3"
        ) in said, said
        assert "exited with code" not in said
        assert engine.sync.joined(1) and engine.sync.urls[1] == url
        assert await processes.ended(1) is None  # a new actor's engine, at the same URL
        logs.append(_node_log(node, 1))
        (new_server,) = holding(logs[1])
        assert new_server != server
        assert_samples_with(url, trainer.model, 3)  # caught up with the last push

    logs: list[Path] = []  # engine 1's on its node: its first actor's, then the new one's
    _with_engines(tmp_path, test)
    # the dead actor's log stays on the node (nothing is left to copy or delete it); the
    # new actor's was copied whole as its engine stopped, then deleted
    assert logs[0].exists() and not logs[1].parent.exists()
    # The copy holds the new actor's engine to its last line; of the dead actor's, what was
    # copied before it died (copies run every second: its last lines may be missing).
    lines = next((tmp_path / "run").glob("**/engines/engine-1.log")).read_text().splitlines()
    new_life = lines[max(i for i, line in enumerate(lines) if line.startswith("threads: ")) :]
    assert any("Uvicorn running on" in line for line in new_life), lines
    assert new_life[-1].startswith("INFO:     Finished server process"), lines


def test_an_engines_log_leaves_its_node_once_copied_whole_and_stays_where_not(
    tmp_path, node, capsys
):
    async def test(engine: RemoteEngine, trainer: Trainer) -> None:
        processes = engine.processes
        assert processes is not None
        logs.extend(_node_log(node, index) for index in range(2))
        copies.extend(processes.log(index) for index in range(2))
        while not copies[1].is_dir():  # engine 1's copy cannot be written: a folder there
            copies[1].unlink(missing_ok=True)
            try:
                copies[1].mkdir()
            except FileExistsError:
                continue  # the copy was written again meanwhile

    logs: list[Path] = []
    copies: list[Path] = []
    _with_engines(tmp_path, test)
    assert not logs[0].parent.exists()  # copied whole, with its engine's last words
    assert "Finished server process" in copies[0].read_text()
    assert logs[1].exists()  # kept, and the run says where
    said = capsys.readouterr().err
    assert (
        f"reinforge: engine 1's log could not be copied whole to {copies[1]}: the rest stays "
        "on its node (reinforge-engine-*/engine-1.log in its temp folder)\n"
    ) in said, said
    assert "engine 0's log" not in said


def _descendants(pid: int) -> set[int]:
    """The live processes that `pid` started, and theirs: a Ray cluster this process
    started, with its workers."""
    children: dict[int, set[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, set()).add(int(stat.parts[2]))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), set()) - found:
            found.add(child)
            todo.append(child)
    return found


def test_a_trainer_rank_whose_actor_dies_ends_the_call_in_one_line_saying_so():
    require_extra("ray", "ray")
    config = load_config(Config, None, ["cluster.backend=ray", "trainer.world_size=2"])
    cluster = RayCluster(config)
    try:
        ranks = cluster.ranks(config.trainer, str)  # each rank holds str(rank)
        assert ranks.call("zfill", 2) == ["00", "01"]
        actors = [
            pid
            for pid in _descendants(os.getpid())
            if b"ray::RankActor" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(actors) == 2
        os.kill(actors[0], signal.SIGKILL)
        with pytest.raises(RankFailed) as failed:
            ranks.call("zfill", 2)
    finally:
        cluster.close()
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith("trainer rank "), line
    assert " died on node " in line
    assert line.endswith("(Ray: The actor is dead because its worker process has died)"), line
