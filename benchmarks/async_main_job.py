"""Does staleness cost learning? The main job in sync, async and partial mode, per seed.

Each run is `reinforge train examples/arithmetic.toml` (SmolLM2-135M, 40 steps) with
`loop.mode=MODE run.seed=SEED` (and `loop.max_staleness=1` but in sync mode). Off-policy
data could learn less per sample, so the comparison is reward against trained samples
(rollouts that reached the loss), not against steps or wall time; each mode runs the same
seeds, one after another (the reward does not depend on the machine's speed, but how
stale the data gets does).

    python benchmarks/async_main_job.py [--seeds 0 1] [--steps 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("sync", "async", "partial")


def train(mode: str, seed: int, steps: int, scratch: Path) -> list[dict]:
    name = f"{mode}-{seed}"
    staleness = [] if mode == "sync" else ["loop.max_staleness=1"]
    argv = [sys.executable, "-m", "reinforge", "train", "examples/arithmetic.toml",
            f"loop.mode={mode}", *staleness, f"run.seed={seed}",
            f"run.steps={steps}", f"run.dir={scratch}", f"run.name={name}"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    lines = (scratch / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def curve(rows: list[dict], blocks: int) -> dict:
    """Reward by blocks of steps, and at the samples trained so far (its x axis)."""
    size = max(len(rows) // blocks, 1)
    samples, seen = [], 0
    for row in rows:
        seen += row["trained_samples"]
        samples.append(seen)
    return {
        "reward_by_block": [
            statistics.fmean(r["reward_mean"] for r in rows[i : i + size])
            for i in range(0, len(rows), size)
        ],
        "trained_samples": samples,
        "reward": [r["reward_mean"] for r in rows],
        "staleness_mean": statistics.fmean(r["staleness_mean"] for r in rows),
        "dropped_stale": sum(r["dropped_stale"] for r in rows),
        "wall_s": sum(r["time"]["total_s"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, dict[str, dict]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        for seed in args.seeds:
            for mode in MODES:
                rows = train(mode, seed, args.steps, Path(scratch))
                results[mode][str(seed)] = curve(rows, args.blocks)
                found = results[mode][str(seed)]
                blocks = ", ".join(f"{r:.2f}" for r in found["reward_by_block"])
                print(
                    f"{mode:8s} seed {seed}: reward by block {blocks}  "
                    f"samples {found['trained_samples'][-1]}  "
                    f"staleness {found['staleness_mean']:.2f}  "
                    f"dropped {found['dropped_stale']}  wall {found['wall_s'] / 60:.1f} min",
                    flush=True,
                )
                if args.json:  # after every run, so a crash keeps the runs done so far
                    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
