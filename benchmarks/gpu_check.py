"""The built-in engine and the trainer on a GPU, each property a PASS or FAIL line, in a few
minutes, downloading nothing.

For each engine dtype (float32, bfloat16), with the engine on `--device`:

- sampling: 4 chat prompts sampled together (temperature 1, seeded), then again with the
  same seeds after dropping the prefix cache: the same tokens must come out;
- log-probs: each sampled token's recorded log-prob equals, within the dtype's tolerance,
  its log-prob under one plain forward of the same model over the whole sequence;
- prefix cache: a next turn of each conversation finds its first turn in the cache;
- long batch: prompts of 20 to 2,000 tokens sampled together, every one answered, their
  log-probs as above;
- decode: tokens/s of one request, then of 32 at once (more in all than one alone), and on
  CUDA beside the ceiling the memory bandwidth sets (each decode step reads every weight).

Then the trainer, built as a run builds it, on a fixed synthetic batch (the default GRPO
loss, advantages +-1, behaviour log-probs the policy's own): in float32 and under bf16
autocast its loss stays finite and falls over a few steps and its weights change; FSDP2 at
world size 1 (gloo on the CPU, NCCL on CUDA) does the same and starts from the one-process
trainer's loss; and a float32 engine sampling the trainer's own weights on the same device
samples the stepped weights, token-exact, once the step is pushed.

Last, the engine a run builds on the device with nothing set: it samples in bfloat16 on
CUDA and float32 on the CPU, its KV budget is its share of the memory free, and with a
budget too small for one long request that request fails alone while the others finish.

`--random-weights FOLDER` builds the model from FOLDER's config and tokenizer with seeded
random weights (what `gpu_check.sh` does: the GPU machine has no trained weights); none of
the checks needs trained ones. `--quick` does less of each (a CPU rehearsal).

Prints a line per check and the results as JSON, written to `--out`; exits 1 when a check
fails and 2 when something it needs is missing (one line saying what).

    benchmarks/gpu_check.sh                                  # on the GPU machine
    benchmarks/gpu_check.sh --dry-run --out /tmp/gpu_check.json   # rehearsed on this CPU
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

try:  # the machine may lack one of reinforge's dependencies (gpu_check.sh installs them)
    import torch
    import transformers
    from pydantic import ValidationError

    from reinforge.errors import UsageError, first_problem
    from reinforge.orchestrate.weight_sync import SharedWeights
    from reinforge.policy.chat import ChatFormat
    from reinforge.policy.config import EngineConfig, ModelConfig
    from reinforge.policy.engine import Engine
    from reinforge.policy.engine_thread import Completion
    from reinforge.policy.memory import OutOfMemory, free_memory
    from reinforge.policy.models import (
        cache_dir,
        load_tokenizer,
        model_folder,
        quiet_progress,
        resolve_device,
    )
    from reinforge.policy.sampling import SamplingParams
    from reinforge.policy.specs import BUILTIN_MODELS, DEFAULT_MODEL
    from reinforge.train.batching import TrainBatch
    from reinforge.train.config import OptimConfig, TrainerConfig
    from reinforge.train.logprobs import selective_logprobs
    from reinforge.train.ranks import LocalRanks
    from reinforge.train.sharded import RankTrainer, TrainerRanks
    from reinforge.train.trainer import PolicyTrainer, Trainer, TrainerSpec, build_trainer
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
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5}
"""Most a recorded log-prob may differ from the plain forward's: the batched, cached
decode and one forward over the whole sequence round differently, far more in bf16 (on
CPU, SmolLM2-135M: up to 2e-5 in float32; up to 0.22, 0.04 on average, in bfloat16)."""
FSDP_TOLERANCE = 1e-3
"""Most FSDP2's first loss may differ from the one-process trainer's, relative."""
DTYPES = ("float32", "bfloat16")
SHORTEST_PROMPT = 20
TRAIN_LR = 1e-4
"""The trainer checks' learning rate: ten times the default, so that a few steps move the
loss well past float rounding."""


@dataclass(frozen=True)
class Sizes:
    """How much each check does."""

    sampled_tokens: int
    decode_tokens: int
    concurrent: int
    long_prompts: int
    longest_prompt: int
    long_tokens: int
    train_rows: int
    train_tokens: int
    """Each row's, half prompt and half sampled."""
    train_steps: int


