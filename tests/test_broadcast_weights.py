"""`engines.weight_sync = "broadcast"`: the run's process and its engines in a gloo group of
their own, over which each push broadcasts the weights in buckets. Real `reinforge serve`
processes of the tiny model; an engine killed mid-broadcast costs that push its engine,
never the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
import torch.distributed as dist

from reinforge.config import Config, load_config
from reinforge.orchestrate.broadcast_weights import HOST
from reinforge.orchestrate.cluster import open_cluster
from reinforge.orchestrate.engine_processes import EngineProcesses
from reinforge.orchestrate.engines import RemoteEngine, open_engine
from reinforge.orchestrate.ray_weights import RayBroadcastPush
from reinforge.policy.config import EngineConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.policy.weight_buckets import pack
from reinforge.policy.weight_group import WeightGroup, new_group
from reinforge.train.trainer import Trainer

from .commands import run_here, tiny_train
from .conftest import require_extra
from .test_remote_engine import assert_samples_with

BROADCAST = ("engines.kind=spawned", "engines.count=2", "engines.weight_sync.kind=broadcast")
SEQUENCE = [5, 6, 7, 8, 9, 10, 11, 12]


def _setup(tmp_path, *overrides: str) -> tuple[Config, torch.nn.Module, Trainer, object]:
    config = load_config(Config, None, ["model.name=tiny-random", f"run.dir={tmp_path}",
                                        *BROADCAST, *overrides])  # fmt: skip
    model, tokenizer = load_model("tiny-random")
    return config, model, Trainer(model, config.trainer, config.optim, total_steps=1), tokenizer


def _perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def assert_scores_like(url: str, model: torch.nn.Module) -> None:
    """The engine at `url` scores a fixed sequence as a plain forward of `model` does, to
    fp32's rounding: it holds `model`'s weights."""
    body = {"model": "tiny-random", "prompt": SEQUENCE, "max_tokens": 0, "echo": True,
            "logprobs": 0}  # fmt: skip
    choice = httpx.post(f"{url}/completions", json=body, timeout=60).json()["choices"][0]
    served = torch.tensor(choice["logprobs"]["token_logprobs"][1:])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([SEQUENCE])).logits[0, :-1], -1)
    expected = logp.gather(1, torch.tensor(SEQUENCE[1:]).unsqueeze(1)).squeeze(1)
    assert torch.allclose(served, expected, atol=1e-5), (served - expected).abs().max()


def test_buckets_land_while_the_last_is_copied_in(tmp_path):
    """An engine in this process joins a group with a thread as its trainer, which
    broadcasts weights in many small buckets: the engine holds them all after, as their
    version."""
    model, tokenizer = load_model("tiny-random")
    engine = Engine(model, tokenizer, "tiny-random", EngineConfig())
    trained, _ = load_model("tiny-random")
    _perturb(trained, 1)
    buckets = pack(dict(trained.named_parameters()), bucket_bytes=2**16)
    assert len(buckets) > 2
    store = dist.TCPStore(HOST, 0, None, True, wait_for_workers=False)
    receiver = WeightGroup(engine)
    try:
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(receiver.join, (HOST, store.port), HOST, "g", 1, 2, 30.0)
            trainer = new_group(store, "g", HOST, 0, 2, 30.0)
            joined.result()
            entries = [bucket.entries for bucket in buckets]
            served = pool.submit(receiver.receive, "g", entries, 4)
            for bucket in buckets:
                trainer.broadcast([torch.from_numpy(bucket.data)]).wait()
            assert served.result() == 4 == engine.version
        for (name, got), want in zip(model.named_parameters(), trained.parameters(), strict=True):
            assert torch.equal(got, want), name
    finally:
        engine.close()


def _push_miss_and_catch_up(engine: RemoteEngine, model: torch.nn.Module, trainer: Trainer):
    """Pushes to both engines, one that engine 0 misses and then catches up on, and one
    more to both: after each, the engines up hold the trainer's weights."""
    _perturb(model, 0)
    synced = engine.sync.push(trainer, 5)
    assert (synced.engines, engine.version) == (2, 5)
    assert synced.bytes == 2 * sum(p.numel() * 4 for p in model.parameters())
    for url in engine.sync.urls:
        assert_scores_like(url, model)
        assert_samples_with(url, model, 5)
    engine.sync.leave(0)
    _perturb(model, 1)
    assert engine.sync.push(trainer, 6).engines == 1
    engine.sync.rejoin(0)
    for url in engine.sync.urls:
        assert_samples_with(url, model, 6)
    _perturb(model, 2)  # and engine 0 is in the group again
    assert engine.sync.push(trainer, 7).engines == 2
    for url in engine.sync.urls:
        assert_scores_like(url, model)
        assert_samples_with(url, model, 7)


