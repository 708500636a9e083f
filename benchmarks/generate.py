"""Generation throughput, side by side in one run, on the same model and prompts.

Systems, each asked for the same 32 chat completions of up to 48 new tokens (temperature
1, top_p 1), in interleaved rounds so that machine noise hits all of them alike:

- `generate`: plain batched `model.generate` (fp32, left-padded batch of 32);
- `reinforge fp32` / `reinforge bf16`: `reinforge serve`, 32 concurrent HTTP requests;
- `transformers serve`: HF's own OpenAI-compatible server (`--continuous-batching`),
  32 concurrent HTTP requests.

Throughput counts generated tokens up to and including EOS (what a caller receives);
`generate` also decodes padding for rows that finished early, which is its cost, not
extra output.

    python benchmarks/generate.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

from reinforge.envs.registry import load_environment
from reinforge.policy.models import default_model_folder, load_model
from reinforge.policy.specs import DEFAULT_MODEL

REQUESTS = 32
MAX_TOKENS = 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    messages = [task.prompt for task in load_environment("arithmetic").tasks(REQUESTS, seed=1)]
    hf_folder = _sampling_copy(default_model_folder())
    systems: dict[str, Callable[[], int]] = {}
    servers: list[subprocess.Popen[bytes]] = []
    try:
        systems["generate"] = _plain_generate(messages)
        for dtype in ("float32", "bfloat16"):
            url, process = _start(
                [
                    sys.executable,
                    "-m",
                    "reinforge",
                    "serve",
                    "--model",
                    DEFAULT_MODEL,
                    "--dtype",
                    dtype,
                ],
                "/health",
            )
            servers.append(process)
            systems[f"reinforge {dtype}"] = _http(url, DEFAULT_MODEL, messages)
        url, process = _start(
            ["transformers", "serve", str(hf_folder), "--continuous-batching", "--device", "cpu"],
            "/health",
        )
        servers.append(process)
        systems["transformers serve"] = _http(url, str(hf_folder), messages)

        results: dict[str, list[float]] = {name: [] for name in systems}
        for run in systems.values():  # warm-up, not timed
            run()
        for round_number in range(args.rounds):
            for name, run in systems.items():
                started = time.perf_counter()
                tokens = run()
                rate = tokens / (time.perf_counter() - started)
                results[name].append(rate)
                print(
                    f"round {round_number + 1} {name:20s} {tokens:5d} tokens  {rate:7.1f} tok/s",
                    flush=True,
                )
    finally:
        for process in servers:
            process.terminate()
            process.wait(timeout=30)
        shutil.rmtree(hf_folder, ignore_errors=True)

    base = statistics.median(results["generate"])
    print(f"\n{'system':22s} {'median tok/s':>12s} {'vs generate':>12s}")
    summary = {}
    for name, rates in results.items():
        median = statistics.median(rates)
        summary[name] = {"tokens_per_s": rates, "median": median, "vs_generate": median / base}
        print(f"{name:22s} {median:12.1f} {median / base:11.2f}x")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


def _plain_generate(messages: list[list[dict]]) -> Callable[[], int]:
    model, tokenizer = load_model(DEFAULT_MODEL, "float32")
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


def _http(url: str, model: str, messages: list[list[dict]]) -> Callable[[], int]:
    async def one(client: httpx.AsyncClient, conversation: list[dict]) -> int:
        response = await client.post(
            f"{url}/v1/chat/completions",
            json={
                "model": model,
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


def _start(command: list[str], health: str) -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited with {process.returncode}")
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                return url, process
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError(f"{command} did not become healthy")


def _sampling_copy(folder: Path) -> Path:
    """A view of the model folder whose generation config samples: `transformers serve`
    decodes greedily otherwise, whatever the request's temperature."""
    copy = Path(tempfile.mkdtemp(prefix="reinforge-bench-"))
    for item in folder.iterdir():
        (copy / item.name).symlink_to(item)
    config_path = copy / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.unlink(missing_ok=True)
    config.update(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    config_path.write_text(json.dumps(config))
    return copy


if __name__ == "__main__":
    main()
