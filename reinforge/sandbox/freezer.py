"""Stopping and restarting every process of a sandbox, for pause, resume and teardown.

Two mechanisms exist and a sandbox has exactly one of them for its whole life, so the
choice is made once, when its pid 1 is known (`freezer_for`), and callers never branch.
The cgroup freezer is exact: every process of the group stops, new forks too. Without one,
each process of the pid namespace is sent SIGSTOP: best effort (a process forking during
the scan can be missed) and visible to the sandbox's own job control.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Protocol

from reinforge.sandbox import reaper
from reinforge.sandbox.cgroups import SandboxCgroup

FREEZE_POLLS = 10_000  # ~10 s of 1 ms polls before a pause gives up
STOP_POLLS = 1000  # ~1 s of 1 ms polls for SIGSTOP to take; best effort, so never fails


class Freezer(Protocol):
    """What pause, resume and teardown need from either mechanism."""

    async def freeze(self) -> bool:
        """Stop every process; False if they could not all be stopped (and run again)."""
        ...

    def thaw(self) -> None:
        """Let every process run again. Safe to call when nothing is frozen."""
        ...


class CgroupFreezer:
    """The cgroup freezer (v1 `freezer.state` or v2 `cgroup.freeze`)."""

    def __init__(self, cgroup: SandboxCgroup) -> None:
        self._cgroup = cgroup

    async def freeze(self) -> bool:
        self._cgroup.start_freeze()
        for attempt in range(FREEZE_POLLS):
            if self._cgroup.frozen():
                return True
            await asyncio.sleep(0 if attempt < 20 else 0.001)
        self._cgroup.thaw()  # a task stuck in uninterruptible sleep: do not pretend
        return False

    def thaw(self) -> None:
        self._cgroup.thaw()


class SignalFreezer:
    """SIGSTOP and SIGCONT to each process of the pid namespace whose pid 1 is given.

    The namespace is only scanned while that pid still has its recorded start time, so a
    recycled pid never makes host processes look like the sandbox's.
    """

    def __init__(self, init_pid: int, init_start: int | None) -> None:
        self._init_pid = init_pid
        self._init_start = init_start
        self._frozen = False
        self._stopped: set[int] = set()

    async def freeze(self) -> bool:
        self._frozen = True
        self._stopped = self._signal_all(signal.SIGSTOP)
        for _ in range(STOP_POLLS):  # SIGSTOP is asynchronous: wait until each one took
            if not reaper.not_stopped(reaper.pid_namespace_members(self._pid())):
                break
            self._stopped |= self._signal_all(signal.SIGSTOP)
            await asyncio.sleep(0.001)
        return True

    def thaw(self) -> None:
        if not self._frozen:  # no /proc scan on the teardown of a running sandbox
            return
        self._frozen = False
        for pid in self._stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        self._stopped = set()
        self._signal_all(signal.SIGCONT)

    def _pid(self) -> int | None:
        return self._init_pid if reaper.start_time(self._init_pid) == self._init_start else None

    def _signal_all(self, sig: int) -> set[int]:
        return reaper.signal_namespace(self._pid(), sig)


def freezer_for(cgroup: SandboxCgroup | None, init_pid: int, init_start: int | None) -> Freezer:
    """The cgroup freezer where the sandbox's cgroups include one, else SIGSTOP."""
    if cgroup is not None and cgroup.freeze_file is not None:
        return CgroupFreezer(cgroup)
    return SignalFreezer(init_pid, init_start)