FULL = Sizes(32, 128, 32, 16, 2000, 16, 32, 96, 4)
QUICK = Sizes(16, 16, 32, 6, 400, 4, 8, 48, 3)
"""A CPU rehearsal's: fewer and shorter."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="a model.device value (default cuda)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model.name value")
    parser.add_argument(
        "--random-weights",
        type=Path,
        metavar="FOLDER",
        help="build the model from FOLDER's config with random weights",
    )
    parser.add_argument("--layers", type=int, help="with --random-weights: this many layers")
    parser.add_argument("--quick", action="store_true", help="less of each check (a CPU run)")
    parser.add_argument("--installed", type=Path, help="pip's report of what was installed")
    parser.add_argument("--out", default="benchmarks/gpu_check-results.json")
    args = parser.parse_args()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        spec, weights = args.model, "trained"
        if args.random_weights is not None:
            spec = str(random_model(args.random_weights, args.layers, Path(scratch)))
            weights = f"random (seed 0) from {args.random_weights / 'config.json'}"
            print(f"gpu_check: the model's weights are {weights}, not trained ones")
        problem = find_problem(spec, args.device)
        if problem is not None:
            print(f"gpu_check: {problem}", file=sys.stderr)
            return 2
        model = ModelConfig(name=spec, device=args.device)
        results = describe(model, weights, args.installed)
        if args.random_weights is not None:  # not the scratch folder's name
            results["model"] = f"{args.random_weights.name}, {layer_count(spec)} layers"
        results["checks"] = run_checks(model, FULL if not args.quick else QUICK)
    return report(results, Path(args.out))


def random_model(config_folder: Path, layers: int | None, scratch: Path) -> Path:
    """A model folder in `scratch`: `config_folder`'s config (`layers` of its layers, if
    given) and tokenizer files, and seeded random weights."""
    folder = scratch / "model"
    folder.mkdir()
    for file in config_folder.iterdir():
        if file.is_file():
            shutil.copy2(file, folder / file.name)
    config = transformers.AutoConfig.from_pretrained(folder)
    if layers is not None:
        config.num_hidden_layers = layers
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with quiet_progress():
        model.save_pretrained(folder)
    return folder


def layer_count(folder: str) -> int:
    return transformers.AutoConfig.from_pretrained(folder).num_hidden_layers


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


def describe(model: ModelConfig, weights: str, installed: Path | None) -> dict[str, Any]:
    """The machine and the software the check ran on: what it had, and what it needed
    installed (pip's report, from the bundle)."""
    device = resolve_device(model.device)
    results: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name(device),
        "model": model.name,
        "weights": weights,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "packages": sorted({f"{d.metadata['Name']}=={d.version}" for d in distributions()}),
    }
    if installed is not None:
        report = json.loads(installed.read_text(encoding="utf-8"))
        results["installed"] = [
            f"{item['metadata']['name']}=={item['metadata']['version']}"
            for item in report["install"]
        ]
    return results


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def run_checks(model: ModelConfig, sizes: Sizes) -> dict[str, dict[str, Any]]:
    checks: dict[str, dict[str, Any]] = {}
    device = resolve_device(model.device)
    for dtype in DTYPES:
        engine = Engine.from_spec(model.name, EngineConfig(dtype=dtype), device)
        try:
            for name, check in engine_checks(engine, sizes).items():
                checks[f"{name} {dtype}"] = check
        finally:
            engine.close()
    first_losses = {}
    for precision in DTYPES:
        trainer = build_trainer(Trainer, trainer_spec(model, precision))
        batch = on_policy(trainer.model, synthetic_batch(trainer.model.config.vocab_size, sizes))
        checks[f"train {precision}"] = train_check(trainer, batch, sizes.train_steps)
        first_losses[precision] = checks[f"train {precision}"]["losses"][0]
        del trainer
    checks["fsdp2 world size 1"] = fsdp_check(model, sizes, first_losses["float32"])
    checks["engine and trainer share the device"] = shared_check(model, sizes)
    checks["engine defaults"] = defaults_check(model, sizes)
    return checks


