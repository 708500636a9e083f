"""Decode steps through transformers' `DynamicCache` vs the engine's `roomy_cache`,
interleaved in one run on the same model, batch and prompts.

Each round prefills 32 prompts of 45 tokens and then decodes 48 tokens greedily through
each cache in turn (the order alternates between rounds); the figure is the median time of
a decode step, which is what the engine's rollouts are made of.

With `--join`, the figure is instead a join, the engine's merge of arriving rows into the
running batch (what a multi-turn episode does at every turn): 16 running rows of 500
columns and 4 arrivals of 520, in SmolLM2-135M's 30 layers of 3 key/value heads of 64,
then one appended column, as the next decode step writes. The engine's join into one room
(`Batch.merge`) against joining by `cat` after left-padding, which it did before (written
out here), the next append then making new room.

    python benchmarks/kv_cache.py [--rounds 5] [--dtype float32] [--join]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from reinforge.policy.batch import Batch
from reinforge.policy.kv_cache import roomy_cache
from reinforge.policy.models import load_model
from reinforge.policy.specs import DEFAULT_MODEL

BATCH, PROMPT, STEPS = 32, 45, 48
LAYERS, HEADS, DIM = 30, 3, 64
RUNNING, ARRIVING, WIDTH, ARRIVING_WIDTH = 16, 4, 500, 520


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


def join_s(by_cat: bool, dtype: torch.dtype, seed: int) -> float:
    """Seconds of one join and the append after it, in the engine's `Batch`, or with
    `by_cat` the way it joined before."""
    generator = torch.Generator().manual_seed(seed)

    def cache(rows: int, width: int) -> Cache:
        made = roomy_cache()
        for layer in range(LAYERS):
            states = torch.randn((rows, HEADS, width, DIM), generator=generator).to(dtype)
            made.update(states, states.clone(), layer)
        return made

    batch: Batch[int] = Batch()
    batch.merge(list(range(RUNNING)), cache(RUNNING, WIDTH), torch.ones(RUNNING, WIDTH))
    arrivals = cache(ARRIVING, ARRIVING_WIDTH)
    column = torch.zeros((RUNNING + ARRIVING, HEADS, 1, DIM), dtype=dtype)
    started = time.perf_counter()
    if by_cat:
        assert batch.cache is not None
        for old, new in zip(batch.cache.layers, arrivals.layers, strict=True):
            pad = (0, 0, ARRIVING_WIDTH - WIDTH, 0)
            old.keys = torch.cat([torch.nn.functional.pad(old.keys, pad), new.keys])
            old.values = torch.cat([torch.nn.functional.pad(old.values, pad), new.values])
    else:
        batch.merge(list(range(ARRIVING)), arrivals, torch.ones(ARRIVING, ARRIVING_WIDTH))
    assert batch.cache is not None
    for layer in range(LAYERS):
        batch.cache.update(column, column, layer)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--join", action="store_true", help="time a join instead")
    args = parser.parse_args()
    if args.join:
        joins(args.rounds, getattr(torch, args.dtype))
        return
    model, _ = load_model(DEFAULT_MODEL, args.dtype)
    caches: dict[str, Callable[[], Cache]] = {"DynamicCache": DynamicCache, "roomy": roomy_cache}
    ways = {name: partial(decode_step_s, model, make) for name, make in caches.items()}
    medians = interleaved(ways, args.rounds, "decode step")
    print(f"roomy / DynamicCache: {medians['roomy'] / medians['DynamicCache']:.2f}x")


def joins(rounds: int, dtype: torch.dtype) -> None:
    ways = {
        "by cat": partial(join_s, True, dtype),
        "into one room": partial(join_s, False, dtype),
    }
    medians = interleaved(ways, rounds, "join and append")
    print(f"into one room / by cat: {medians['into one room'] / medians['by cat']:.2f}x")


def interleaved(ways: dict[str, Callable[..., float]], rounds: int, what: str) -> dict[str, float]:
    """Each way's median seconds over `rounds`, the ways alternating in order from round to
    round so that the machine's load falls on all alike; each is called with `seed=round`."""
    results: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(rounds):
        order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
        for name in order:
            results[name].append(ways[name](seed=round_))
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{name} {results[name][-1] * 1000:.0f} ms" for name in ways),
            flush=True,
        )
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(f"{name:13s} median {what} {value * 1000:6.1f} ms")
    return medians


if __name__ == "__main__":
    main()
