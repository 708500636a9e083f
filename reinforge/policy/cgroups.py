"""Where the process's cgroup keeps a controller's files: torch sees neither the CPU quota
(`threads.py`) nor the memory limit (`memory.py`) that a container sets through them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_folders(controller: str, root: Path = CGROUP_ROOT) -> Iterator[tuple[Path, bool]]:
    """The folders of this process's cgroup that hold `controller`'s files (under `root`),
    each with whether it is cgroup v2's, whose one folder holds every controller."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            yield root / path.lstrip("/"), True
        elif controller in controllers.split(","):
            yield root / controllers / path.lstrip("/"), False


def read(path: Path) -> str | None:
    """A cgroup file's text, stripped; None where it is absent."""
    try:
        return path.read_text().strip()
    except OSError:
        return None
