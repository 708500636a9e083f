"""One trainer step on SmolLM2-135M under each trainer option: time, peak memory, and how
far the trainer's log-probs are from the float32 sampler's.

Each option runs in its own process (peak RSS is per process: model, sampling and
training together), on the same batch: the main job's 8 arithmetic tasks x 4 completions
that the model samples itself at float32 with a fixed seed, up to 48 tokens each.

    python benchmarks/train_step.py --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

OPTIONS: dict[str, list[str]] = {
    "fp32": [],
    "fp32, micro-batch 1024": ["trainer.micro_batch_tokens=1024"],
    "fp32, micro-batch 512": ["trainer.micro_batch_tokens=512"],
    "fp32, gradient checkpointing": ["trainer.gradient_checkpointing=true"],
    "fp32, micro-batch 1024, checkpointing": [
        "trainer.micro_batch_tokens=1024",
        "trainer.gradient_checkpointing=true",
    ],
    "bf16 autocast": ['trainer.precision="bfloat16"'],
    "bf16 autocast, micro-batch 1024": [
        'trainer.precision="bfloat16"',
        "trainer.micro_batch_tokens=1024",
    ],
    "LoRA r16 (fp32)": ["trainer.lora.rank=16", "optim.lr=1e-4"],
    "LoRA r16, bf16 autocast": ["trainer.lora.rank=16", 'trainer.precision="bfloat16"'],
}


def sampled_batch(model: Any, tokenizer: Any) -> Any:
    """32 completions the model itself samples for 8 arithmetic tasks (fixed seed), with
    alternating +1/-1 advantages so every sequence trains."""
    import asyncio

    from reinforge.envs.registry import load_environment
    from reinforge.policy.client import PolicyClient
    from reinforge.policy.config import EngineConfig, SamplingConfig
    from reinforge.policy.engine import Engine
    from reinforge.rollout.config import RolloutConfig
    from reinforge.rollout.generator import generate_groups
    from reinforge.train.batching import TrainBatch

    async def sample() -> list[Any]:
        env = load_environment("arithmetic", difficulty=1)
        engine = Engine(model, tokenizer, "smollm2-135m", EngineConfig())
        client = PolicyClient.for_engine(engine, SamplingConfig())
        try:
            return await generate_groups(env, env.tasks(8, seed=0), client, RolloutConfig(), 4, 0)
        finally:
            await client.close()
            engine.close()

    trajectories = [t for group in asyncio.run(sample()) for t in group.trajectories]
    return TrainBatch.from_trajectories(
        trajectories, [1.0 if i % 2 else -1.0 for i in range(len(trajectories))]
    )


def one_option(overrides: list[str], steps: int) -> dict[str, Any]:
    """Runs in the child: time `steps` trainer steps; compare log-probs with the sampler's."""
    import torch

    from reinforge.config import Config, load_config
    from reinforge.train.logprobs import selective_logprobs
    from reinforge.train.trainable import load_trainable
    from reinforge.train.trainer import Trainer

    torch.manual_seed(0)
    config = load_config(Config, None, overrides)
    model, tokenizer = load_trainable("smollm2-135m", config.trainer)
    batch = sampled_batch(model, tokenizer)
    bf16 = config.trainer.precision == "bfloat16"
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        used, _ = selective_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.target_mask, batch.targets
        )
    drift = (used - batch.behaviour_logprobs)[batch.target_mask].abs()
    trainer = Trainer(model, config.trainer, config.optim, total_steps=steps)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        metrics = trainer.step(batch)
        times.append(time.perf_counter() - started)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "step_s": times,
        "median_step_s": statistics.median(times[1:] or times),
        "trained_tokens": metrics.trained_tokens,
        "padded_tokens": int(batch.attention_mask.sum()),
        "trainable_params": trainable,
        "logprob_drift_mean": float(drift.mean()),
        "logprob_drift_max": float(drift.max()),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per option (first dropped)")
    parser.add_argument("--only", nargs="*", help="option names to run (default: all)")
    parser.add_argument("--out", default="benchmarks/train_step-results.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_option(json.loads(args.child), args.steps)))
        return
    results: dict[str, Any] = {}
    for name in args.only or OPTIONS:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--steps",
                str(args.steps),
                "--child",
                json.dumps(OPTIONS[name]),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ},
        )
        results[name] = json.loads(child.stdout.strip().splitlines()[-1])
        r = results[name]
        print(
            f"{name:34s} step {r['median_step_s']:6.2f} s  peak RSS {r['peak_rss_gib']:5.2f} GiB  "
            f"log-prob drift mean {r['logprob_drift_mean']:.4f} max {r['logprob_drift_max']:.3f}",
            flush=True,
        )
    reference = results.get("fp32")
    if reference:
        print("\nratio to fp32 (step time, peak RSS):")
        for name, r in results.items():
            print(
                f"  {name:34s} {r['median_step_s'] / reference['median_step_s']:.2f}x  "
                f"{r['peak_rss_gib'] / reference['peak_rss_gib']:.2f}x"
            )
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
