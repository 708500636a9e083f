"""Leak-proofing: a state directory per sandbox, and reaping of what crashed runs left.

Each sandbox id is `<manager pid>-<manager start time>.<n>`, and its state directory
records its cgroups and pid 1. A manager is alive iff a process with that pid *and* that
start time exists, so a recycled pid never makes a stale sandbox look owned.
Normally nothing is left to reap: the helper dies with the manager (PDEATHSIG) and pid 1
dies with the helper. What remains after a SIGKILL are empty cgroups and state
directories, plus anything that outlived those signals, and `reap_stale` removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

from reinforge.sandbox.cgroups import Cgroups, SandboxCgroup


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/reinforge-sandbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "reinforge-sandbox"
    return Path(tempfile.gettempdir()) / f"reinforge-sandbox-{os.getuid()}"


def start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_tag(pid: int) -> str:
    return f"{pid}-{start_time(pid)}"


def owner_alive(sandbox_id: str) -> bool:
    """Whether the manager named by a sandbox id (or a bare owner tag) still runs."""
    pid, _, start = sandbox_id.split(".", 1)[0].partition("-")
    if not pid.isdigit():
        return True  # not ours: never touch it
    return str(start_time(int(pid))) == start


def record(
    state: Path, cgroup: SandboxCgroup | None, init_pid: int | None, init_start: int | None
) -> None:
    meta = {
        "cgroups": [str(d) for d in cgroup.dirs] if cgroup else [],
        "init_pid": init_pid,
        "init_start": init_start,
    }
    tmp = state / "meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    tmp.replace(state / "meta.json")


def _cgroup_from_dirs(dirs: list[Path]) -> SandboxCgroup:
    freezer = next((d / "freezer.state" for d in dirs if (d / "freezer.state").exists()), None)
    kill = next((d / "cgroup.kill" for d in dirs if (d / "cgroup.kill").exists()), None)
    return SandboxCgroup(dirs, freezer, None, kill)


def reap_stale(state_dir: Path, cgroups: Cgroups | None) -> int:
    """Kill and remove every sandbox whose manager is dead. Returns how many were found."""
    reaped = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in state_dir.iterdir():
            if owner_alive(entry.name):
                continue
            reaped += 1
            meta: dict = {}
            with contextlib.suppress(OSError, ValueError):
                meta = json.loads((entry / "meta.json").read_text())
            pid, start = meta.get("init_pid"), meta.get("init_start")
            if pid is not None and start_time(pid) == start:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            dirs = [Path(d) for d in meta.get("cgroups", [])]
            if dirs:
                group = _cgroup_from_dirs(dirs)
                group.kill_all()
                group.remove()
            shutil.rmtree(entry, ignore_errors=True)
    if cgroups is not None:  # groups whose state directory is gone too
        for name in cgroups.names():
            if not owner_alive(name):
                reaped += 1
                group = cgroups.group(name)
                group.kill_all()
                group.remove()
    return reaped


def pid_namespace_members(init_pid: int | None) -> set[int]:
    """Host pids of every process in the pid namespace whose pid 1 is `init_pid`."""
    if init_pid is None:
        return set()
    try:
        target = os.stat(f"/proc/{init_pid}/ns/pid").st_ino
    except OSError:
        return set()
    members = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}/ns/pid").st_ino == target:
                    members.add(int(name))
    return members


def signal_namespace(init_pid: int | None, sig: int) -> set[int]:
    """Signal every process of a sandbox (the no-cgroup pause). Two passes catch forks."""
    hit: set[int] = set()
    for _ in range(2):
        for pid in pid_namespace_members(init_pid) - hit:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
                hit.add(pid)
    return hit


def not_stopped(pids: set[int]) -> set[int]:
    """The pids among `pids` that are neither stopped (T) nor gone."""
    running = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("T", "t", "Z", "X"):
                running.add(pid)
    return running


def processes_of_uid(uid: int) -> int:
    """How many processes `uid` runs now (RLIMIT_NPROC counts them all)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
    return count
