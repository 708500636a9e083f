"""Intra-op threads of a `reinforge serve` on a shared machine, side by side in one run.

A server's torch splits each matmul over its intra-op threads. Alone on its cores that
pays; next to another busy process (a trainer, a second engine, a grader) the threads
wait for each other at every barrier while the other process holds a core, and each
decode step takes as long as its slowest thread. This measures one server of the default
model, built-in engine, fp32, under each thread setting:

- `default`: what the server chooses (`model.threads` unset);
- `1 thread`: `OMP_NUM_THREADS=1` (as `model.threads=1`);
- `passive wait`: `OMP_WAIT_POLICY=PASSIVE`, OpenMP threads that sleep at once at a
  barrier instead of spinning first;
- each setting alone, and beside a contender: a process running fp32 matmuls on as many
  threads as the machine has CPUs (what a trainer's step does).

Each round starts a fresh server per setting, in an order that rotates each round: 32
concurrent chat completions of up to 48 tokens (tokens/s, after one untimed race) and one
48-token completion (seconds per token, best of 3 after an untimed one).

    python benchmarks/threads.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).parent))
from generate import _wait_healthy, best_batch1, throughput  # noqa: E402

from reinforge.envs.registry import load_environment  # noqa: E402
from reinforge.policy.specs import DEFAULT_MODEL  # noqa: E402

SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "passive wait": {"OMP_WAIT_POLICY": "PASSIVE"},
}


def contend(stop: Any) -> None:
    """A busy neighbour: fp32 matmuls on every CPU, as a trainer's step runs them."""
    torch.set_num_threads(os.cpu_count() or 1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def serve_once(env: dict[str, str], messages: list[list[dict]]) -> dict[str, float]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "reinforge", "serve", "--model", DEFAULT_MODEL,
               "--port", str(port)]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        launched = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=log, env=os.environ | env)
        try:
            _wait_healthy(process, url, log, launched)
            rate = throughput(url, messages)
            with httpx.Client(base_url=url, timeout=600) as client:
                per_token = best_batch1(client, 3)
        finally:
            process.terminate()
            process.wait(timeout=60)
    return {"tokens_per_s": rate, "batch1_s_per_token": per_token}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    messages = [task.prompt for task in load_environment("arithmetic").tasks(32, seed=1)]
    cases = [(name, busy) for busy in (False, True) for name in SETTINGS]
    results: dict[str, dict[str, list[float]]] = {}
    for round_number in range(args.rounds):
        shift = round_number % len(cases)
        for name, busy in cases[shift:] + cases[:shift]:
            stop = multiprocessing.Event()
            neighbour = multiprocessing.Process(target=contend, args=(stop,)) if busy else None
            if neighbour is not None:
                neighbour.start()
            try:
                figures = serve_once(SETTINGS[name], messages)
            finally:
                if neighbour is not None:
                    stop.set()
                    neighbour.join()
            key = f"{name}, {'beside a busy process' if busy else 'alone'}"
            for metric, value in figures.items():
                results.setdefault(key, {}).setdefault(metric, []).append(value)
            print(key, {k: round(v, 4) for k, v in figures.items()}, flush=True)
    print(f"\n{'setting':40} {'tokens/s (32 concurrent)':>26} {'s/token (batch 1)':>20}")
    for key, metrics in results.items():
        rate = statistics.median(metrics["tokens_per_s"])
        per_token = statistics.median(metrics["batch1_s_per_token"])
        print(f"{key:40} {rate:26.1f} {per_token:20.4f}")
    if args.json is not None:
        report = {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
        args.json.write_text(json.dumps({**report, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
