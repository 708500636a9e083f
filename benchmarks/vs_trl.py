"""reinforge vs TRL's GRPOTrainer (trl==1.16.0, pinned), side by side in one invocation.

Both systems train SmolLM2-135M-Instruct (fp32) on arithmetic (level 1, reward = the exact
answer only) for the same number of steps, each step on the same 8 tasks (reinforge's own
draw for that step, `env.tasks(8, seed=task_seed(seed, step))`) with 4 samples each, up to
48 new tokens, temperature 1, top_p 1, no top-k, lr 1e-5 constant, AdamW, grad clip 1.0,
no KL, GRPO advantages (group std) and the DAPO token-mean PPO-clip loss (0.2 / 0.28).
Each system runs in its own process, one after the other (the machine has 2 cores), so
its peak RSS is its own.

Reported per system: median seconds per step over the steady steps (the first two
dropped), the peak RSS of its process, the mean reward over the first 5, the last 5 and
all steps, and the step time as a multiple of the step's FLOP floor; and reinforge/TRL
ratios. The floor is 2 x params FLOPs per generated token plus 6 x params per token that
carries a gradient (the completion tokens of groups whose rewards differ), no padding,
divided by the best 2048^3 matmul rate measured in this run at the same thread count.

Reproduce (about 30 minutes on the 2-vCPU machine):

    python benchmarks/vs_trl.py --steps 40 --out benchmarks/vs_trl-results.json

Options: `--only trl|reinforge`, `--trl-bf16`, `--trl-gradient-checkpointing` (TRL
1.16's own default, off here so that the settings are identical), `--reinforge KEY=VALUE`
(repeatable, e.g. `--reinforge engine.dtype=bfloat16`), `--threads`, `--seed`.
The TRL side is `benchmarks/trl_grpo.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from reinforge.envs.registry import load_environment
from reinforge.orchestrate.rollouts import task_seed
from reinforge.policy.chat import ChatFormat
from reinforge.policy.models import default_model_folder, load_model
from reinforge.policy.specs import DEFAULT_MODEL
from reinforge.rollout.store import read_trajectories
from reinforge.types import Status

REPO = Path(__file__).resolve().parent.parent
TRL_VERSION = "1.16.0"
SYSTEMS = ("reinforge", "trl")
PROMPTS_PER_STEP = 8
GROUP_SIZE = 4
MAX_TOKENS = 48
LR = 1e-5
ENV_ARGS: dict[str, Any] = {"difficulty": 1, "format_weight": 0.0}
WARMUP_STEPS = 2
"""Steps dropped before the steady state: the first one pays for lazy initialisation."""
STEADY_MIN = 5
MATMUL_N = 2048

# What reinforge's run must use for the comparison to hold (read from its config.json);
# a `--reinforge` override that changes one is reported, not refused.
REINFORGE_EXPECTED: dict[str, Any] = {
    "model.name": DEFAULT_MODEL,
    "env.name": "arithmetic",
    "env.args": ENV_ARGS,
    "rollout.tasks_per_step": PROMPTS_PER_STEP,
    "rollout.rollouts_per_task": GROUP_SIZE,
    "env.max_tokens_per_turn": MAX_TOKENS,
    "rollout.sampling.temperature": 1.0,
    "rollout.sampling.top_p": 1.0,
    "optim.lr": LR,
    "optim.schedule": "constant",
    "optim.warmup_steps": 0,
    "optim.weight_decay": 0.0,
    "optim.grad_clip": 1.0,
    "trainer.algorithm.advantage.kind": "grpo",
    "trainer.algorithm.loss.kind": "ppo_clip",
    "trainer.algorithm.loss.eps_low": 0.2,
    "trainer.algorithm.loss.eps_high": 0.28,
    "trainer.algorithm.loss.max_ratio": None,
    "trainer.algorithm.loss.kl_coef": 0.0,
    "trainer.algorithm.loss.aggregation.kind": "token_mean",
}
# Newer fields, checked where the config has them (see `_config_differences`).
REINFORGE_EXPECTED_IF_PRESENT: dict[str, Any] = {
    "trainer.lora": None,
    "trainer.truncated": "keep",  # TRL: mask_truncated_completions=False
}
_ABSENT = object()


# ---- data ---------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One sampled completion, as either system reports it."""

    group: str
    """Which task (of this step) it answers; advantages are relative within a group."""
    prompt_tokens: int
    completion_tokens: int
    """Sampled tokens, up to and including EOS."""
    reward: float
    prompt: str
    """The task's text, to check that both systems saw the same tasks at each step."""
    usable: bool = True
    """False for a rollout that errored (reinforge leaves it out of the gradient)."""


