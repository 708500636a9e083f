"""The weight transports that cross nodes: weights packed in buckets with a manifest, and
Ray's object store carrying them to each engine's node, whose actor hands them to its
engine over localhost. On a local Ray cluster with two engines of the tiny model."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from reinforge.config import Config, load_config
from reinforge.errors import ConfigError
from reinforge.orchestrate.cluster import open_cluster
from reinforge.orchestrate.engines import RemoteEngine, open_engine
from reinforge.policy import weight_buckets
from reinforge.policy.models import load_model
from reinforge.policy.weight_buckets import MemoryFile, pack, total_bytes
from reinforge.train.trainer import Trainer

from .conftest import require_extra
from .test_remote_engine import assert_samples_with, end_to_end


def test_buckets_give_back_every_tensor_cast_and_aligned(tmp_path):
    weights = {
        "odd": torch.randn(3, 5),  # 60 bytes: the next tensor starts past padding
        "steps": torch.arange(7),  # int64: never cast
        "scalar": torch.tensor(2.5),
        "long": torch.randn(1000),
    }
    for dtype in (None, torch.bfloat16):
        buckets = pack(weights, dtype, bucket_bytes=256)
        path = tmp_path / "weights.buckets"  # the buckets end to end
        path.write_bytes(end_to_end(buckets))
        back = weight_buckets.read(str(path), [b.entries for b in buckets])
        assert list(back) == list(weights)
        for name, tensor in weights.items():
            want = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
            assert back[name].dtype == want.dtype and torch.equal(back[name], want), name
        assert all(e.offset % 16 == 0 for b in buckets for e in b.entries)
        # each bucket within its size unless one tensor alone is larger ("long", 4000 B)
        assert all(b.data.nbytes <= 256 or len(b.entries) == 1 for b in buckets)
        assert len(buckets) > 1
    full, half = total_bytes(pack(weights)), total_bytes(pack(weights, torch.bfloat16))
    assert half < 0.6 * full  # bf16 halves the floating bytes


def test_a_memory_file_is_read_by_another_process_and_emptied_after():
    weights = {"a": torch.randn(3, 5), "b": torch.randn(100)}
    buckets = pack(weights, bucket_bytes=64)
    memory = MemoryFile()
    path = memory.path
    for _ in range(2):  # written over in place at each push
        with memory.holding([b.data.nbytes for b in buckets]) as lay:
            for index in reversed(range(len(buckets))):  # each at its place, whatever the order
                lay(index, buckets[index])
            script = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
            read = subprocess.run([sys.executable, "-c", script, path], capture_output=True)
            assert read.returncode == 0 and read.stdout == end_to_end(buckets)
            back = weight_buckets.read(path, [b.entries for b in buckets])
            assert all(torch.equal(back[name], tensor) for name, tensor in weights.items())
        assert Path(path).stat().st_size == 0  # the node's memory given back
    # a bucket of another size than the push said would shift every one after it
    with pytest.raises(ValueError, match="bucket 0: "), memory.holding([1, 2]) as lay:
        lay(0, buckets[0])
    assert Path(path).stat().st_size == 0


def test_the_object_store_carries_the_weights_to_every_engine_and_a_rejoining_one(tmp_path):
    require_extra("ray", "ray")
    overrides = ["model.name=tiny-random", f"run.dir={tmp_path}", "cluster.backend=ray",
                 "engines.kind=spawned", "engines.count=2",
                 "engines.weight_sync=object_store"]  # fmt: skip
    config = load_config(Config, None, overrides)
    model, tokenizer = load_model("tiny-random")
    trainer = Trainer(model, config.trainer, config.optim, total_steps=1)
    generator = torch.Generator().manual_seed(0)

    def perturb() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))

    async def pushes() -> None:
        with open_cluster(config) as cluster:
            engine = await open_engine(config, trainer, tokenizer, 0, cluster.engines)
            assert isinstance(engine, RemoteEngine)
            try:
                perturb()
                synced = engine.sync.push(trainer, 5)
                assert (synced.engines, engine.version) == (2, 5)
                assert synced.bytes == 2 * sum(p.numel() * 4 for p in model.parameters())
                for url in engine.sync.urls:
                    assert_samples_with(url, model, 5)
                # engine 0 misses a push, then catches up from the store
                engine.sync.leave(0)
                perturb()
                assert engine.sync.push(trainer, 6).engines == 1
                engine.sync.rejoin(0)
                for url in engine.sync.urls:
                    assert_samples_with(url, model, 6)
            finally:
                await engine.aclose()

    asyncio.run(pushes())


def greedy(url: str, version: int) -> tuple[list[int], torch.Tensor]:
    """The engine at `url` (its /v1) decoding greedily as `version`: its tokens and the
    log-probs it records for them."""
    body = {"model": "tiny-random", "prompt": [5, 6, 7, 8], "max_tokens": 6, "logprobs": 0,
            "temperature": 0.0}  # fmt: skip
    choice = httpx.post(f"{url}/completions", json=body, timeout=60).json()["choices"][0]
    assert choice["policy_versions"] == [version] * len(choice["token_ids"])
    return choice["token_ids"], torch.tensor(choice["logprobs"]["token_logprobs"])


def test_bf16_engines_take_the_changed_elements_after_the_first_push(tmp_path):
    """Steps at the main job's learning rate change a few bf16 elements: with
    `engines.weight_sync.delta`, after the first push the engines take those, not the
    buckets, and sample exactly what an engine given the buckets whole does (engine 0
    misses a push and rejoins whole; engine 1 takes the deltas). A push that changes every
    element goes whole, cast to the engines' dtype: half the fp32 bytes."""
    require_extra("ray", "ray")
    overrides = ["model.name=tiny-random", f"run.dir={tmp_path}", "cluster.backend=ray",
                 "engines.kind=spawned", "engines.count=2",
                 "engines.weight_sync.kind=object_store", "engines.weight_sync.delta=true",
                 "engine.dtype=bfloat16"]  # fmt: skip
    config = load_config(Config, None, overrides)
    model, tokenizer = load_model("tiny-random")
    trainer = Trainer(model, config.trainer, config.optim, total_steps=1)
    full = sum(p.numel() * 2 for p in model.parameters())
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        """What an Adam step at lr 1e-5 does: each weight moves by about the rate, which
        changes about a tenth of tiny-random's bf16 elements (its weights are small)."""
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-5 * torch.randn(p.shape, generator=generator).sign())

    def expected(tokens: list[int]) -> torch.Tensor:
        half = copy.deepcopy(model).to(torch.bfloat16)
        ids = torch.tensor([[5, 6, 7, 8, *tokens]])
        with torch.no_grad():
            logp = torch.log_softmax(half(input_ids=ids).logits[0, 3:-1].float(), dim=-1)
        return logp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)

    def samples_alike(version: int) -> None:
        (tokens, first), (again, second) = (greedy(url, version) for url in engine.sync.urls)
        assert tokens == again and torch.equal(first, second)  # token-exact
        torch.testing.assert_close(first, expected(tokens), rtol=0.0, atol=0.05)

    async def pushes() -> None:
        nonlocal engine
        with open_cluster(config) as cluster:
            engine = await open_engine(config, trainer, tokenizer, 0, cluster.engines)
            try:
                # the engines took the buckets whole as they joined (version 0)
                step()
                assert 0 < engine.sync.push(trainer, 1).bytes < 2 * full / 2
                samples_alike(1)
                assert engine.sync.push(trainer, 2).bytes == 0  # nothing changed
                samples_alike(2)
                engine.sync.leave(0)
                step()
                assert 0 < engine.sync.push(trainer, 3).bytes < full / 2
                engine.sync.rejoin(0)  # the buckets of 3 whole
                samples_alike(3)
                step()
                assert 0 < engine.sync.push(trainer, 4).bytes < 2 * full / 2
                samples_alike(4)
                with torch.no_grad():  # every element changes: no delta is smaller
                    for p in model.parameters():
                        p.add_(0.05 * torch.randn(p.shape, generator=generator))
                assert engine.sync.push(trainer, 5).bytes == 2 * full
                samples_alike(5)
            finally:
                await engine.aclose()

    engine = None
    asyncio.run(pushes())


def test_the_object_store_is_refused_without_ray(tmp_path):
    """Processes of this machine would take a file whatever the config said."""
    overrides = ["engines.kind=spawned", "engines.weight_sync=object_store"]
    with pytest.raises(ConfigError, match='needs cluster.backend = "ray"$'):
        load_config(Config, None, overrides)