# -- the engine ----------------------------------------------------------------------------


def engine_checks(engine: Engine, sizes: Sizes) -> dict[str, dict[str, Any]]:
    """Sampling, log-prob, prefix-cache, long-batch and decode checks of one engine."""
    chat = ChatFormat(engine.tokenizer)
    tolerance = TOLERANCE[dtype_name(engine)]
    prompts = [chat.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
    first = sample(engine, prompts, sizes.sampled_tokens, seed=0)
    # An empty update drops the prefix cache, so the second draw computes exactly as the
    # first (from cached states a prompt rounds differently, which in bf16 flips tokens).
    engine.update_weights({})
    again = sample(engine, prompts, sizes.sampled_tokens, seed=0)
    same = [c.token_ids for c in first] == [c.token_ids for c in again]
    sampling = {"passed": same, "prompts": len(prompts), "tokens": tokens(first)}

    follow_up = chat.prompt_ids([{"role": "user", "content": "Go on."}])
    turns = [[*p, *c.token_ids, *follow_up] for p, c in zip(prompts, again, strict=True)]
    cached_before = engine.stats.cached_tokens
    next_turns = sample(engine, turns, sizes.sampled_tokens, seed=1)
    cached = engine.stats.cached_tokens - cached_before
    first_turns = sum(len(p) for p in prompts)
    prefix = {"passed": cached >= first_turns, "cached_tokens": cached,
              "first_turn_prompt_tokens": first_turns}  # fmt: skip

    diffs = logprob_diffs(engine, [*prompts, *turns], [*first, *next_turns])
    logprobs = logprob_check(diffs, tolerance)
    return {
        "sampling": sampling,
        "log-probs": logprobs,
        "prefix cache": prefix,
        "long batch": long_batch_check(engine, sizes, tolerance),
        "decode": decode_check(engine, chat, sizes),
    }


def dtype_name(engine: Engine) -> str:
    return str(next(engine.model.parameters()).dtype).removeprefix("torch.")


def logprob_check(diffs: list[float], tolerance: float) -> dict[str, Any]:
    return {
        "passed": bool(diffs) and max(diffs) <= tolerance,
        "tokens": len(diffs),
        "max_abs_diff": max(diffs, default=math.nan),
        "mean_abs_diff": statistics.fmean(diffs) if diffs else math.nan,
        "tolerance": tolerance,
    }


def long_batch_check(engine: Engine, sizes: Sizes, tolerance: float) -> dict[str, Any]:
    """Prompts of 20 tokens to `sizes.longest_prompt`, random tokens, sampled together."""
    generator = torch.Generator().manual_seed(3)
    vocab = engine.model.config.vocab_size
    step = (sizes.longest_prompt - SHORTEST_PROMPT) / max(sizes.long_prompts - 1, 1)
    lengths = [round(SHORTEST_PROMPT + i * step) for i in range(sizes.long_prompts)]
    prompts = [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]
    started = time.perf_counter()
    completions = sample(engine, prompts, sizes.long_tokens, seed=5)
    seconds = time.perf_counter() - started
    answered = sum(
        len(c.token_ids) == sizes.long_tokens or c.finish_reason == "stop" for c in completions
    )
    diffs = logprob_diffs(engine, prompts, completions)
    logprobs = logprob_check(diffs, tolerance)
    return {
        "passed": answered == len(prompts) and logprobs["passed"],
        "prompt_tokens": [min(lengths), max(lengths)],
        "prompts": len(prompts),
        "answered": answered,
        "seconds": round(seconds, 3),
        "logprob_max_abs_diff": logprobs["max_abs_diff"],
        "tolerance": tolerance,
    }


def decode_check(engine: Engine, chat: ChatFormat, sizes: Sizes) -> dict[str, Any]:
    """Tokens/s of one request and of `sizes.concurrent` at once, after a warm-up;
    tokens counted as returned (a completion may end early at EOS), prefill included."""
    prompt = [chat.prompt_ids([{"role": "user", "content": PROMPTS[2]}])]
    sample(engine, prompt * 2, 8, seed=1)  # warm-up: kernels, allocator
    one = decode_speed(engine, prompt, sizes.decode_tokens)
    many = decode_speed(engine, prompt * sizes.concurrent, sizes.decode_tokens)
    result: dict[str, Any] = {
        "passed": many["tokens_per_s"] > one["tokens_per_s"],
        "tokens_per_s batch 1": one["tokens_per_s"],
        f"tokens_per_s batch {sizes.concurrent}": many["tokens_per_s"],
        "batch 1": one,
        f"batch {sizes.concurrent}": many,
    }
    steps_per_s = bandwidth_steps_per_s(engine)
    if steps_per_s is None:
        result["bandwidth_ceiling"] = "unknown: torch tells no memory bandwidth here"
        return result
    # Each decode step reads every weight once at the least: the fastest a step can be.
    result["bandwidth_ceiling_steps_per_s"] = round(steps_per_s)
    for batch, measured in ((1, one), (sizes.concurrent, many)):
        share = measured["tokens_per_s"] / (batch * steps_per_s)
        result[f"of_ceiling batch {batch}"] = round(share, 4)
        result["passed"] &= share <= 1  # above it, tokens were miscounted
    return result


def bandwidth_steps_per_s(engine: Engine) -> float | None:
    """Decode steps a second the device's memory bandwidth allows at most, where torch
    tells its memory clock and bus width (CUDA)."""
    if engine.device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(engine.device)
    clock_khz = getattr(properties, "memory_clock_rate", 0)
    bus_bits = getattr(properties, "memory_bus_width", 0)
    if not clock_khz or not bus_bits:
        return None
    bytes_per_s = 2 * clock_khz * 1e3 * bus_bits / 8  # double data rate
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    return bytes_per_s / weights


def decode_speed(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    started = time.perf_counter()
    completions = sample(engine, prompts, max_tokens, seed=2)
    seconds = time.perf_counter() - started
    count = tokens(completions)
    return {"tokens": count, "seconds": round(seconds, 3), "tokens_per_s": round(count / seconds)}


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
    futures: list[Future[Completion]] = [
        engine.submit(prompt, SamplingParams(max_tokens, 1.0, 1.0, False, seed=seed + i))
        for i, prompt in enumerate(prompts)
    ]
    return [future.result() for future in futures]


def tokens(completions: list[Completion]) -> int:
    return sum(len(c.token_ids) for c in completions)


# -- the trainer ---------------------------------------------------------------------------


def trainer_spec(model: ModelConfig, precision: str, world_size: int = 1) -> TrainerSpec:
    config = TrainerConfig(precision=precision, world_size=world_size)
    return TrainerSpec(model.name, config, OptimConfig(lr=TRAIN_LR), 100, device=model.device)


def train_check(trainer: PolicyTrainer, batch: TrainBatch, steps: int) -> dict[str, Any]:
    """`steps` trainer steps on `batch`: finite losses, the last below the first, and
    weights that moved."""
    before = weights_digest(trainer)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for _ in range(steps):
        started = time.perf_counter()
        losses.append(trainer.step(batch).loss)
        synchronize()
        times.append(time.perf_counter() - started)
    changed = weights_digest(trainer) != before
    finite = all(math.isfinite(loss) for loss in losses)
    result: dict[str, Any] = {
        "passed": finite and losses[-1] < losses[0] and changed,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "losses": losses,
        "weights_changed": changed,
        "step_s": [round(t, 3) for t in times],
        "median_step_s": round(statistics.median(times[1:] or times), 3),
    }
    if torch.cuda.is_available():
        result["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return result


def weights_digest(trainer: PolicyTrainer) -> str:
    """A hash of the trainer's complete weights, as it writes them for the engines (a
    sharded trainer gathers them from its ranks)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-weights-") as scratch:
        path = Path(scratch) / "weights.safetensors"
        trainer.write_weights(path)
        return hashlib.sha256(path.read_bytes()).hexdigest()


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def fsdp_check(model: ModelConfig, sizes: Sizes, plain_first_loss: float) -> dict[str, Any]:
    """The sharded trainer (FSDP2) as a run starts it, in one rank process, on the float32
    check's batch: its first loss is the one-process trainer's."""
    spec = trainer_spec(model, "float32", world_size=1)
    reference = build_trainer(Trainer, spec)  # for the batch's behaviour log-probs
    batch = on_policy(reference.model, synthetic_batch(reference.model.config.vocab_size, sizes))
    del reference
    ranks = TrainerRanks(LocalRanks(spec.config, RankTrainer, spec))
    try:
        result = train_check(ranks, batch, sizes.train_steps)
    finally:
        ranks.close()
    gap = abs(result["losses"][0] - plain_first_loss) / max(abs(plain_first_loss), 1e-6)
    result["backend"] = "nccl" if torch.cuda.is_available() else "gloo"
    result["first_loss_vs_one_process"] = gap
    result["passed"] = result["passed"] and gap <= FSDP_TOLERANCE
    return result


def shared_check(model: ModelConfig, sizes: Sizes) -> dict[str, Any]:
    """A float32 engine sampling the trainer's own model on the same device, as a run's
    in-process engine does: after a step pushed, it samples the new weights, token-exact."""
    trainer = build_trainer(Trainer, trainer_spec(model, "float32"))
    engine = Engine(trainer.model, load_tokenizer(model.name), model.name, EngineConfig())
    sync = SharedWeights(engine)
    try:
        chat = ChatFormat(engine.tokenizer)
        prompts = [chat.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
        before = sample(engine, prompts, sizes.sampled_tokens, seed=0)
        batch = on_policy(trainer.model, synthetic_batch(trainer.model.config.vocab_size, sizes))
        with sync.training(trainer):
            loss = trainer.step(batch).loss
        sync.push(trainer, version=1)
        after = sample(engine, prompts, sizes.sampled_tokens, seed=0)
        diffs = logprob_diffs(engine, prompts, after)
        logprobs = logprob_check(diffs, TOLERANCE["float32"])
        moved = [c.logprobs for c in after] != [c.logprobs for c in before]
        versions = {v for c in after for v in c.policy_versions}
        result: dict[str, Any] = {
            "passed": logprobs["passed"] and moved and versions == {1} and math.isfinite(loss),
            "sampled_from_version": sorted(versions),
            "logprobs_moved": moved,
            "logprob_max_abs_diff": logprobs["max_abs_diff"],
            "loss": loss,
        }
        if torch.cuda.is_available():
            result["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
        return result
    finally:
        engine.close()


def defaults_check(
    model: ModelConfig, sizes: Sizes, config: EngineConfig | None = None
) -> dict[str, Any]:
    """The engine of a config that sets nothing (`config` builds another, to show the
    check fails on it): its dtype for the device, its KV budget a share of the memory
    free; then, on a budget that holds the short prompts but not a long one, the long
    request fails alone and the short ones finish."""
    device = resolve_device(model.device)
    config = config or EngineConfig()
    engine = Engine.from_spec(model.name, config, device)
    free = free_memory(device)
    engine.close()
    dtype, wanted = dtype_name(engine), EngineConfig().dtype_on(device.type == "cuda")
    budget = engine.kv_budget.max_bytes
    share = budget / free if free else math.nan
    chat = ChatFormat(engine.tokenizer)
    short = [chat.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
    fits = max(len(p) for p in short) + sizes.sampled_tokens
    small = engine.kv_budget.token_bytes * fits * len(short)  # the short ones, together
    long = list(range(3, 3 + fits * len(short)))  # more than that, with its own tokens
    tight = Engine(engine.model, engine.tokenizer, model.name, config, kv_budget_bytes=small)
    try:
        params = SamplingParams(sizes.sampled_tokens, 1.0, 1.0, False, seed=0)
        futures = [tight.submit(p, params) for p in [*short[:2], long, *short[2:]]]
        outcomes = [future.exception() or future.result() for future in futures]
    finally:
        tight.close()
    failed = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, BaseException)]
    alone = failed == [2] and isinstance(outcomes[2], OutOfMemory)
    # the budget is taken after the weights load; the free memory read after it can only
    # be as large when nothing else took memory meanwhile: allow a tenth either way
    fraction = config.kv_memory_fraction
    return {
        "passed": dtype == wanted and 0 < share <= fraction * 1.1 and alone,
        "dtype": dtype,
        "dtype_wanted": wanted,
        "kv_budget_mib": round(budget / 2**20),
        "kv_budget_share_of_free": round(share, 3),
        "kv_memory_fraction": fraction,
        "long_request_failed_alone": alone,
        "long_request_error": str(outcomes[2]) if 2 in failed else None,
    }


def synthetic_batch(vocab: int, sizes: Sizes) -> TrainBatch:
    """`sizes.train_rows` sequences (groups of 4) of random tokens, the second half of each
    sampled, advantages alternating +1 and -1."""
    generator = torch.Generator().manual_seed(0)
    half = sizes.train_tokens // 2
    trajectories = [
        Trajectory(
            task_id=f"t{i // 4}",
            group_id=f"t{i // 4}",
            index=i % 4,
            token_ids=torch.randint(3, vocab, (2 * half,), generator=generator).tolist(),
            loss_mask=[0] * half + [1] * half,
            logprobs=[0.0] * half,  # replaced by the policy's own (`on_policy`)
        )
        for i in range(sizes.train_rows)
    ]
    advantages = [1.0 if i % 2 else -1.0 for i in range(sizes.train_rows)]
    return TrainBatch.from_trajectories(trajectories, advantages)


def on_policy(model: torch.nn.Module, batch: TrainBatch) -> TrainBatch:
    """`batch` with the policy's own log-probs as the behaviour's: importance ratios of 1,
    as at a synchronous GRPO step."""
    moved = batch.to(model.device)
    with torch.no_grad():
        own, _ = selective_logprobs(
            model, moved.input_ids, moved.attention_mask, moved.target_mask, moved.targets
        )
    return replace(batch, behaviour_logprobs=own.cpu())


# -- the verdict ---------------------------------------------------------------------------


def report(results: dict[str, Any], out: Path) -> int:
    """A PASS or FAIL line per check, the JSON to `out` and stdout; 1 if any failed."""
    checks = results["checks"]
    results["passed"] = all(check["passed"] for check in checks.values())
    text = json.dumps(results, indent=2)
    out.write_text(text + "\n", encoding="utf-8")
    print(text)
    for name, check in checks.items():
        print(f"{'PASS' if check['passed'] else 'FAIL'} {name}: {summary(check)}")
    print(f"gpu_check: {'passed' if results['passed'] else 'FAILED'}; results in {out}")
    return 0 if results["passed"] else 1


def summary(check: dict[str, Any]) -> str:
    """The check's scalar numbers, on one line."""
    return ", ".join(
        f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in check.items()
        if key != "passed" and isinstance(value, int | float | str)
    )


if __name__ == "__main__":
    sys.exit(main())