async def test_a_broadcast_reaches_every_engine_and_a_restarted_one_catches_up(tmp_path):
    """The engine that misses a push catches up from a file of the run's machine."""
    config, model, trainer, tokenizer = _setup(tmp_path)
    engine = await open_engine(config, trainer, tokenizer, 0)
    assert isinstance(engine, RemoteEngine)
    try:
        _push_miss_and_catch_up(engine, model, trainer)
    finally:
        await engine.aclose()


async def test_an_engine_killed_mid_broadcast_costs_that_push_its_engine_alone(tmp_path):
    config, model, trainer, tokenizer = _setup(tmp_path, "engines.weight_sync.timeout_s=60")
    engine = await open_engine(config, trainer, tokenizer, 0)
    assert isinstance(engine, RemoteEngine) and isinstance(engine.processes, EngineProcesses)
    victim = engine.processes.processes[1]
    try:
        # Stopped, engine 1 takes no bytes: the broadcast waits on it until it is killed.
        os.kill(victim.pid, signal.SIGSTOP)
        killer = threading.Timer(2.0, os.kill, (victim.pid, signal.SIGKILL))
        killer.start()
        _perturb(model, 0)
        synced = engine.sync.push(trainer, 5)
        killer.join()
        assert victim.wait(timeout=30) == -signal.SIGKILL
        assert synced.engines == 1 and engine.sync.up() == [0]
        assert_samples_with(engine.sync.urls[0], model, 5)
        # its supervisor's part: restart it and give it the last push; the group forms
        # again with it at the next push
        await engine.processes.restart(1)
        engine.sync.rejoin(1)
        assert_samples_with(engine.sync.urls[1], model, 5)
        _perturb(model, 1)
        assert engine.sync.push(trainer, 6).engines == 2
        for url in engine.sync.urls:
            assert_scores_like(url, model)
            assert_samples_with(url, model, 6)
    finally:
        await engine.aclose()


async def test_an_engine_that_hangs_costs_a_push_the_groups_timeout(tmp_path):
    config, model, trainer, tokenizer = _setup(tmp_path, "engines.weight_sync.timeout_s=3")
    engine = await open_engine(config, trainer, tokenizer, 0)
    assert isinstance(engine, RemoteEngine) and isinstance(engine.processes, EngineProcesses)
    hung = engine.processes.processes[1]
    try:
        os.kill(hung.pid, signal.SIGSTOP)  # never answers again, never dies
        _perturb(model, 0)
        synced = engine.sync.push(trainer, 5)
        assert synced.engines == 1 and engine.sync.up() == [0]
        assert_samples_with(engine.sync.urls[0], model, 5)
        _perturb(model, 1)  # the group forms again without it
        assert engine.sync.push(trainer, 6).engines == 1
        assert_samples_with(engine.sync.urls[0], model, 6)
    finally:
        hung.kill()
        await engine.aclose()


@pytest.mark.parametrize("mode", ["sync", "partial"])
def test_a_run_broadcasts_every_step_to_both_engines(tmp_path, mode):
    argv = tiny_train(tmp_path, "run.steps=3", *BROADCAST, f"loop.mode={mode}")
    process = run_here(argv)
    assert process.returncode == 0, process.stderr
    rows = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert all(r["sync"]["engines"] == 2 and r["sync"]["bytes"] > 0 for r in rows)
    for step in (1, 2, 3):
        lines = (tmp_path / "r" / "trajectories" / f"step_{step:05d}.jsonl").read_text()
        for versions in (json.loads(line)["policy_versions"] for line in lines.splitlines()):
            if mode == "sync":  # every token sampled by the weights the step trains
                assert set(versions) == {step - 1}
            else:  # carried over the push: versions only move on, within the bound
                assert versions == sorted(versions) and step - 1 - min(versions) <= 1


def test_a_ray_runs_engines_take_the_broadcast_through_their_actors(tmp_path):
    """Engines as Ray actors: each joins the group at its node's address, told through its
    actor; one that misses a push catches up from the object store and is in the next
    group."""
    require_extra("ray", "ray")
    config, model, trainer, tokenizer = _setup(tmp_path, "cluster.backend=ray")

    async def pushes() -> None:
        with open_cluster(config) as cluster:
            engine = await open_engine(config, trainer, tokenizer, 0, cluster.engines)
            assert isinstance(engine, RemoteEngine)
            assert isinstance(engine.sync, RayBroadcastPush)
            try:  # engine 0 catches up from the object store: no file reaches another node
                _push_miss_and_catch_up(engine, model, trainer)
            finally:
                await engine.aclose()

    asyncio.run(pushes())
