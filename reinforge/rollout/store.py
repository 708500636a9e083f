"""Trajectories on disk: one JSON object per line, written as rollouts finish so a crash
loses at most the groups in flight, and read back wherever a command left them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from reinforge.errors import UsageError, first_problem
from reinforge.types import Group, Record, Trajectory


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

    def write_summary(self, summary: Record) -> Path:
        path = self.directory / "summary.json"
        path.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    def close(self) -> None:
        self._file.close()


def trajectory_files(path: Path) -> list[Path]:
    """The JSONL files a path names: itself, an eval output's trajectories.jsonl, or a
    training run's trajectories/*.jsonl. Raises UsageError when it is none of these."""
    if path.is_file():
        return [path]
    if (path / "trajectories.jsonl").is_file():
        return [path / "trajectories.jsonl"]
    if steps := sorted((path / "trajectories").glob("*.jsonl")):
        return steps
    if path.is_dir():
        raise UsageError(f"{path} holds neither trajectories.jsonl nor trajectories/*.jsonl")
    raise UsageError(f"no such file or folder: {path}")


def iter_trajectories(path: Path) -> Iterator[tuple[str, Trajectory]]:
    """Each trajectory of a JSONL file with where it was read (`path:line`), so a message
    about one of many files points at the line. Raises UsageError on a malformed line."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                trajectory = Trajectory.model_validate_json(line)
            except ValidationError as error:
                where, problem = first_problem(error)
                problem = f"{where}: {problem}" if where else problem
                raise UsageError(f"{path}:{number} is not a trajectory: {problem}") from error
            yield f"{path}:{number}", trajectory


def read_trajectories(path: Path) -> list[Trajectory]:
    return [trajectory for _, trajectory in iter_trajectories(path)]
