"""Where a run's GRPO steps spend their time, read from its run directory.

Every metrics line carries the step's wall time split on the trainer's side (`time`:
waiting for rollouts, training, the weight sync), the built-in engine's share of it when
it runs in the process (`model`: prefill, decode, busy, idle), and the mean seconds a
rollout spent in each part (`seconds`: the policy's replies, the environment's start, its
answers to the turns, its stop, where a sandbox task is graded, the rubric; and each
turn's). This prints them as two tables, the steps and the turns, with medians over the
steps (the first left out with `--skip-first`, since it pays for warm-up). Rollouts run
concurrently, so a rollout's parts are not shares of the step: `in flight` is the sum of
the step's rollouts' seconds over the step's rollout phase, the mean number running.

    python benchmarks/step_breakdown.py RUN_DIR [--skip-first] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

STEP_COLUMNS = {
    "step, s": lambda r: r["time"]["total_s"],
    "rollout phase, s": lambda r: r["time"]["trainer_idle_s"],
    "train, s": lambda r: r["time"]["train_s"],
    "sync, s": lambda r: r["time"]["sync_s"],
    "model prefill, s": lambda r: (r.get("model") or {}).get("prefill_s"),
    "model decode, s": lambda r: (r.get("model") or {}).get("decode_s"),
    "model idle, s": lambda r: (r.get("model") or {}).get("idle_s"),
    "rollouts": lambda r: r["rollouts"],
    "in flight": lambda r: r["rollouts"] * r["seconds"]["total_s"] / r["time"]["trainer_idle_s"],
    "rollout, s": lambda r: r["seconds"]["total_s"],
    "generate, s": lambda r: r["seconds"]["generate_s"],
    "start, s": lambda r: r["seconds"]["start_s"],
    "answers, s": lambda r: r["seconds"]["tools_s"],
    "stop (grading), s": lambda r: r["seconds"]["stop_s"],
    "score, s": lambda r: r["seconds"]["score_s"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--skip-first", action="store_true", help="leave step 1 out")
    parser.add_argument("--json", type=Path, help="write the tables here too")
    args = parser.parse_args()
    lines = (args.run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    if args.skip_first:
        rows = [r for r in rows if r["step"] > 1]
    if not rows:
        raise SystemExit(f"{args.run}: no steps to read")
    steps = {r["step"]: {name: column(r) for name, column in STEP_COLUMNS.items()} for r in rows}
    turns = _turns(rows)
    print(_table(["step", *STEP_COLUMNS], [[s, *v.values()] for s, v in steps.items()]))
    medians = [_median([v[name] for v in steps.values()]) for name in STEP_COLUMNS]
    print(_table(["", *STEP_COLUMNS], [["median", *medians]]))
    print(_table(["turn", "generate, s", "answer, s"], [[i + 1, *t] for i, t in enumerate(turns)]))
    if args.json:
        report = {"run": str(args.run), "steps": steps, "turns": turns}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _turns(rows: list[dict[str, Any]]) -> list[list[float]]:
    """Each turn's median over the steps of its mean generate and answer seconds."""
    count = max(len(r["seconds"]["turns"]) for r in rows)
    return [
        [
            _median(
                [r["seconds"]["turns"][i][part] for r in rows if len(r["seconds"]["turns"]) > i]
            )
            for part in ("generate_s", "env_s")
        ]
        for i in range(count)
    ]


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