@dataclass
class Step:
    step: int
    step_s: float
    rollouts: list[Rollout]
    backprop_tokens: float
    """Completion tokens the system ran backward through: reinforge skips groups whose
    rewards are all equal, TRL's loss covers every completion (with advantage 0)."""
    raw: dict[str, Any] = field(default_factory=dict)
    """The system's own log line for the step."""


@dataclass
class Usage:
    """What the system's process cost, from the outside."""

    returncode: int
    wall_s: float
    max_rss_bytes: int
    """`ru_maxrss` of the process (os.wait4): exact, for the process itself."""
    tree_rss_bytes: int
    """Largest sum of RSS over the process and its descendants, sampled every second."""
    descendants: int
    """Most descendants seen at once (0: a single process)."""

    @property
    def peak_rss_bytes(self) -> int:
        return max(self.max_rss_bytes, self.tree_rss_bytes)


@dataclass
class SystemRun:
    name: str
    command: list[str]
    usage: Usage
    steps: list[Step]
    setup: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="task order (both) and sampling")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, every process")
    parser.add_argument("--only", choices=SYSTEMS, help="run one system")
    parser.add_argument("--trl-bf16", action="store_true", help="TRL's bf16 mixed precision")
    parser.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL 1.16's default (less memory, slower); off unless given",
    )
    parser.add_argument(
        "--reinforge",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra `reinforge train` override, repeatable",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "vs_trl-results.json")
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep both runs' folders here (reinforge's checkpoints, for a held-out eval)",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    torch.set_num_threads(args.threads)

    folder, params, tasks = prepare(args.steps, args.seed)
    bf16 = args.trl_bf16 or any("bfloat16" in o for o in args.reinforge)
    dtypes = ["float32", "bfloat16"] if bf16 else ["float32"]
    matmul = {dtype: [matmul_flops(dtype)] for dtype in dtypes}
    _say(f"matmul {MATMUL_N}^3, {args.threads} threads: " + _rates(matmul))

    runs: dict[str, SystemRun] = {}
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as temporary:
        scratch = args.keep or Path(temporary)
        scratch.mkdir(parents=True, exist_ok=True)
        for name in SYSTEMS:
            if args.only and name != args.only:
                continue
            _say(f"--- {name}: {args.steps} steps")
            if name == "trl":
                run = run_trl(args, folder, tasks, scratch)
            else:
                run = run_reinforge(args, scratch)
            runs[name] = run
            _say(
                f"--- {name}: exit {run.usage.returncode}, {run.usage.wall_s:.0f} s, "
                f"peak RSS {run.usage.peak_rss_bytes / 2**30:.2f} GiB, {len(run.steps)} steps"
            )
    for dtype in dtypes:  # again after the runs: the same machine, later
        matmul[dtype].append(matmul_flops(dtype))
    _say(f"matmul {MATMUL_N}^3, {args.threads} threads, after the runs: " + _rates(matmul))

    peak = {dtype: max(m["best_flops"] for m in measured) for dtype, measured in matmul.items()}
    summaries = {name: summarize(run, params, peak) for name, run in runs.items()}
    ratios = compare(summaries)
    notes = run_notes(args.steps, runs) + task_differences(tasks, runs)
    print_table(summaries, ratios, peak, notes)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {
            "steps": args.steps,
            "seed": args.seed,
            "threads": args.threads,
            "prompts_per_step": PROMPTS_PER_STEP,
            "group_size": GROUP_SIZE,
            "max_tokens": MAX_TOKENS,
            "lr": LR,
            "env_args": ENV_ARGS,
            "trl_bf16": args.trl_bf16,
            "trl_gradient_checkpointing": args.trl_gradient_checkpointing,
            "reinforge_overrides": args.reinforge,
        },
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
        "model": {"spec": DEFAULT_MODEL, "folder": str(folder), "params": params},
        "matmul": matmul,
        "summary": summaries,
        "ratios_reinforge_over_trl": ratios,
        "notes": notes,
        "runs": {name: _run_json(run, params) for name, run in runs.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    _say(f"wrote {args.out}")
    return 0 if all(run.usage.returncode == 0 for run in runs.values()) else 1


# ---- the two systems ----------------------------------------------------------------------


def prepare(steps: int, seed: int) -> tuple[Path, int, list[dict[str, Any]]]:
    """The model folder (made once from the shipped GGUF), its parameter count, and every
    step's tasks as reinforge draws them, with the messages it sends and their token count.

    The parent loads the model only to count parameters and frees it before the runs."""
    model, tokenizer = load_model(DEFAULT_MODEL)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    del model
    chat = ChatFormat(tokenizer)
    env = load_environment("arithmetic", **ENV_ARGS)
    rows = []
    for step in range(steps):
        for task in env.tasks(PROMPTS_PER_STEP, seed=task_seed(seed, step)):
            messages = env.harness.initial_messages(task)
            rows.append(
                {
                    "step": step,
                    "task": len(rows),
                    "prompt": messages,
                    "answer": task.answer,
                    "prompt_tokens": len(chat.prompt_ids(messages)),
                }
            )
    return default_model_folder(), params, rows


def run_reinforge(args: argparse.Namespace, scratch: Path) -> SystemRun:
    """`reinforge train examples/arithmetic.toml` with this run's steps, seed and overrides;
    reads back metrics.jsonl (times, trained tokens) and the trajectories (rollouts)."""
    name = "vs-trl"
    command = [
        sys.executable,
        "-m",
        "reinforge",
        "train",
        "examples/arithmetic.toml",  # run at the repository root, so recorded as it is
        f"run.steps={args.steps}",
        f"run.seed={args.seed}",
        f"run.dir={scratch / 'reinforge'}",
        f"run.name={name}",
        f"run.checkpoint_every={args.steps}",  # one checkpoint, after the last step
        *args.reinforge,
    ]
    usage = run_measured(command, args.threads)
    run_dir = scratch / "reinforge" / name
    steps = []
    metrics_path = run_dir / "metrics.jsonl"
    lines = metrics_path.read_text().splitlines() if metrics_path.exists() else []
    for line in lines:
        metrics = json.loads(line)
        number = metrics["step"]  # counted from 1; this script counts steps from 0
        rollouts = _reinforge_rollouts(run_dir / "trajectories" / f"step_{number:05d}.jsonl")
        step = number - 1
        steps.append(
            Step(
                step=step,
                step_s=metrics["time"]["total_s"],
                rollouts=rollouts,
                backprop_tokens=float((metrics["train"] or {}).get("trained_tokens", 0.0)),
                raw=metrics,
            )
        )
    run = SystemRun("reinforge", command, usage, steps)
    config_path = run_dir / "config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        run.setup = {"config": config}
        run.warnings += [f"reinforge {d}" for d in _config_differences(config, args)]
    for step in steps:  # the metrics must agree with the trajectories read here
        numbers = step_numbers(step, params=0)
        logged = step.raw.get("completion_tokens_mean", 0.0) * len(step.rollouts)
        if abs(logged - numbers["generated_tokens"]) > 0.5:
            run.warnings.append(f"reinforge step {step.step}: token counts disagree")
        if step.backprop_tokens != numbers["signal_tokens"]:
            run.warnings.append(
                f"reinforge step {step.step}: trained {step.backprop_tokens:.0f} tokens, "
                f"{numbers['signal_tokens']} carry signal"
            )
    return run


def _reinforge_rollouts(path: Path) -> list[Rollout]:
    return [
        Rollout(
            group=t.group_id,
            prompt_tokens=len(t.token_ids) - t.completion_tokens,  # single turn
            completion_tokens=t.completion_tokens,
            reward=t.reward,
            prompt=_user_text(t.messages),
            usable=t.status in (Status.OK, Status.TRUNCATED),
        )
        for t in (read_trajectories(path) if path.exists() else [])
    ]


def _user_text(messages: list[dict[str, Any]]) -> str:
    return next((m["content"] for m in messages if m.get("role") == "user"), "")


def _config_differences(config: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Where reinforge's resolved config departs from what the TRL side runs with."""
    if_present = {
        **REINFORGE_EXPECTED_IF_PRESENT,
        "trainer.precision": "bfloat16" if args.trl_bf16 else "float32",
        "trainer.gradient_checkpointing": args.trl_gradient_checkpointing,
    }
    differences = []
    for path, expected in [*REINFORGE_EXPECTED.items(), *if_present.items()]:
        value: Any = config
        for key in path.split("."):
            value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT and path in if_present:
            continue
        if value != expected:
            shown = "absent" if value is _ABSENT else repr(value)
            differences.append(f"{path} = {shown}, the TRL side uses {expected!r}")
    return differences


def run_trl(
    args: argparse.Namespace, folder: Path, tasks: list[dict[str, Any]], scratch: Path
) -> SystemRun:
    """`benchmarks/trl_grpo.py` on the same tasks; reads back its per-step JSONL."""
    task_file = scratch / "trl-tasks.jsonl"
    task_file.write_text("".join(json.dumps(row) + "\n" for row in tasks))
    out = scratch / "trl-steps.jsonl"
    command = [
        sys.executable,
        "benchmarks/trl_grpo.py",
        f"--tasks={task_file}",
        f"--model={folder}",
        f"--steps={args.steps}",
        f"--out={out}",
        f"--output-dir={scratch / 'trl-trainer'}",
        f"--seed={args.seed}",
        f"--threads={args.threads}",
        f"--prompts-per-step={PROMPTS_PER_STEP}",
        f"--group-size={GROUP_SIZE}",
        f"--max-tokens={MAX_TOKENS}",
        f"--lr={LR}",
        *(["--bf16"] if args.trl_bf16 else []),
        *(["--gradient-checkpointing"] if args.trl_gradient_checkpointing else []),
    ]
    usage = run_measured(command, args.threads)
    run = SystemRun("trl", command, usage, [])
    for line in out.read_text().splitlines() if out.exists() else []:
        record = json.loads(line)
        if record["kind"] == "setup":
            run.setup = record
            checkpointing = record.get("model_activation_checkpointing")
            if checkpointing != args.trl_gradient_checkpointing:
                run.warnings.append(f"TRL's model has activation checkpointing {checkpointing}")
            match = record["prompt_tokens_match"]
            if match["same"] != match["tasks"]:
                run.warnings.append(
                    f"TRL tokenizes {match['tasks'] - match['same']} of {match['tasks']} "
                    "prompts differently from reinforge"
                )
        elif record["kind"] == "step":
            rollouts = [
                Rollout(
                    group=str(r["task"]),
                    prompt_tokens=r["prompt_tokens"],
                    completion_tokens=r["completion_tokens"],
                    reward=r["reward"],
                    prompt=_user_text(tasks[r["task"]]["prompt"]),
                )
                for r in record["rollouts"]
            ]
            run.steps.append(
                Step(
                    step=record["step"],
                    step_s=record["step_s"],
                    rollouts=rollouts,
                    backprop_tokens=float(sum(r.completion_tokens for r in rollouts)),
                    raw=record["logs"],
                )
            )
        elif record["kind"] == "end":
            run.setup["end"] = record["logs"]
    for step in run.steps:  # our reward must be TRL's logged reward
        logged = step.raw.get("reward")
        mine = statistics.fmean(r.reward for r in step.rollouts) if step.rollouts else None
        if logged is None or mine is None or abs(logged - mine) > 1e-6:
            run.warnings.append(f"TRL step {step.step}: logged reward {logged} != {mine}")
    return run


# ---- measuring ----------------------------------------------------------------------------


def run_measured(command: list[str], threads: int) -> Usage:
    """Run one system to completion in its own process and measure it from outside: wall
    time, `ru_maxrss` from os.wait4, and the RSS of its process tree sampled each second
    (ru_maxrss takes the max over children, not the sum, so children running at once
    would be missed). Its output streams to ours."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "COLUMNS": os.environ.get("COLUMNS", "160"),  # rich wraps progress lines at 80 in a pipe
    }
    _say("$ " + shlex.join(command))
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sys.stderr)
    sampler = _TreeRss(process.pid)
    sampler.start()
    _, status, rusage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    sampler.stop()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return Usage(
        returncode=process.returncode,
        wall_s=wall_s,
        max_rss_bytes=rusage.ru_maxrss * 1024,  # KiB on Linux
        tree_rss_bytes=sampler.peak_bytes,
        descendants=sampler.descendants,
    )


class _TreeRss(threading.Thread):
    """Samples the summed VmRSS of a process and its descendants, via /proc."""

    def __init__(self, pid: int, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.every_s = every_s
        self.peak_bytes = 0
        self.descendants = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            tree = _process_tree(self.pid)
            self.descendants = max(self.descendants, len(tree) - 1)
            self.peak_bytes = max(self.peak_bytes, sum(_rss_bytes(pid) for pid in tree))

    def stop(self) -> None:
        self._done.set()
        self.join()


def _process_tree(root: int) -> list[int]:
    tree, index = [root], 0
    while index < len(tree):
        pid = tree[index]
        index += 1
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                tree += [int(child) for child in children]
        except OSError:  # gone, or a kernel without CONFIG_PROC_CHILDREN
            continue
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def matmul_flops(dtype: str, repeats: int = 10) -> dict[str, float]:
    """FLOP/s of a 2048x2048 @ 2048x2048 matmul in this process (torch threads as set):
    the best of `repeats` is the rate the FLOP floor divides by, the median is for scale."""
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a = torch.randn(MATMUL_N, MATMUL_N).to(torch_dtype)
    b = torch.randn(MATMUL_N, MATMUL_N).to(torch_dtype)
    for _ in range(2):  # warm-up
        a @ b
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - started)
    flops = 2 * MATMUL_N**3
    return {
        "best_flops": flops / min(times),
        "median_flops": flops / statistics.median(times),
        "threads": torch.get_num_threads(),
    }


# ---- summarising --------------------------------------------------------------------------


def step_numbers(step: Step, params: int) -> dict[str, Any]:
    """One step's tokens, reward and FLOP floors.

    Tokens with signal are the completion tokens of groups whose (usable) rewards differ:
    the rest have advantage 0 and no gradient. Floors count 2 x params FLOPs per token a
    forward pass must see and 6 x params per token that needs forward and backward,
    attention ignored, no padding: `floor` counts completion tokens only (the definition);
    `floor_with_prompts` also counts each task's prompt once for sampling and once more for
    training if its group carries signal (a lower bound: no system need do less).
    """
    groups: dict[str, list[Rollout]] = {}
    for rollout in step.rollouts:
        groups.setdefault(rollout.group, []).append(rollout)
    generated = sum(r.completion_tokens for r in step.rollouts)
    prompts = sum(g[0].prompt_tokens for g in groups.values())
    signal = signal_prompts = zero_variance = 0
    for group in groups.values():
        rewards = {r.reward for r in group if r.usable}
        if len([r for r in group if r.usable]) < 2 or len(rewards) < 2:
            zero_variance += 1
            continue
        signal += sum(r.completion_tokens for r in group if r.usable)
        signal_prompts += group[0].prompt_tokens
    rewards = [r.reward for r in step.rollouts if r.usable]
    return {
        "step": step.step,
        "step_s": step.step_s,
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "rollouts": len(step.rollouts),
        "generated_tokens": generated,
        "signal_tokens": signal,
        "backprop_tokens": step.backprop_tokens,
        "prompt_tokens": prompts,
        "zero_variance_groups": zero_variance,
        "floor_flop": 2 * params * generated + 6 * params * signal,
        "floor_with_prompts_flop": 2 * params * (prompts + generated)
        + 6 * params * (signal_prompts + signal),
    }


def steady_range(n: int) -> range:
    """The steps timed: all but the first WARMUP_STEPS when that leaves STEADY_MIN, else all
    but the first (a short check run; the output says so)."""
    if n >= WARMUP_STEPS + STEADY_MIN:
        return range(WARMUP_STEPS, n)
    return range(1 if n >= 2 else 0, n)


def summarize(run: SystemRun, params: int, peak: dict[str, float]) -> dict[str, Any]:
    numbers = [step_numbers(step, params) for step in run.steps]
    steady = [numbers[i] for i in steady_range(len(numbers))]
    summary: dict[str, Any] = {
        "steps": len(numbers),
        "steady_steps": [n["step"] for n in steady],
        "steady_count": len(steady),
        "wall_s": run.usage.wall_s,
        "peak_rss_bytes": run.usage.peak_rss_bytes,
        "max_rss_bytes": run.usage.max_rss_bytes,
        "tree_rss_bytes": run.usage.tree_rss_bytes,
        "descendants": run.usage.descendants,
        "returncode": run.usage.returncode,
    }
    if not numbers:
        return summary
    times = [n["step_s"] for n in steady]
    rewards = [n["reward_mean"] for n in numbers]
    summary |= {
        "step_s_median": statistics.median(times),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "reward_first5": statistics.fmean(rewards[:5]),
        "reward_last5": statistics.fmean(rewards[-5:]),
        "reward_all": statistics.fmean(rewards),
        "completion_tokens_per_rollout": statistics.fmean(
            n["generated_tokens"] / max(n["rollouts"], 1) for n in numbers
        ),
    }
    for key in ("generated_tokens", "signal_tokens", "backprop_tokens", "prompt_tokens"):
        summary[f"{key}_per_step"] = statistics.fmean(n[key] for n in steady)
    for dtype, flops in peak.items():
        for floor in ("floor", "floor_with_prompts"):
            floors = [n[f"{floor}_flop"] / flops for n in steady]  # seconds
            multiples = [n["step_s"] / f for n, f in zip(steady, floors, strict=True) if f > 0]
            summary[f"{floor}_s_{dtype}"] = statistics.median(floors)
            summary[f"step_over_{floor}_{dtype}"] = (
                statistics.median(multiples) if multiples else None
            )
    return summary


def compare(summaries: dict[str, dict[str, Any]]) -> dict[str, float]:
    """reinforge / TRL for the costs; below 1 means reinforge is cheaper."""
    if set(summaries) != set(SYSTEMS):
        return {}
    ours, theirs = summaries["reinforge"], summaries["trl"]
    ratios = {}
    for key in ("step_s_median", "peak_rss_bytes", "wall_s"):
        if ours.get(key) and theirs.get(key):
            ratios[key] = ours[key] / theirs[key]
    return ratios


def run_notes(steps: int, runs: dict[str, SystemRun]) -> list[str]:
    notes = [warning for run in runs.values() for warning in run.warnings]
    for run in runs.values():
        if run.usage.returncode != 0:
            notes.append(f"{run.name} exited with {run.usage.returncode}")
        if len(run.steps) != steps:
            notes.append(f"{run.name} recorded {len(run.steps)} of {steps} steps")
    done = min((len(run.steps) for run in runs.values()), default=0)
    if 0 < done < WARMUP_STEPS + STEADY_MIN:
        timed = steady_range(done)
        notes.append(
            f"short run: {done} step(s), so step times are over steps {timed.start + 1}-{done}"
            f" (not >= {STEADY_MIN} steady steps after {WARMUP_STEPS} dropped): indicative only"
        )
    if 0 < done < 10:
        notes.append("fewer than 10 steps: the first-5 and last-5 rewards overlap")
    return notes


def task_differences(tasks: list[dict[str, Any]], runs: dict[str, SystemRun]) -> list[str]:
    """Steps where a system's rollouts did not answer exactly the tasks drawn for that step,
    each `GROUP_SIZE` times."""
    expected: dict[int, list[str]] = {}
    for row in tasks:
        expected.setdefault(row["step"], []).extend([_user_text(row["prompt"])] * GROUP_SIZE)
    notes = []
    for run in runs.values():
        wrong = [
            step.step
            for step in run.steps
            if sorted(r.prompt for r in step.rollouts) != sorted(expected.get(step.step, []))
        ]
        if wrong:
            notes.append(f"{run.name}: steps {wrong} did not sample this step's tasks")
    return notes


def print_table(
    summaries: dict[str, dict[str, Any]],
    ratios: dict[str, float],
    peak: dict[str, float],
    notes: list[str],
) -> None:
    names = [name for name in SYSTEMS if name in summaries]
    heads = {"reinforge": "reinforge", "trl": f"TRL {TRL_VERSION}"}

    def row(label: str, key: str, fmt: str, scale: float = 1.0, ratio: str = "") -> None:
        cells = []
        for name in names:
            value = summaries[name].get(key)
            if isinstance(value, int | float):
                cells.append(f"{value * scale if scale != 1.0 else value:{fmt}}")
            else:
                cells.append("-")
        last = f"{ratios[ratio]:.2f}x" if ratio in ratios else ""
        print(f"{label:40s}" + "".join(f"{c:>14s}" for c in cells) + f"{last:>16s}")

    print()
    print(f"{'':40s}" + "".join(f"{heads[n]:>14s}" for n in names) + f"{'reinforge/TRL':>16s}")
    row("steps", "steps", "d")
    row("  steady steps timed", "steady_count", "d")
    row("median step, s (steady steps)", "step_s_median", ".1f", ratio="step_s_median")
    row("  fastest step, s", "step_s_min", ".1f")
    row("  slowest step, s", "step_s_max", ".1f")
    row("wall time of the process, s", "wall_s", ".0f", ratio="wall_s")
    row("peak RSS, GiB", "peak_rss_bytes", ".2f", 1 / 2**30, ratio="peak_rss_bytes")
    row("reward, first 5 steps", "reward_first5", ".3f")
    row("reward, last 5 steps", "reward_last5", ".3f")
    row("reward, all steps", "reward_all", ".3f")
    row("completion tokens / rollout", "completion_tokens_per_rollout", ".1f")
    row("generated tokens / step", "generated_tokens_per_step", ".0f")
    row("tokens with signal / step", "signal_tokens_per_step", ".0f")
    row("tokens run backward / step", "backprop_tokens_per_step", ".0f")
    for dtype, flops in peak.items():
        print(f"FLOP floor at the {dtype} matmul peak, {flops / 1e9:.0f} GFLOP/s:")
        row("  floor, s / step", f"floor_s_{dtype}", ".2f")
        row("  step / floor", f"step_over_floor_{dtype}", ".0f")
        row("  floor incl. prompt tokens, s / step", f"floor_with_prompts_s_{dtype}", ".2f")
        row("  step / floor incl. prompt tokens", f"step_over_floor_with_prompts_{dtype}", ".0f")
    for note in notes:
        print(f"note: {note}")


def _run_json(run: SystemRun, params: int) -> dict[str, Any]:
    """Everything a reader needs to recompute the summary."""
    return {
        "command": shlex.join(run.command),
        "usage": asdict(run.usage),
        "setup": run.setup,
        "steps": [
            {
                **step_numbers(step, params),
                "raw": step.raw,
                "rollouts": [asdict(r) for r in step.rollouts],
            }
            for step in run.steps
        ],
    }


def _rates(matmul: dict[str, list[dict[str, float]]]) -> str:
    return ", ".join(
        f"{dtype} best {m[-1]['best_flops'] / 1e9:.0f} / median {m[-1]['median_flops'] / 1e9:.0f} "
        "GFLOP/s"
        for dtype, m in matmul.items()
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
