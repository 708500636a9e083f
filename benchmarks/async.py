"""The loop modes side by side: trained samples per minute of `loop.mode=sync`, `async` and
`partial` on a long-tailed agentic workload (`benchmarks/tail_env.py`), on this machine.

Each run is its own `python -m reinforge train` process in a fresh run directory, with
the same seed (so the same tasks at every step and the same grader delays for every slot)
and the same settings but the mode. The modes run in interleaved rounds, their order
rotating each round, because the shared machine drifts by 20% or more between minutes.

From each run's metrics.jsonl, with the first step left out (it starts with an empty pipeline, so
it measures the warm-up, not the steady state; model loading is outside `time.total_s`):
trained samples per minute = 60 x sum(trained_samples) / sum(time.total_s), the mean step
time, mean staleness, dropped groups, carried-over rollouts and the idle times of both
sides (`time.trainer_idle_s`: the trainer waiting for groups; `time.rollout_idle_s`: no
group in flight).

    python benchmarks/async.py --rounds 3 --steps 8 --json benchmarks/async-results.json

reproduces the figures in benchmarks/README.md (tiny-random: there the grader waits, which
an asynchronous loop can hide, dominate the CPU work). `--model smollm2-135m` runs the
real small model at the same settings (8 tasks x 4 rollouts, 64 tokens); each of its steps
costs minutes of CPU where the 2 cores are shared, so size `--steps` and `--max-tokens`
to the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENV = "benchmarks/tail_env.py"
MODES = ("sync", "async", "partial")
FIGURES = (
    "samples_per_min",
    "rollouts_per_min",
    "step_s",
    "staleness_mean",
    "dropped_stale",
    "carried_over",
    "trainer_idle_s",
    "rollout_idle_s",
    "train_s",
    "reward_mean",
)


def overrides(args: argparse.Namespace, mode: str, scratch: Path, name: str) -> list[str]:
    return [
        f"model.name={args.model}",
        f"env.name={ENV}",
        f"env.args.max_tokens={args.max_tokens}",
        f"rollout.tasks_per_step={args.tasks_per_step}",
        f"rollout.rollouts_per_task={args.rollouts_per_task}",
        f"run.steps={args.steps}",
        f"run.seed={args.seed}",
        f"run.checkpoint_every={args.steps}",  # one checkpoint, after the last step
        f"loop.mode={mode}",
        *([] if mode == "sync" else [f"loop.max_staleness={args.max_staleness}"]),
        *args.set,
        f"run.dir={scratch}",
        f"run.name={name}",
    ]


def train(args: argparse.Namespace, mode: str, scratch: Path, name: str) -> dict[str, Any]:
    """One run; its figures over steps 1.. and the process's wall time."""
    command = [sys.executable, "-m", "reinforge", "train", *overrides(args, mode, scratch, name)]
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    load = [load_before, os.getloadavg()[0]]  # 1-min load average: how shared the CPU was
    if done.returncode != 0:
        raise SystemExit(f"{mode}: reinforge train failed:\n{done.stderr[-4000:]}")
    metrics = (scratch / name / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in metrics.splitlines()]
    per_step = args.tasks_per_step * args.rollouts_per_task
    return {**figures(rows[1:] or rows, per_step), "wall_s": wall_s, "load": load, "steps": rows}


def figures(rows: list[dict[str, Any]], per_step: int) -> dict[str, float]:
    """`per_step`: the rollouts each step takes (its groups, zero-variance ones included)."""

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    total_s = sum(r["time"]["total_s"] for r in rows)
    samples = sum(r["trained_samples"] for r in rows)
    trained = [r for r in rows if r["trained_samples"]]
    return {
        "samples_per_min": 60 * samples / total_s if total_s > 0 else 0.0,
        # the same without the luck of which groups have equal rewards
        "rollouts_per_min": 60 * per_step * len(rows) / total_s if total_s > 0 else 0.0,
        "step_s": mean([r["time"]["total_s"] for r in rows]),
        # each step's per-token mean, weighted by the samples it trained
        "staleness_mean": sum(r["staleness_mean"] * r["trained_samples"] for r in trained)
        / max(samples, 1),
        "dropped_stale": sum(r["dropped_stale"] for r in rows),
        "carried_over": sum(r["carried_over"] for r in rows),
        "trainer_idle_s": mean([r["time"]["trainer_idle_s"] for r in rows]),
        "rollout_idle_s": mean([r["time"]["rollout_idle_s"] for r in rows]),
        "train_s": mean([r["time"]["train_s"] for r in rows]),
        "reward_mean": mean([r["reward_mean"] for r in rows]),
        "zero_variance_groups": sum(r["zero_variance_groups"] for r in rows),
    }


