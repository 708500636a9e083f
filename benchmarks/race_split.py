"""Where a race of concurrent requests spends the built-in engine's time, part by part.

`generate.py` times a 32 x 48 race over HTTP on the wall clock; this splits the engine
thread's CPU time of the same race (the arithmetic prompts, up to 48 new tokens,
temperature 1, top_p 1) into the parts of an engine iteration:

- `step`: the decode step (`policy/decode.py`: matmuls, attention, the KV cache append);
- `prefill`: the forward over arrivals' prompts (`Engine._forward_new`);
- `prefill other`: the rest of `Engine._prefill` (prefix lookups, layout, merge);
- `sample`: `policy.sampling.sample`, for prefill and decode rows alike;
- `accept other`: the rest of `Engine._accept`: recording tokens, finish checks, keeping
  finished rows' states in the prefix cache;
- `retire`: `Batch.retire`, cutting finished rows out of the batch and its KV cache;
- `decode other`: the rest of `Engine._decode` (the mask's new column, positions, ids);
- `loop other`: the engine thread's CPU time outside those (taking requests, locks).

Each round runs every checkout (this one, and `--baseline DIR` as `before`) in its own
child process per dtype, in an order that rotates by round; a child loads the model,
runs one untimed race, then `--races` timed races with the prefix cache cleared before
each (every prompt prefilled, as a first rollout of a task is), and reports the thread's
CPU time per part and the wall time. Requests are seeded (seed = request index + 1000 x
race), so before and after must sample the same tokens: the digest of every race's
tokens is compared.

    python benchmarks/race_split.py --baseline ../before --rounds 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16")
REQUESTS = 32
MAX_TOKENS = 48
ACCEPT = ("accept other", "sample", "retire")
"""The parts of taking a step's tokens (sampling them, then `Engine._accept`), which both
`_prefill` and `_decode` do."""
PARTS = ("step", "prefill", "prefill other", *ACCEPT, "decode other", "loop other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--races", type=int, default=2, help="timed races per child")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--baseline", type=Path, help="another checkout, run as `before`")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("DTYPE", "SEED0"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.races)))
        return
    roots = {"now": ROOT}
    if args.baseline is not None:
        roots["before"] = args.baseline.resolve()
    runs = [(name, dtype) for dtype in args.dtypes for name in roots]
    results: dict[str, list[dict[str, Any]]] = {f"{n} {d}": [] for n, d in runs}
    load_start = os.getloadavg()[0]
    for round_number in range(args.rounds):
        shift = round_number % len(runs)
        for name, dtype in runs[shift:] + runs[:shift]:
            env = {**os.environ, "PYTHONPATH": str(roots[name]), "HF_HUB_OFFLINE": "1"}
            command = [sys.executable, __file__, "--child", dtype, str(1000 * round_number)]
            command += ["--races", str(args.races)]
            output = subprocess.run(
                command, env=env, cwd=roots[name], capture_output=True, text=True, check=True
            ).stdout
            races = json.loads(output.splitlines()[-1])
            results[f"{name} {dtype}"].extend(races)
            for race in races:
                cpu = race["cpu_s"]
                print(
                    f"round {round_number + 1} {name:6s} {dtype:8s} tokens {race['tokens']:4d}"
                    f"  cpu {race['engine_cpu_s']:5.2f} s ({race['tokens_per_cpu_s']:6.1f} tok/s)"
                    f"  wall {race['wall_s']:5.2f} s  "
                    + " ".join(f"{part} {cpu[part]:.3f}" for part in PARTS)
                    + f"  digest {race['digest']}",
                    flush=True,
                )
    summary = summarize(results, roots, args)
    summary["load_average"] = [load_start, os.getloadavg()[0]]
    print(json.dumps(summary["medians"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def summarize(
    results: dict[str, list[dict[str, Any]]], roots: dict[str, Path], args: argparse.Namespace
) -> dict[str, Any]:
    medians = {
        run: {
            "engine_cpu_s": statistics.median(r["engine_cpu_s"] for r in races),
            "tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] for r in races),
            "wall_s": statistics.median(r["wall_s"] for r in races),
            **{part: statistics.median(r["cpu_s"][part] for r in races) for part in PARTS},
        }
        for run, races in results.items()
    }
    summary: dict[str, Any] = {"medians": medians, "races": results}
    if "before" in roots:
        for dtype in args.dtypes:
            now, before = results[f"now {dtype}"], results[f"before {dtype}"]
            summary[f"same tokens {dtype}"] = [r["digest"] for r in now] == [
                r["digest"] for r in before
            ]
            summary[f"cpu ratios before/now {dtype}"] = [
                b["engine_cpu_s"] / n["engine_cpu_s"] for n, b in zip(now, before, strict=True)
            ]
    summary["settings"] = {
        "rounds": args.rounds,
        "races": args.races,
        "requests": REQUESTS,
        "max_tokens": MAX_TOKENS,
        "threads": 1,
        "baseline": str(args.baseline) if args.baseline else None,
        "cpus": os.cpu_count(),
    }
    return summary


def child(dtype: str, seed0: int, races: int) -> list[dict[str, Any]]:
    """Races in this process, with the checkout on PYTHONPATH; one dict per timed race."""
    import torch

    torch.set_num_threads(1)
    import reinforge.policy.batch as batch_module
    import reinforge.policy.engine as engine_module
    from reinforge.envs.registry import load_environment
    from reinforge.policy.config import EngineConfig
    from reinforge.policy.sampling import SamplingParams

    spent: dict[str, float] = {}

    def timed(name: str, function: Callable[..., Any], *inner: str) -> Callable[..., Any]:
        """Add `function`'s CPU time to `spent[name]`, less what the `inner` timers got
        during it."""

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started, nested = time.thread_time(), sum(spent.get(i, 0.0) for i in inner)
            try:
                return function(*args, **kwargs)
            finally:
                own = time.thread_time() - started
                own -= sum(spent.get(i, 0.0) for i in inner) - nested
                spent[name] = spent.get(name, 0.0) + own

        return wrapper

    engine_class = engine_module.Engine
    engine_module.sample = timed("sample", engine_module.sample)
    batch_module.Batch.retire = timed("retire", batch_module.Batch.retire)
    engine_class._accept = timed("accept other", engine_class._accept, "sample", "retire")
    engine_class._forward_new = timed("prefill", engine_class._forward_new)
    engine_class._prefill = timed("prefill other", engine_class._prefill, "prefill", *ACCEPT)
    engine_class._decode = timed("decode other", engine_class._decode, "step", *ACCEPT)
    engine = engine_class.from_spec("smollm2-135m", EngineConfig(dtype=dtype), torch.device("cpu"))
    engine._decode_step = timed("step", engine._decode_step)
    tokenizer = engine.tokenizer
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template(task.prompt, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        for task in load_environment("arithmetic").tasks(REQUESTS, seed=1)
    ]
    thread_cpu = _thread_cpu_reader(engine._thread)

    def race(seed0: int) -> list[list[int]]:
        futures = [
            engine.submit(
                prompt,
                SamplingParams(MAX_TOKENS, 1.0, 1.0, stop_loops=False, seed=seed0 + index),
            )
            for index, prompt in enumerate(prompts)
        ]
        tokens = [future.result().token_ids for future in futures]
        with engine._lock:  # a request resolves inside its step: wait for the step's end
            return tokens

    race(seed0 + 999)  # warm-up, not timed
    figures = []
    for number in range(races):
        engine._prefixes.clear()
        spent.clear()
        cpu_before, started = thread_cpu(), time.perf_counter()
        tokens = race(seed0 + 100 * number)
        wall, engine_cpu = time.perf_counter() - started, thread_cpu() - cpu_before
        parts = {part: spent.get(part, 0.0) for part in PARTS[:-1]}
        parts["loop other"] = engine_cpu - sum(parts.values())
        count = sum(len(t) for t in tokens)
        figures.append(
            {
                "tokens": count,
                "wall_s": wall,
                "engine_cpu_s": engine_cpu,
                "tokens_per_cpu_s": count / engine_cpu,
                "cpu_s": parts,
                "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
            }
        )
    engine.close()
    return figures


def _thread_cpu_reader(thread: Any) -> Callable[[], float]:
    """CPU seconds (user + system) of `thread` so far, read from /proc."""
    path = f"/proc/self/task/{thread.native_id}/stat"
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    return read


if __name__ == "__main__":
    main()
