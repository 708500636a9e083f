"""What a weight sync costs: the engine in this process vs `reinforge serve` beside it.

- in-process, shared fp32: the optimizer step is the sync (only a version bump: ~0 s);
- in-process, bf16 engine: the trainer's fp32 weights copied into the engine's own copy;
- `reinforge serve`: the trainer writes a safetensors file (under /dev/shm where there is
  one) and `POST /v1/weights` has the server load and apply it (what `loop.engine_url`
  does after every step).

    python benchmarks/weight_sync.py [--model smollm2-135m] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from transformers import PreTrainedModel

from reinforge.config import Config, load_config
from reinforge.orchestrate.engines import RemoteEngine
from reinforge.policy.config import EngineConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.train.trainable import full_weights

TOKEN = "benchmark"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "reinforge", "serve", "--model", model, "--port", str(port),
            f"server.weights_token={TOKEN}"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(1200):
        if process.poll() is not None:
            raise SystemExit(f"server exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.25)
    raise SystemExit("server did not start")


async def measure(
    config: Config, trainer_model: PreTrainedModel, engine: Engine, rounds: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"in_process_bf16_copy": [], "serve_file_handoff": []}
    remote = await RemoteEngine.connect(config, trainer_model, 0)
    try:
        for version in range(1, rounds + 1):  # interleaved, so noise hits both alike
            started = time.perf_counter()
            with full_weights(trainer_model) as weights:
                engine.update_weights(weights)
            times["in_process_bf16_copy"].append(time.perf_counter() - started)
            started = time.perf_counter()
            remote.push(trainer_model, version)
            times["serve_file_handoff"].append(time.perf_counter() - started)
    finally:
        await remote.aclose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    trainer_model, tokenizer = load_model(args.model, "float32")
    sampler, _ = load_model(args.model, "bfloat16")
    engine = Engine(sampler, tokenizer, args.model, EngineConfig(dtype="bfloat16"))
    port = free_port()
    server = start_server(args.model, port)
    url = f"http://127.0.0.1:{port}/v1"
    config: Config = load_config(
        Config,
        None,
        [
            f"model.name={args.model}",
            f"loop.engine_url={url}",
            f"loop.engine_token={TOKEN}",
            "loop.mode=async",
        ],  # fmt: skip
    )
    try:
        times = asyncio.run(measure(config, trainer_model, engine, args.rounds))
    finally:
        engine.close()
        server.terminate()
        server.wait(timeout=30)
    parameters = sum(p.numel() for p in trainer_model.parameters())
    summary = {
        name: {"seconds": values, "median_s": statistics.median(values)}
        for name, values in times.items()
    }
    summary["parameters"] = parameters  # type: ignore[assignment]
    for name, values in times.items():
        print(f"{name:22s} median {statistics.median(values):.3f} s  ({len(values)} rounds)")
    print(f"{parameters / 1e6:.0f}M parameters, fp32 file {parameters * 4 / 2**20:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