def summarize(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """Per mode: each figure's median over rounds and its per-round values; the ratio to
    sync of the medians and of each round (the modes of one round ran side by side)."""
    result: dict[str, Any] = {}
    for mode, by_round in runs.items():
        command = overrides(args, mode, Path("TMP"), "RUN")
        entry: dict[str, Any] = {"command": "python -m reinforge train " + " ".join(command)}
        for key in (*FIGURES, "zero_variance_groups", "wall_s"):
            values = [run[key] for run in by_round]
            entry[key] = statistics.median(values)
            entry[f"{key}_rounds"] = values
        entry["load_rounds"] = [run["load"] for run in by_round]
        entry["steps_rounds"] = [run["steps"] for run in by_round]
        result[mode] = entry
    for entry in result.values():
        for key, name in (("samples_per_min", "vs_sync"), ("rollouts_per_min", "rollouts_vs_sync")):
            sync = result["sync"]
            entry[name] = _ratio(entry[key], sync[key])
            rounds = zip(entry[f"{key}_rounds"], sync[f"{key}_rounds"], strict=True)
            entry[f"{name}_rounds"] = [_ratio(value, base) for value, base in rounds]
    return result


def _ratio(value: float, base: float) -> float:
    return value / base if base else float("nan")


def table(result: dict[str, Any]) -> str:
    rounds = len(result["sync"]["samples_per_min_rounds"])
    lines = [
        f"| mode | samples/min, {rounds} rounds | median | vs sync (per round) "
        "| rollouts/min vs sync | step s | staleness | dropped | carried over "
        "| trainer idle s | rollout idle s | train s | reward |",
        "|---" * 13 + "|",
    ]
    for mode, e in result.items():
        per_round = ", ".join(f"{v:.1f}" for v in e["samples_per_min_rounds"])
        ratios = ", ".join(f"{v:.2f}" for v in e["vs_sync_rounds"])
        lines.append(
            f"| {mode} | {per_round} | {e['samples_per_min']:.1f} | **{e['vs_sync']:.2f}x** "
            f"({ratios}) | {e['rollouts_vs_sync']:.2f}x | {e['step_s']:.1f} "
            f"| {e['staleness_mean']:.2f} "
            f"| {e['dropped_stale']:g} | {e['carried_over']:g} | {e['trainer_idle_s']:.1f} "
            f"| {e['rollout_idle_s']:.1f} | {e['train_s']:.1f} | {e['reward_mean']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--steps",
        type=int,
        default=6,
        help="per run; the first step is left out, and the second step of an async run "
        "trains groups already finished, so fewer than ~6 overstates the asynchronous modes",
    )
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--rollouts-per-task", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64, help="sampled tokens per turn")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra override"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is left out of the figures")

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="async-bench-") as temp:
        for round_ in range(args.rounds):
            order = MODES[round_ % 3 :] + MODES[: round_ % 3]
            for mode in order:
                run = train(args, mode, Path(temp), f"{mode}-{round_}")
                runs[mode].append(run)
                print(
                    f"round {round_ + 1} {mode}: {run['samples_per_min']:.1f} samples/min, "
                    f"step {run['step_s']:.1f} s, staleness {run['staleness_mean']:.2f}, "
                    f"dropped {run['dropped_stale']}, carried {run['carried_over']}, "
                    f"process {run['wall_s']:.0f} s, "
                    f"load {run['load'][0]:.1f} -> {run['load'][1]:.1f}",
                    flush=True,
                )
    result = summarize(runs, args)
    print()
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
