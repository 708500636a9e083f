"""Writing rollouts to disk as they finish, so a crash loses at most the groups in flight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reinforge.types import Group, Trajectory


class RolloutWriter:
    """`DIR/trajectories.jsonl` (one trajectory per line) and `DIR/summary.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.trajectories_path = directory / "trajectories.jsonl"
        self._file = self.trajectories_path.open("w", encoding="utf-8")

    def write_group(self, group: Group) -> None:
        for trajectory in group.trajectories:
            self._file.write(trajectory.model_dump_json() + "\n")
        self._file.flush()

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.directory / "summary.json"
        path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        return path

    def close(self) -> None:
        self._file.close()


def read_trajectories(path: Path) -> list[Trajectory]:
    with path.open(encoding="utf-8") as lines:
        return [Trajectory.model_validate_json(line) for line in lines if line.strip()]
