"""Decode steps through transformers' `DynamicCache` vs the engine's `roomy_cache`,
interleaved in one run on the same model, batch and prompts.

Each round prefills 32 prompts of 45 tokens and then decodes 48 tokens greedily through
each cache in turn (the order alternates between rounds); the figure is the median time of
a decode step, which is what the engine's rollouts are made of.

    python benchmarks/kv_cache.py [--rounds 5] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from reinforge.policy.kv_cache import roomy_cache
from reinforge.policy.models import load_model
from reinforge.policy.specs import DEFAULT_MODEL

BATCH, PROMPT, STEPS = 32, 45, 48


def decode_step_s(model: torch.nn.Module, make_cache: Callable[[], Cache], seed: int) -> float:
    """Median seconds per decode step over STEPS steps after one prefill."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, 20000, (BATCH, PROMPT), generator=generator)  # (B, P)
    mask = torch.ones_like(ids)  # (B, L)
    cache = make_cache()
    times = []
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1).logits
        for _ in range(STEPS):
            started = time.perf_counter()
            last = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            mask = torch.cat([mask, torch.ones((BATCH, 1), dtype=mask.dtype)], dim=1)
            logits = model(input_ids=last, attention_mask=mask, cache=cache).logits
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    model, _ = load_model(DEFAULT_MODEL, args.dtype)
    caches: dict[str, Callable[[], Cache]] = {"DynamicCache": DynamicCache, "roomy": roomy_cache}
    results: dict[str, list[float]] = {name: [] for name in caches}
    for round_ in range(args.rounds):
        order = list(caches) if round_ % 2 == 0 else list(reversed(caches))
        for name in order:
            results[name].append(decode_step_s(model, caches[name], seed=round_))
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{name} {results[name][-1] * 1000:.0f} ms" for name in caches),
            flush=True,
        )
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(f"{name:13s} median decode step {value * 1000:6.1f} ms")
    print(f"roomy / DynamicCache: {medians['roomy'] / medians['DynamicCache']:.2f}x")


if __name__ == "__main__":
    main()
