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

With `--main-job STEPS` it times the main job instead (`examples/arithmetic.toml`, its
first STEPS steps, no checkpoint): `model.threads` unset (the default) and 1, each alone
and beside the contender; the figure is the median step's wall time (`time.total_s` of
metrics.jsonl), the first step left out (it pays for warm-up).

    python benchmarks/threads.py [--rounds 3] [--json out.json]
    python benchmarks/threads.py --main-job 6 [--rounds 2] [--json out.json]
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


MAIN_JOB = {"default": [], "1 thread": ["model.threads=1"]}
"""The main job's thread settings: its own key, which sets torch's threads in-process."""


def train_once(overrides: list[str], steps: int) -> dict[str, float]:
    """The main job's first `steps` steps; the median step's seconds, the first left out."""
    with tempfile.TemporaryDirectory(prefix="reinforge-threads-") as folder:
        command = [sys.executable, "-m", "reinforge", "train", "examples/arithmetic.toml",
                   f"run.steps={steps}", f"run.checkpoint_every={steps + 1}",
                   f"run.dir={folder}", "run.name=r", *overrides]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, cwd=Path(__file__).parents[1])
        rows = (Path(folder) / "r" / "metrics.jsonl").read_text().splitlines()
        seconds = [json.loads(row)["time"]["total_s"] for row in rows][1:]
    return {"step_s": statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--main-job", type=int, metavar="STEPS")
    args = parser.parse_args()
    messages = [task.prompt for task in load_environment("arithmetic").tasks(32, seed=1)]
    settings = MAIN_JOB if args.main_job else SETTINGS
    cases = [(name, busy) for busy in (False, True) for name in settings]
    results: dict[str, dict[str, list[float]]] = {}
    for round_number in range(args.rounds):
        shift = round_number % len(cases)
        for name, busy in cases[shift:] + cases[:shift]:
            stop = multiprocessing.Event()
            neighbour = multiprocessing.Process(target=contend, args=(stop,)) if busy else None
            if neighbour is not None:
                neighbour.start()
            try:
                if args.main_job:
                    figures = train_once(MAIN_JOB[name], args.main_job)
                else:
                    figures = serve_once(SETTINGS[name], messages)
            finally:
                if neighbour is not None:
                    stop.set()
                    neighbour.join()
            key = f"{name}, {'beside a busy process' if busy else 'alone'}"
            for metric, value in figures.items():
                results.setdefault(key, {}).setdefault(metric, []).append(value)
            print(key, {k: round(v, 4) for k, v in figures.items()}, flush=True)
    print()
    for key, metrics in results.items():
        medians = {metric: round(statistics.median(v), 4) for metric, v in metrics.items()}
        print(f"{key:40} {medians}")
    if args.json is not None:
        report = {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
        args.json.write_text(json.dumps({**report, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
