"""Run directories as the dashboard reads them: found under a folder, summarised, and their
metrics from a given line on, which is what a page watching a live run asks for.

Nothing is cached: every request reads the files again, so a run that is training shows
its new steps, and the dashboard holds no state a restart could lose.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

METRICS = "metrics.jsonl"
EVAL_TRAJECTORIES = "trajectories.jsonl"
RUNNING_AT_LEAST_S = 60.0
"""A run whose files changed this recently is `running`; the bound grows to three times its
slowest step, so a run with long steps does not look stopped between two of them."""


@dataclass(frozen=True)
class RunDir:
    """A training or SFT run (`metrics.jsonl`) or an eval output (`trajectories.jsonl`).
    `id` is its path below the dashboard's folder, the name pages and the API use."""

    id: str
    path: Path
    kind: Literal["train", "eval"]


def find_runs(root: Path) -> list[RunDir]:
    """Every run below `root` (and `root` itself when it is one), at any depth: a benchmark
    may keep its runs in folders of its own."""
    runs = []
    for folder, subfolders, _ in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in ("checkpoints", "trajectories"))
        if _is_run(Path(folder)):
            runs.append(_run_dir(root, Path(folder)))
    return runs


def get_run(root: Path, run_id: str) -> RunDir | None:
    """The run named `run_id`, or None when there is none (or the name leaves `root`)."""
    path = (_names_base(root) / run_id).resolve()
    if not path.is_relative_to(root.resolve()):
        return None
    if _is_run(path):
        return _run_dir(root, path)
    return None


def _is_run(path: Path) -> bool:
    return (path / METRICS).is_file() or (path / EVAL_TRAJECTORIES).is_file()


def _names_base(root: Path) -> Path:
    """Runs are named by their path below `root`; when `root` is itself a run, below its
    parent, so the run has its folder's name."""
    return root.resolve().parent if _is_run(root) else root.resolve()


def _run_dir(root: Path, path: Path) -> RunDir:
    kind: Literal["train", "eval"] = "train" if (path / METRICS).is_file() else "eval"
    return RunDir(path.resolve().relative_to(_names_base(root)).as_posix(), path, kind)


def read_metrics(run: RunDir, since: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The metrics rows from line `since` on, and the count of complete lines. A line still
    being written (no newline yet) waits for the next poll. A resumed run rewrites the file
    shorter; then fewer than `since` lines are there and the caller starts over."""
    path = run.path / METRICS
    if run.kind != "train" or not path.is_file():
        return [], 0
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # the last piece is unfinished
    rows = [json.loads(line) for line in lines[since:] if line.strip()]
    return rows, len(lines)


def steps(run: RunDir) -> list[int]:
    """The steps with trajectories, in order; an eval has one file and no steps."""
    if run.kind == "eval":
        return []
    folder = run.path / "trajectories"
    return sorted(int(path.stem.removeprefix("step_")) for path in folder.glob("step_*.jsonl"))


def trajectory_file(run: RunDir, step: int | None) -> Path | None:
    """The file of `step` (an eval's only file when None); None when there is none yet."""
    if run.kind == "eval":
        return run.path / EVAL_TRAJECTORIES
    if step is None:
        return None
    path = run.path / "trajectories" / f"step_{step:05d}.jsonl"
    return path if path.is_file() else None


def config(run: RunDir) -> dict[str, Any]:
    """The run's resolved config (a training run) or its summary (an eval), as stored; {}
    before it is written."""
    name = "config.json" if run.kind == "train" else "summary.json"
    path = run.path / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def model_name(run: RunDir) -> str | None:
    stored = config(run)
    return stored.get("model", {}).get("name") if run.kind == "train" else stored.get("model")


def summary(run: RunDir) -> dict[str, Any]:
    """One row of the runs list: progress, the latest reward and pass rate, and status."""
    stored = config(run)
    if run.kind == "eval":
        done = _count_lines(run.path / EVAL_TRAJECTORIES)
        finished = bool(stored)
        return {
            **_common(run, done, None, finished, []),
            "model": stored.get("model"),
            "env": stored.get("environment"),
            "reward": stored.get("reward_mean"),
            "pass_rate": stored.get("pass_rate"),
        }
    rows, _ = read_metrics(run)
    last = rows[-1] if rows else {}
    total = stored.get("run", {}).get("steps")
    finished = total is not None and last.get("step", 0) >= total
    return {
        **_common(run, last.get("step", 0), total, finished, rows),
        "model": stored.get("model", {}).get("name"),
        "env": stored.get("env", {}).get("name"),
        "reward": last.get("reward_mean"),
        "pass_rate": last.get("pass_rate"),
    }


def _common(
    run: RunDir, done: int, total: int | None, finished: bool, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    updated = max(path.stat().st_mtime for path in run.path.iterdir())
    slowest = max((row.get("time", {}).get("total_s", 0.0) for row in rows), default=0.0)
    if finished:
        status = "finished"
    elif time.time() - updated < max(RUNNING_AT_LEAST_S, 3 * slowest):
        status = "running"
    else:
        status = "stopped"
    return {
        "id": run.id,
        "kind": run.kind,
        "done": done,
        "total": total,
        "status": status,
        "updated": updated,
    }


def _count_lines(path: Path) -> int:
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.endswith(b"\n") and line.strip())
