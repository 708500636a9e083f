"""A trainer's forward and backward on SmolLM2-135M in float32 and under bf16 autocast, on
this machine's CPU: what `trainer.precision = "bfloat16"` costs where the CPU has no native
bf16 (its matmuls then run emulated), and saves where it has.

    python benchmarks/bf16_cpu.py --rounds 2 --json benchmarks/bf16_cpu-results.json

The ways alternate within each round; the first round is reported but not in the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from reinforge.policy.bf16 import native_bf16
from reinforge.policy.models import load_model
from reinforge.policy.specs import DEFAULT_MODEL
from reinforge.train.batching import TrainBatch
from reinforge.train.logprobs import selective_logprobs


def forward_backward_s(model: torch.nn.Module, batch: TrainBatch, bf16: bool) -> float:
    model.zero_grad()
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = selective_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.target_mask, batch.targets
        )
    logp.sum().backward()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per row")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    model, _ = load_model(DEFAULT_MODEL)
    model.train()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 40000, (args.rows, args.tokens), generator=generator)
    half = args.tokens // 2  # the second half of each row trains
    batch = TrainBatch.from_sequences(
        tokens.tolist(), [[0] * half + [1] * (args.tokens - half)] * args.rows
    )
    ways = {"float32": False, "bf16 autocast": True}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for round_ in range(args.rounds):
        for way in ways if round_ % 2 == 0 else list(ways)[::-1]:
            seconds[way].append(forward_backward_s(model, batch, ways[way]))
        print(f"round {round_}: " + ", ".join(f"{w} {s[-1]:.2f} s" for w, s in seconds.items()))
    medians = {way: statistics.median(s[1:] or s) for way, s in seconds.items()}
    ratio = medians["bf16 autocast"] / medians["float32"]
    print(f"native bf16: {native_bf16()}; bf16 autocast / float32: {ratio:.1f}x")
    if args.json:
        results = {
            "native_bf16": native_bf16(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "rows": args.rows,
            "tokens": args.tokens,
            "seconds": seconds,
            "median_s": medians,
            "ratio": ratio,
        }
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
