"""GRPO's own gain on the agentic job: several training seeds from one warm-up, each
evaluated on the written held-out split with several eval seeds, and a paired bootstrap
over tasks for the mean gain.

A seed's gain on a task is its pass rate there minus the warm-up's; the job's gain is the
mean over seeds and tasks. The held-out tasks are few (18) and differ far more from each
other than seeds do, so the interval resamples tasks, keeping each task's warm-up and GRPO
rates paired. Every run and eval is kept under `--runs` and skipped when already there,
so an interrupted invocation picks up where it stopped; the JSON is rewritten after each.
With `--against` another invocation's JSON from the same warm-up and seeds, it adds this
recipe's gain minus that one's, paired by task the same way: two recipes' gains differ
less than each differs from zero, so only a paired interval can tell them apart.

    python benchmarks/coding_seeds.py --warmup runs/coding-sft --seeds 0 1 2 3 \
        --eval-seeds 0 1 2 3 --json benchmarks/coding_seeds-results.json \
        [--set engine.dtype=bfloat16 --set run.steps=9]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from reinforge.rollout.summary import SCORED

WRITTEN_SPLIT = [
    "--tasks", "18", "--rollouts", "4", "--env-arg", "split=test",
    "--env-arg", 'tiers=["easy"]', "--env-arg", 'tools=["bash","read_file"]',
    "--max-turns", "3", "--max-tokens", "192", "--temperature", "0.7",
]  # fmt: skip
"""The held-out eval of docs/coding-job.md, as its last command."""
GENERATED = re.compile(r"generated-(.+)-\d+$")
"""A generated task's id names its kind."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=Path, required=True, help="the SFT run directory")
    parser.add_argument("--config", default="examples/coding.toml")
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="run.seed values")
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--set", action="append", default=[], help="a KEY=VALUE override")
    parser.add_argument("--name", default="coding-seeds", help="run names start with this")
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--against", type=Path, help="another recipe's JSON, to compare")
    args = parser.parse_args()

    result: dict[str, Any] = {"command": _command(args), "warmup": {}, "seeds": {}}
    result["warmup"] = {"evals": _evals(args.warmup, args.eval_seeds, args.runs / args.name)}
    _write(args.json, result)
    for seed in args.seeds:
        run = args.runs / f"{args.name}-s{seed}"
        train_s = _train(args, seed, run)
        result["seeds"][str(seed)] = {
            "train_s": train_s,
            "steps": _steps(run),
            "groups_by_kind": _groups_by_kind(run),
            "evals": _evals(run, args.eval_seeds, run),
        }
        result["gain"] = _gain(result)
        if args.against:
            result["against"] = _against(result, json.loads(args.against.read_text()))
        _write(args.json, result)
        print(json.dumps({"seed": seed, **result["gain"]["by_seed"][str(seed)]}))
    print(json.dumps({k: v for k, v in result["gain"].items() if k != "by_task"}, indent=1))
    if args.against:
        print(json.dumps({"against": args.against.name, **result["against"]}))


