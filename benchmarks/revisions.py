"""Two revisions of reinforge side by side: does a change move the figures?

Each revision is checked out into a temporary git worktree and run from there (its own
code on PYTHONPATH, the same interpreter and packages), in interleaved rounds so that
machine noise hits both alike. Two workloads, each the revision's own command line:

- `eval`: `reinforge eval arithmetic --model smollm2-135m --tasks 32 --max-tokens 48`
  (the engine, server and rollout path); figure: sampled tokens/s from summary.json;
- `train`: the main job, `reinforge train examples/arithmetic.toml run.steps=3`;
  figure: median step seconds from metrics.jsonl (rollout + train + sync);
- `batches`: the trainer alone on a run's recorded batches, with `--batches RUN CONFIG
  [OVERRIDE ...]` (`benchmarks/trainer_batches.py`, this checkout's copy, run on each
  revision's code); figure: seconds for the batches.

    python benchmarks/revisions.py BASE [HEAD] [--rounds 3] [--workloads eval train]
        [--batches RUN CONFIG ...] [--json out.json]

HEAD defaults to the working tree as committed (`HEAD`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def checkout(revision: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(into), revision],
        check=True,
    )
    return into


def run(tree: Path, args: list[str]) -> str:
    """`python ARGS` on the revision's code in `tree`; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: python {' '.join(args)} failed:\n{done.stderr.decode()}")
    return done.stdout.decode()


def eval_tokens_per_s(tree: Path, scratch: Path) -> float:
    out = scratch / "eval"
    run(tree, ["-m", "reinforge", "eval", "arithmetic", "--model", "smollm2-135m", "--tasks", "32",
               "--max-tokens", "48", "--out", str(out)])  # fmt: skip
    return json.loads((out / "summary.json").read_text())["sampled_tokens_per_s"]


def train_step_s(tree: Path, scratch: Path) -> float:
    run(tree, ["-m", "reinforge", "train", "examples/arithmetic.toml", "run.steps=3",
               f"run.dir={scratch}", "run.name=r"])  # fmt: skip
    rows = (scratch / "r" / "metrics.jsonl").read_text().splitlines()
    return statistics.median(json.loads(row)["time"]["total_s"] for row in rows)


def batches_s(tree: Path, scratch: Path, batches: list[str]) -> float:
    out = run(tree, [str(REPO / "benchmarks" / "trainer_batches.py"), *batches])
    return json.loads(out.splitlines()[-1])["seconds"]


WORKLOADS = {"eval": ("eval tok/s", eval_tokens_per_s), "train": ("train step s", train_step_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=["eval", "train"],
                        choices=[*WORKLOADS, "batches"])  # fmt: skip
    parser.add_argument("--batches", nargs="+", metavar="ARG",
                        help="RUN CONFIG [OVERRIDE ...] for the `batches` workload")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if "batches" in args.workloads and not args.batches:
        parser.error("the batches workload needs --batches RUN CONFIG [OVERRIDE ...]")
    workloads = {
        label: workload for name, (label, workload) in WORKLOADS.items() if name in args.workloads
    }
    if "batches" in args.workloads:
        workloads["trainer batches s"] = partial(batches_s, batches=args.batches)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as temp:
        trees = {rev: checkout(rev, Path(temp) / f"tree{i}")
                 for i, rev in enumerate((args.base, args.head))}  # fmt: skip
        try:
            for round_ in range(args.rounds):
                for name, workload in workloads.items():
                    order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
                    for rev in order:
                        with tempfile.TemporaryDirectory() as scratch:
                            value = workload(trees[rev], Path(scratch))
                        results.setdefault(name, {}).setdefault(rev, []).append(value)
                        print(f"round {round_ + 1} {name} {rev}: {value:.2f}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(tree)], check=False)  # fmt: skip
    print(f"\n| workload | {args.base} (median) | {args.head} (median) | ratio |")
    print("|---|---|---|---|")
    for name, by_rev in results.items():
        base, head = (statistics.median(by_rev[r]) for r in (args.base, args.head))
        print(f"| {name} | {base:.2f} | {head:.2f} | {head / base:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
