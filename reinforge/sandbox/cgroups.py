"""Per-sandbox cgroups on v1, v2 and hybrid hosts, or nothing where the host forbids them.

Groups are created under the manager's own cgroup (so a limit set on the manager, e.g. by
a job scheduler, still bounds all its sandboxes) in a `reinforge/` child, one group per
sandbox named by its id. The id carries the owning manager's pid and start time, which is
what lets a later run find and remove the groups of a crashed one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT_NAME = "reinforge"
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mounts() -> tuple[dict[str, Path], Path | None]:
    """v1 mount point per controller, and the v2 mount point (unified or pure v2)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype, _, options = right.split()[:3]
            point = Path(left.split()[4])
            if fstype == "cgroup2":
                v2 = point
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option in V1_CONTROLLERS:
                        v1[option] = point
    return v1, v2


def _own_paths() -> tuple[dict[str, str], str | None]:
    """This process's cgroup path per v1 controller, and its v2 path."""
    v1: dict[str, str] = {}
    v2: str | None = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                v2 = path
            for name in controllers.split(","):
                v1[name] = path
    return v1, v2


@dataclass
class SandboxCgroup:
    """The groups of one sandbox: a directory per hierarchy, and what each can do."""

    dirs: list[Path]
    freeze_file: Path | None  # v1 freezer.state or v2 cgroup.freeze
    events_file: Path | None  # v2 cgroup.events (None on v1)
    kill_file: Path | None  # v2 cgroup.kill

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def start_freeze(self) -> None:
        assert self.freeze_file is not None
        _write(self.freeze_file, "1" if self.events_file else "FROZEN")

    def frozen(self) -> bool:
        if self.events_file is not None:
            return "frozen 1" in self.events_file.read_text()
        assert self.freeze_file is not None
        return self.freeze_file.read_text().strip() == "FROZEN"

    def thaw(self) -> None:
        if self.freeze_file is not None:
            with contextlib.suppress(OSError):
                _write(self.freeze_file, "0" if self.events_file else "THAWED")

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in Path(procs).read_text().split())
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this sandbox so far."""
        for d in self.dirs:
            for name in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError):
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def kill_all(self) -> None:
        """Kill every process in the groups; used when pid 1 is already gone (reaping)."""
        if self.kill_file is not None:
            with contextlib.suppress(OSError):
                _write(self.kill_file, "1")
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.thaw()  # frozen tasks die only once thawed

    def remove(self, wait_s: float = 2.0) -> bool:
        """rmdir every group, retrying while the last tasks finish exiting."""
        deadline = time.monotonic() + wait_s
        remaining = [d for d in self.dirs if d.exists()]
        while remaining:
            for d in list(remaining):
                try:
                    d.rmdir()
                    remaining.remove(d)
                except FileNotFoundError:
                    remaining.remove(d)
                except OSError:
                    pass
            if remaining:
                if time.monotonic() > deadline:
                    return False
                self.kill_all()
                time.sleep(0.005)
        return True


class Cgroups:
    """What this host lets us do with cgroups; `detect()` returns None when nothing."""

    def __init__(self, v1_roots: dict[str, Path], v2_root: Path | None, v2_controllers: set[str]):
        self.v1_roots = v1_roots
        self.v2_root = v2_root
        self.v2_controllers = v2_controllers

    @classmethod
    def detect(cls) -> Cgroups | None:
        v1_mounts, v2_mount = _mounts()
        v1_own, v2_own = _own_paths()
        v1_roots: dict[str, Path] = {}
        for name, point in v1_mounts.items():
            root = point / v1_own.get(name, "/").lstrip("/") / ROOT_NAME
            with contextlib.suppress(OSError):
                root.mkdir(exist_ok=True)
                v1_roots[name] = root
        v2_root: Path | None = None
        v2_controllers: set[str] = set()
        if v2_mount is not None and v2_own is not None:
            root = v2_mount / v2_own.lstrip("/") / ROOT_NAME
            try:
                root.mkdir(exist_ok=True)
                v2_root = root
                v2_controllers = cls._enable_v2_controllers(root)
            except OSError:
                v2_root = None
        if not v1_roots and v2_root is None:
            return None
        return cls(v1_roots, v2_root, v2_controllers)

    @staticmethod
    def _enable_v2_controllers(root: Path) -> set[str]:
        available = (root / "cgroup.controllers").read_text().split()
        wanted = [c for c in V2_CONTROLLERS if c in available]
        for name in wanted:
            with contextlib.suppress(OSError):
                _write(root / "cgroup.subtree_control", f"+{name}")
        return set((root / "cgroup.subtree_control").read_text().split())

    def has(self, controller: str) -> bool:
        return controller in self.v1_roots or controller in self.v2_controllers

    @property
    def can_freeze(self) -> bool:
        v2_freeze = self.v2_root is not None and (self.v2_root / "cgroup.freeze").exists()
        return "freezer" in self.v1_roots or v2_freeze

    def group(self, name: str) -> SandboxCgroup:
        """The groups named `name` (existing or not): for creation and for reaping."""
        dirs = [root / name for root in self.v1_roots.values()]
        freeze_file = events_file = kill_file = None
        if "freezer" in self.v1_roots:
            freeze_file = self.v1_roots["freezer"] / name / "freezer.state"
        if self.v2_root is not None:
            v2 = self.v2_root / name
            dirs.append(v2)
            kill_file = v2 / "cgroup.kill"
            if freeze_file is None:
                freeze_file, events_file = v2 / "cgroup.freeze", v2 / "cgroup.events"
        return SandboxCgroup(dirs, freeze_file, events_file, kill_file)

    def create(
        self, name: str, *, memory_bytes: int | None, pids: int | None, cpus: float | None
    ) -> SandboxCgroup:
        group = self.group(name)
        for d in group.dirs:
            d.mkdir()
        v1, v2 = self.v1_roots, self.v2_root
        if memory_bytes is not None:
            if "memory" in v1:
                _write(v1["memory"] / name / "memory.limit_in_bytes", str(memory_bytes))
                memsw = v1["memory"] / name / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    _write(memsw, str(memory_bytes))
            elif v2 is not None and "memory" in self.v2_controllers:
                _write(v2 / name / "memory.max", str(memory_bytes))
                _write(v2 / name / "memory.swap.max", "0")
        if pids is not None:
            if "pids" in v1:
                _write(v1["pids"] / name / "pids.max", str(pids))
            elif v2 is not None and "pids" in self.v2_controllers:
                _write(v2 / name / "pids.max", str(pids))
        if cpus is not None:
            quota = max(1000, int(cpus * 100_000))
            if "cpu" in v1:
                _write(v1["cpu"] / name / "cpu.cfs_period_us", "100000")
                _write(v1["cpu"] / name / "cpu.cfs_quota_us", str(quota))
            elif v2 is not None and "cpu" in self.v2_controllers:
                _write(v2 / name / "cpu.max", f"{quota} 100000")
        return group

    def names(self) -> set[str]:
        """Names of every sandbox group under our roots (live or left by a crash)."""
        roots = list(self.v1_roots.values()) + ([self.v2_root] if self.v2_root else [])
        found: set[str] = set()
        for root in roots:
            with contextlib.suppress(OSError):
                found.update(p.name for p in root.iterdir() if p.is_dir())
        return found