def _train(args: argparse.Namespace, seed: int, run: Path) -> float | None:
    """Wall seconds of `reinforge train`; None when the run was already there."""
    if (run / "metrics.jsonl").exists() and any(run.glob("checkpoints/*")):
        return None
    command = [
        "reinforge", "train", args.config, "--overwrite", f"model.name={args.warmup}",
        f"run.seed={seed}", f"run.name={run.name}", f"run.dir={run.parent}", *args.set,
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def _evals(model: Path, eval_seeds: list[int], under: Path) -> dict[str, dict[str, list[int]]]:
    """Per eval seed, each task's passes and rollouts (as [passed, of])."""
    evals = {}
    for eval_seed in eval_seeds:
        out = under / f"eval-written-{eval_seed}"
        if not (out / "summary.json").exists():
            command = ["reinforge", "eval", "coding", "--model", str(model), *WRITTEN_SPLIT]
            command += ["--seed", str(eval_seed), "--out", str(out)]
            subprocess.run(command, check=True)
        evals[str(eval_seed)] = _per_task(out)
    return evals


def _per_task(out: Path) -> dict[str, list[int]]:
    threshold = json.loads((out / "summary.json").read_text())["pass_threshold"]
    tasks: dict[str, list[int]] = {}
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        trajectory = json.loads(line)
        counts = tasks.setdefault(trajectory["task_id"], [0, 0])
        counts[0] += _passed(trajectory, threshold)
        counts[1] += 1
    return tasks


def _passed(trajectory: dict[str, Any], threshold: float) -> bool:
    return trajectory["status"] in SCORED and (trajectory["reward"] or 0.0) >= threshold


def _steps(run: Path) -> list[dict[str, Any]]:
    """Each step's time and what it trained, from the run's metrics."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {
            "step": r["step"],
            "total_s": r["time"]["total_s"],
            "rollouts": r["rollouts"],
            "redrawn": r["redrawn"],
            "trained_samples": r["trained_samples"],
            "pass_rate": r["pass_rate"],
        }
        for r in rows
    ]


def _groups_by_kind(run: Path) -> dict[str, dict[str, int]]:
    """Over the run's steps, the groups GRPO sampled of each kind of task (a generated
    task's kind, or "written"): how many, and how many held both outcomes, the only ones
    that train. Where that share is low, a step's rollouts buy little signal."""
    first_step = (run / "metrics.jsonl").read_text().splitlines()[0]
    threshold = json.loads(first_step)["pass_threshold"]
    kinds: dict[str, dict[str, int]] = {}
    for path in sorted((run / "trajectories").glob("step_*.jsonl")):
        groups: dict[str, list[bool]] = {}
        for line in path.read_text().splitlines():
            trajectory = json.loads(line)
            groups.setdefault(trajectory["task_id"], []).append(_passed(trajectory, threshold))
        for task, outcomes in groups.items():
            generated = GENERATED.match(task)
            kind = generated.group(1) if generated else "written"
            counts = kinds.setdefault(kind, {"groups": 0, "varied": 0, "all_passed": 0})
            counts["groups"] += 1
            counts["varied"] += 0 < sum(outcomes) < len(outcomes)
            counts["all_passed"] += all(outcomes)
    return dict(sorted(kinds.items()))


def _rates(evals: dict[str, dict[str, list[int]]]) -> dict[str, float]:
    """Each task's pass rate over all the eval seeds."""
    passed: dict[str, list[int]] = {}
    for tasks in evals.values():
        for task, (p, n) in tasks.items():
            total = passed.setdefault(task, [0, 0])
            total[0] += p
            total[1] += n
    return {task: p / n for task, (p, n) in passed.items()}


def _gain(result: dict[str, Any]) -> dict[str, Any]:
    warmup = _rates(result["warmup"]["evals"])
    seeds = {seed: _rates(r["evals"]) for seed, r in result["seeds"].items()}
    tasks = sorted(warmup)
    if any(sorted(rates) != tasks for rates in seeds.values()):
        raise SystemExit("the evals drew different tasks: not the same held-out split")
    by_task = {t: statistics.mean(r[t] for r in seeds.values()) - warmup[t] for t in tasks}
    return {
        "warmup_pass": statistics.mean(warmup.values()),
        "by_seed": {
            seed: {
                "pass": statistics.mean(rates.values()),
                "gain": statistics.mean(rates[t] - warmup[t] for t in tasks),
            }
            for seed, rates in seeds.items()
        },
        "mean_gain": statistics.mean(by_task.values()),
        "ci95": _interval(by_task),
        "by_task": by_task,
    }


def _against(result: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """This recipe's gain minus `other`'s, task by task, over the seeds both ran."""
    if other["warmup"]["evals"] != result["warmup"]["evals"]:
        raise SystemExit("--against: another warm-up's evals; the gains would not pair")
    seeds = sorted(set(result["seeds"]) & set(other["seeds"]))
    if not seeds:
        return {"seeds": [], "difference": None, "ci95": None}
    ours = _gain({**result, "seeds": {s: result["seeds"][s] for s in seeds}})["by_task"]
    theirs = _gain({**other, "seeds": {s: other["seeds"][s] for s in seeds}})["by_task"]
    difference = {task: ours[task] - theirs[task] for task in ours}
    return {
        "seeds": seeds,
        "difference": statistics.mean(difference.values()),
        "ci95": _interval(difference),
    }


def _interval(by_task: dict[str, float]) -> list[float]:
    """The paired bootstrap's 95% interval of the mean over tasks, resampling tasks."""
    tasks, rng = sorted(by_task), random.Random(0)
    means = sorted(
        statistics.mean(by_task[rng.choice(tasks)] for _ in tasks) for _ in range(10_000)
    )
    return [means[249], means[9749]]


def _command(args: argparse.Namespace) -> list[str]:
    return [f"{k}={v}" for k, v in vars(args).items()]


def _write(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
