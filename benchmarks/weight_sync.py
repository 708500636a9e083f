"""What a weight sync costs: the engine in this process vs `reinforge serve` processes
beside it, one and several.

- in-process, shared fp32: the optimizer step is the sync (only a version bump: ~0 s);
- in-process, bf16 engine: the trainer's fp32 weights copied into the engine's own copy;
- `reinforge serve` x N: the trainer writes one safetensors file (under /dev/shm where
  there is one) and every engine loads it at once through `POST /v1/weights` (what
  `engines.count = N` spawned engines do after every step; one is what a served engine
  does);
- with `--broadcast`, each count of engines twice more, over
  `engines.weight_sync = "broadcast"` (a gloo group of this process and the engines,
  the weights broadcast in buckets) to fp32 engines and to bf16 ones;
- with `--ray N`, N engines as actors of a local Ray cluster, seven ways: the same file
  push; `engines.weight_sync = "broadcast"` to fp32 and to bf16 engines (the group's
  control through each engine's actor); and `"object_store"` (buckets put in Ray's object
  store, each actor writing them to its own node's memory for its engine) to fp32 engines
  and to bf16 ones (half the bytes), each whole and with `engines.weight_sync.delta`
  (after the first push, each bucket's changed elements where they are smaller);
- with `--two-hosts` as well, the Ray sets on the two hosts of `tests/twohosts.py` (two
  Ray nodes of this machine, each with its own address and, as root, its own /dev/shm):
  this process on host A, the file push's engines on host A (as it needs), every other
  set's on host B (the broadcast's store on host A's address).

Each round starts with a real optimizer step of the trainer (AdamW at the default
`optim.lr`, the main job's, on a synthetic batch of random tokens), so that no push sends
the weights the last one did (which would make a delta trivially empty). Rounds are
interleaved, so that noise from other work hits every kind alike.

    python benchmarks/weight_sync.py [--model smollm2-135m] [--rounds 5] [--engines 1 2]
        [--broadcast] [--ray 2 [--two-hosts]] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from reinforge.config import Config, load_config
from reinforge.orchestrate.config import (
    BroadcastSync,
    FileSync,
    ObjectStoreSync,
    Resources,
    SpawnedEngines,
)
from reinforge.orchestrate.engines import RemoteEngine
from reinforge.orchestrate.ray_cluster import RayCluster
from reinforge.orchestrate.weight_sync import CopiedWeights, WeightSync
from reinforge.policy.config import EngineConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.trainer import Trainer


@dataclass
class Kind:
    """One way to sync, measured over the rounds."""

    engines: int
    seconds: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    """Per round: what the engines were sent (`Synced.bytes`)."""

    def summary(self) -> dict[str, Any]:
        median = statistics.median(self.seconds)
        median_bytes = statistics.median(self.bytes)
        return {
            "engines": self.engines,
            "seconds": self.seconds,
            "median_s": median,
            "write_s": self.write_s,
            "bytes": self.bytes,
            "median_bytes": median_bytes,
            "effective_gib_per_s": median_bytes / median / 2**30,
        }


BROADCAST_KINDS = {"broadcast_fp32": "float32", "broadcast_bf16": "bfloat16"}

RAY_KINDS = {
    "file": (FileSync(), "float32"),
    "broadcast_fp32": (BroadcastSync(), "float32"),
    "broadcast_bf16": (BroadcastSync(), "bfloat16"),
    "object_store_fp32": (ObjectStoreSync(), "float32"),
    "object_store_fp32_delta": (ObjectStoreSync(delta=True), "float32"),
    "object_store_bf16": (ObjectStoreSync(), "bfloat16"),
    "object_store_bf16_delta": (ObjectStoreSync(delta=True), "bfloat16"),
}


def run_config(model_name: str, runs: Path, name: str, *more: str) -> Config:
    overrides = [f"model.name={model_name}", f"run.dir={runs}", f"run.name={name}", *more]
    return load_config(Config, None, overrides)


async def measure(
    model_name: str,
    trainer_model: PreTrainedModel,
    rounds: int,
    counts: list[int],
    runs: Path,
    ray_count: int | None,
    broadcast: bool,
    address: str | None = None,
) -> dict[str, Kind]:
    """`address`: the Ray sets on the two hosts whose cluster it is, else a local one."""
    sampler, tokenizer = load_model(model_name, "bfloat16")
    trainer = Trainer(trainer_model, TrainerConfig(), OptimConfig(), total_steps=1)
    copy = Engine(sampler, tokenizer, model_name, EngineConfig(dtype="bfloat16"))
    kinds = {"in_process_bf16_copy": Kind(engines=1)}
    remotes: dict[str, RemoteEngine] = {}
    cluster = None
    try:
        for count in counts:
            config = run_config(model_name, runs, f"engines-{count}")
            name = f"serve_x{count}_file_handoff"
            spawned = SpawnedEngines(count=count)
            remotes[name] = await RemoteEngine.start(config, trainer, 0, spawned)
            kinds[name] = Kind(engines=count)
            for kind, dtype in BROADCAST_KINDS.items() if broadcast else ():
                name = f"serve_x{count}_{kind}"
                config = run_config(model_name, runs, name, f"engine.dtype={dtype}")
                spawned = SpawnedEngines(count=count, weight_sync="broadcast")
                remotes[name] = await RemoteEngine.start(config, trainer, 0, spawned)
                kinds[name] = Kind(engines=count)
        if ray_count is not None:
            joined = [f'cluster.address="{address}"'] if address else []
            ray = run_config(model_name, runs, "ray", "cluster.backend=ray", *joined)
            cluster = RayCluster(ray)
            for kind, (transport, dtype) in RAY_KINDS.items():
                name = f"ray_x{ray_count}_{kind}"
                config = run_config(model_name, runs, name, f"engine.dtype={dtype}", *joined)
                # every set of engines on one machine's CPUs: all ask for one between them;
                # on two hosts the file's on the driver's, the others on host B
                host = {} if not address else {"host_a" if kind == "file" else "host_b": 1.0}
                share = Resources(cpus=1 / (len(RAY_KINDS) * ray_count), custom=host)
                spawned = SpawnedEngines(count=ray_count, weight_sync=transport, resources=share)
                remotes[name] = await RemoteEngine.start(
                    config, trainer, 0, spawned, cluster.engines
                )
                kinds[name] = Kind(engines=ray_count)
        syncs: dict[str, WeightSync] = {"in_process_bf16_copy": CopiedWeights(copy)}
        syncs.update({name: remote.sync for name, remote in remotes.items()})
        generator = torch.Generator().manual_seed(0)
        for version in range(1, rounds + 1):
            optimizer_step(trainer, generator)
            for name, sync in syncs.items():
                started = time.perf_counter()
                synced = sync.push(trainer, version)
                kinds[name].seconds.append(time.perf_counter() - started)
                kinds[name].write_s.append(synced.write_s)
                kinds[name].bytes.append(synced.bytes)
    finally:
        copy.close()
        for remote in remotes.values():
            await remote.aclose()
        if cluster is not None:
            cluster.close()
    return kinds


def optimizer_step(trainer: Trainer, generator: torch.Generator) -> None:
    """One AdamW step of the trainer's own optimizer, its gradients clipped as the trainer
    clips them, on a next-token loss over random tokens: weights that move as a step of the
    main job moves them, not by a chosen amount."""
    model = trainer.model
    ids = torch.randint(model.config.vocab_size, (2, 64), generator=generator)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), OptimConfig().grad_clip)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--broadcast", action="store_true", help="also broadcast to them")
    parser.add_argument("--ray", type=int, help="also N engines on a local Ray cluster")
    parser.add_argument("--two-hosts", action="store_true", help="the Ray sets on two hosts")
    parser.add_argument("--address", help=argparse.SUPPRESS)  # host A's run of --two-hosts
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.two_hosts:
        if args.ray is None:
            parser.error("--two-hosts places the --ray N sets: give --ray")
        on_two_hosts()
        return

    trainer_model, _ = load_model(args.model, "float32")
    with tempfile.TemporaryDirectory() as runs:  # the engines' logs
        kinds = asyncio.run(
            measure(
                args.model,
                trainer_model,
                args.rounds,
                args.engines,
                Path(runs),
                args.ray,
                args.broadcast,
                args.address,
            )
        )
    summary = {name: kind.summary() for name, kind in kinds.items()}
    parameters = sum(p.numel() for p in trainer_model.parameters())
    for name, row in summary.items():
        write_s = statistics.median(row["write_s"])
        print(
            f"{name:32s} median {row['median_s']:.3f} s, writing {write_s:.3f} s; "
            f"{row['median_bytes'] / 2**20:.1f} MiB sent, {row['effective_gib_per_s']:.2f} GiB/s"
        )
    print(f"{parameters / 1e6:.0f}M parameters, fp32 file {parameters * 4 / 2**20:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps({**summary, "parameters": parameters}, indent=2) + "\n")


def on_two_hosts() -> None:
    """This benchmark again, as a process of host A of two hosts made for it (room in each
    host's memory for a real model's weights, its object store and its engines' files)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.twohosts import two_hosts

    argv = [a for a in sys.argv[1:] if a != "--two-hosts"]
    with two_hosts(memory_mib=4096) as hosts:
        print(f"two hosts at {hosts.address} (own /dev/shm each: {hosts.isolated})", flush=True)
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--address", hosts.address]
        subprocess.run(hosts.on_a(command), check=True)


if __name__ == "__main__":
    main()
