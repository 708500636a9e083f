"""The built-in engine and the trainer on a GPU: token-exactness, decode speed and one
trainer step of the default model, in a few minutes, installing and downloading nothing.

For each engine dtype (float32, bfloat16), with the engine on `--device`:

- token-exactness: 4 chat prompts sampled together (temperature 1, seeded, 32 tokens),
  then again with the same seeds, which must sample the same tokens, then a next turn of
  each conversation, whose prompt the prefix cache holds but for its new tokens. Each
  sampled token's recorded log-prob must equal, within the dtype's tolerance, its
  log-prob under one plain forward of the same model over the whole sequence on the same
  device (the engine's `prompt_logprobs`);
- decode tokens/s: one request of up to 128 tokens, then 32 at once, after a warm-up;
  tokens counted as returned (a completion may end early at EOS), prefill included.

Then one trainer step per precision (float32, bfloat16 autocast): the default GRPO loss
on a synthetic batch of 32 sequences of 96 tokens (48 prompt, 48 sampled, advantages +-1,
behaviour log-probs the policy's own), median of 3 steps after one warm-up.

Prints the results as JSON and writes them to `--out`; exits 1 when a check fails and 2
when something it needs is missing (one line saying what).

    benchmarks/gpu_check.sh                                  # on the GPU machine
    benchmarks/gpu_check.sh --device cpu --model tiny-random --out /tmp/gpu_check.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

try:  # the machine may lack one of reinforge's dependencies, and this check installs nothing
    import torch
    import transformers
    from pydantic import ValidationError

    from reinforge.errors import UsageError, first_problem
    from reinforge.policy.chat import ChatFormat
    from reinforge.policy.config import EngineConfig, ModelConfig
    from reinforge.policy.engine import Engine
    from reinforge.policy.engine_thread import Completion
    from reinforge.policy.models import cache_dir, model_folder, resolve_device
    from reinforge.policy.sampling import SamplingParams
    from reinforge.policy.specs import BUILTIN_MODELS, DEFAULT_MODEL
    from reinforge.train.batching import TrainBatch
    from reinforge.train.config import OptimConfig, TrainerConfig
    from reinforge.train.logprobs import selective_logprobs
    from reinforge.train.trainer import Trainer, TrainerSpec, build_trainer
    from reinforge.types import Trajectory
except ImportError as error:
    print(f"gpu_check: cannot import {error.name or error}", file=sys.stderr)
    sys.exit(2)

PROMPTS = [
    "What is 37 + 48? Answer with just the number.",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
]
LONG_PROMPT = "Write a long story about a lighthouse keeper and a storm."
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5}
"""Most a recorded log-prob may differ from the plain forward's: the batched, cached
decode and one forward over the whole sequence round differently, far more in bf16 (on
CPU, SmolLM2-135M: up to 2e-5 in float32; up to 0.22, 0.04 on average, in bfloat16)."""
SAMPLED_TOKENS = 32
DECODE_TOKENS = 128
CONCURRENT = 32
DTYPES = ("float32", "bfloat16")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="a model.device value (default cuda)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model.name value")
    parser.add_argument("--out", default="benchmarks/gpu_check-results.json")
    args = parser.parse_args()
    problem = find_problem(args.model, args.device)
    if problem is not None:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    model = ModelConfig(name=args.model, device=args.device)
    device = resolve_device(model.device)

    started = time.perf_counter()
    results: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "model": model.name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    for dtype in DTYPES:
        results[f"engine {dtype}"] = engine_check(model.name, dtype, device)
    for precision in DTYPES:
        results[f"train step {precision}"] = train_check(model, precision)
    results["seconds"] = round(time.perf_counter() - started, 1)
    engines = [results[f"engine {dtype}"] for dtype in DTYPES]
    results["passed"] = all(e["token_exact"] and e["seeds_repeat"] for e in engines)
    text = json.dumps(results, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if results["passed"] else 1


def find_problem(name: str, device: str) -> str | None:
    """What keeps the check from running, in one line: a device that is no valid
    `model.device` or not on this machine, or a model that is not on disk."""
    try:
        resolve_device(ModelConfig(name=name, device=device).device)
    except ValidationError as error:
        return f"--device {device}: {first_problem(error)[1]}"
    except UsageError as error:
        return str(error)
    try:
        model_folder(name)  # tiny-random too: it takes the default model's tokenizer
    except (UsageError, ImportError) as error:  # ImportError: no gguf to dequantize with
        problem = f"model {name}: {str(error).splitlines()[0]}"
        if name in BUILTIN_MODELS:
            problem += f"; or copy a dequantized {DEFAULT_MODEL} folder to {cache_dir()}/models/"
        return problem
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def engine_check(spec: str, dtype: str, device: torch.device) -> dict[str, Any]:
    """Token-exactness and decode speed of the built-in engine in `dtype` on `device`."""
    engine = Engine.from_spec(spec, EngineConfig(dtype=dtype), device)
    chat = ChatFormat(engine.tokenizer)
    try:
        prompts = [chat.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
        first = sample(engine, prompts, SAMPLED_TOKENS, seed=0)
        # An empty update drops the prefix cache, so the second draw computes exactly as the
        # first (from cached states a prompt rounds differently, which in bf16 flips tokens).
        engine.update_weights({})
        again = sample(engine, prompts, SAMPLED_TOKENS, seed=0)
        follow_up = chat.prompt_ids([{"role": "user", "content": "Go on."}])
        turns = [[*p, *c.token_ids, *follow_up] for p, c in zip(prompts, again, strict=True)]
        next_turns = sample(engine, turns, SAMPLED_TOKENS, seed=1)
        diffs = logprob_diffs(engine, [*prompts, *turns], [*first, *next_turns])
        long = [chat.prompt_ids([{"role": "user", "content": LONG_PROMPT}])]
        sample(engine, long * 2, 8, seed=1)  # warm-up: kernels, allocator
        return {
            "sampled_tokens": len(diffs),
            "prefix_cache_tokens": engine.stats.cached_tokens,
            "logprob_max_abs_diff": max(diffs),
            "logprob_mean_abs_diff": statistics.fmean(diffs),
            "tolerance": TOLERANCE[dtype],
            "token_exact": max(diffs) <= TOLERANCE[dtype],
            "seeds_repeat": [c.token_ids for c in first] == [c.token_ids for c in again],
            "decode batch 1": decode_speed(engine, long),
            f"decode {CONCURRENT} concurrent": decode_speed(engine, long * CONCURRENT),
        }
    finally:
        engine.close()


def logprob_diffs(
    engine: Engine, prompts: list[list[int]], completions: list[Completion]
) -> list[float]:
    """How far each sampled token's recorded log-prob is from a plain forward's."""
    diffs: list[float] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        scores = asyncio.run(engine.prompt_logprobs([*prompt, *completion.token_ids]))
        forward = scores.logprobs[len(prompt) - 1 :]  # those of the completion's tokens
        diffs += [abs(a - b) for a, b in zip(completion.logprobs, forward, strict=True)]
    return diffs


def sample(
    engine: Engine, prompts: list[list[int]], max_tokens: int, seed: int
) -> list[Completion]:
    """One completion per prompt, submitted together so that they decode as one batch."""
    futures = [
        engine.submit(prompt, SamplingParams(max_tokens, 1.0, 1.0, False, seed=seed + i))
        for i, prompt in enumerate(prompts)
    ]
    return [future.result() for future in futures]


def decode_speed(engine: Engine, prompts: list[list[int]]) -> dict[str, float]:
    started = time.perf_counter()
    completions = sample(engine, prompts, DECODE_TOKENS, seed=2)
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for c in completions)
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds)}


def train_check(model: ModelConfig, precision: str) -> dict[str, Any]:
    """Trainer steps on a synthetic batch, the trainer built as a run builds it."""
    config = TrainerConfig(precision=precision)
    spec = TrainerSpec(model.name, config, OptimConfig(), 4, device=model.device)
    trainer = build_trainer(Trainer, spec)
    batch = on_policy(trainer.model, synthetic_batch(trainer.model.config.vocab_size))
    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(trainer.device)
    times = []
    for _ in range(4):
        started = time.perf_counter()
        stats = trainer.step(batch)
        if cuda:
            torch.cuda.synchronize(trainer.device)
        times.append(time.perf_counter() - started)
    result: dict[str, Any] = {
        "step_s": [round(t, 3) for t in times],
        "median_step_s": round(statistics.median(times[1:]), 3),
        "trained_tokens": stats.trained_tokens,
    }
    if cuda:
        result["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(trainer.device) / 2**20)
    return result


def synthetic_batch(vocab: int) -> TrainBatch:
    """32 sequences (8 groups of 4) of 48 random prompt tokens and 48 sampled ones."""
    generator = torch.Generator().manual_seed(0)
    trajectories = [
        Trajectory(
            task_id=f"t{i // 4}",
            group_id=f"t{i // 4}",
            index=i % 4,
            token_ids=torch.randint(3, vocab, (96,), generator=generator).tolist(),
            loss_mask=[0] * 48 + [1] * 48,
            logprobs=[0.0] * 48,  # replaced by the policy's own (`on_policy`)
        )
        for i in range(32)
    ]
    return TrainBatch.from_trajectories(trajectories, [1.0 if i % 2 else -1.0 for i in range(32)])


def on_policy(model: torch.nn.Module, batch: TrainBatch) -> TrainBatch:
    """`batch` with the policy's own log-probs as the behaviour's: importance ratios of 1,
    as at a synchronous GRPO step."""
    moved = batch.to(model.device)
    with torch.no_grad():
        own, _ = selective_logprobs(
            model, moved.input_ids, moved.attention_mask, moved.target_mask, moved.targets
        )
    return replace(batch, behaviour_logprobs=own.cpu())


if __name__ == "__main__":
    sys.exit(main())
