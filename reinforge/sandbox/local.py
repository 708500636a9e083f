"""Local backend: Linux namespaces + cgroups, no daemon (the default provider).

The calling Python process is the manager. Each sandbox is a helper (`_helper.py`) that
unshares user, mount, pid, net, ipc, uts and cgroup namespaces and pivots into a fresh
root; its pid 1 forks every command, so killing pid 1 tears down the whole pid namespace,
`setsid` and daemonized children included. See docs/sandbox.md for the guarantees and the
reduced ones on hosts without cgroups (non-root laptops).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import resource
import shutil
import socket
from pathlib import Path

from reinforge.sandbox import _helper as wire
from reinforge.sandbox import reaper
from reinforge.sandbox.cgroups import Cgroups, SandboxCgroup
from reinforge.sandbox.channel import Channel, Zygote
from reinforge.sandbox.local_sandbox import LocalSandbox
from reinforge.sandbox.protocol import (
    Capabilities,
    HostView,
    Image,
    Rootfs,
    SandboxError,
    SandboxSpec,
)

__all__ = ["LocalProvider", "LocalSandbox"]

UID_RANGE = 65536
SECCOMP_DENY = (
    "add_key",
    "bpf",
    "delete_module",
    "finit_module",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "move_mount",
    "name_to_handle_at",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "swapoff",
    "swapon",
    "syslog",
    "umount2",
    "unshare",
    "userfaultfd",
)


def _check_workdir(spec: SandboxSpec) -> None:
    if isinstance(spec.base, Image):
        raise SandboxError(f"image {spec.base.name!r}: an image base needs the Docker backend")
    for workdir in (spec.workdir, *spec.writable_dirs, *spec.own_disks):
        top = workdir.strip("/").split("/")[0]
        if not workdir.startswith("/") or ".." in workdir.split("/") or not top:
            raise SandboxError(f"workdir must be an absolute path below /: {workdir!r}")
        if isinstance(spec.base, HostView) and (top in spec.base.dirs or top in ("dev", "proc")):
            raise SandboxError(f"workdir {workdir!r} is inside the read-only host view")


class LocalProvider:
    """Creates local sandboxes. Reaps what a crashed previous run left, at construction."""

    def __init__(
        self,
        *,
        state_dir: Path | None = None,
        use_cgroups: bool = True,
        uid_base: int = 100_000,
        reap: bool = True,
    ) -> None:
        self.is_root = os.geteuid() == 0
        self.state_dir = state_dir or reaper.default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.cgroups = Cgroups.detect() if use_cgroups and self.is_root else None
        self.uid_base = uid_base
        self.owner = reaper.owner_tag(os.getpid())
        self.live: dict[str, LocalSandbox] = {}  # strong refs: unclosed ones die atexit
        self._counter = itertools.count()
        self.zygote = Zygote()
        self.reaped = reaper.reap_stale(self.state_dir, self.cgroups) if reap else 0
        atexit.register(self.close_all_sync)

    @property
    def sandbox_uid(self) -> int:
        """Host uid of root inside every sandbox."""
        return self.uid_base if self.is_root else os.getuid()

    @property
    def capabilities(self) -> Capabilities:
        cg = self.cgroups
        notes = []
        if cg is None or not cg.has("memory"):
            notes.append("memory limit is per process (RLIMIT_AS); tmpfs is bounded by disk only")
        if cg is None or not cg.has("pids"):
            notes.append("pids limit is RLIMIT_NPROC, shared by all sandboxes of one host uid")
        if cg is None or not cg.has("cpu"):
            notes.append("no CPU limit")
        if cg is None or not cg.can_freeze:
            notes.append("pause is best-effort SIGSTOP of each process (no freezer cgroup)")
        if not self.is_root:
            notes.append("single-uid user namespace: only root exists inside")
        return Capabilities(
            pause=True,
            pause_exact=cg is not None and cg.can_freeze,
            fs_snapshot=False,
            memory_snapshot=False,
            network_modes=frozenset({"off", "on"}),
            memory_limit=cg is not None and cg.has("memory"),
            pids_limit=cg is not None and cg.has("pids"),
            cpu_limit=cg is not None and cg.has("cpu"),
            notes=tuple(notes),
        )

    async def create(self, spec: SandboxSpec | None = None) -> LocalSandbox:
        spec = spec or SandboxSpec()
        _check_workdir(spec)
        sandbox_id = f"{self.owner}.{next(self._counter)}"
        sdir = self.state_dir / sandbox_id
        sdir.mkdir(parents=True, mode=0o700)
        cgroup = None
        sandbox = None
        try:
            if self.cgroups is not None:
                reaper.record(sdir, self.cgroups.group(sandbox_id), None, None)
                cgroup = self.cgroups.create(
                    sandbox_id, memory_bytes=spec.memory_bytes, pids=spec.pids, cpus=spec.cpus
                )
            sandbox = LocalSandbox(self, sandbox_id, spec, sdir, cgroup, self.capabilities)
            self.live[sandbox_id] = sandbox
            await sandbox.start(*self._spawn(spec, sdir, cgroup))
        except BaseException:
            if sandbox is not None:
                await asyncio.shield(sandbox.close())
            else:
                if cgroup is not None:
                    cgroup.remove()
                shutil.rmtree(sdir, ignore_errors=True)
            raise
        return sandbox

    def _spawn(
        self, spec: SandboxSpec, sdir: Path, cgroup: SandboxCgroup | None
    ) -> tuple[tuple[int, int], Channel]:
        flags = (
            wire.CLONE_NEWUSER
            | wire.CLONE_NEWNS
            | wire.CLONE_NEWPID
            | wire.CLONE_NEWIPC
            | wire.CLONE_NEWUTS
            | wire.CLONE_NEWCGROUP
        )
        if spec.network == "off":
            flags |= wire.CLONE_NEWNET
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "cgroup_procs": cgroup.procs_files if cgroup else [],
            "flags": flags,
            "setgroups": self.is_root,
            "host_dirs": list(spec.base.dirs) if isinstance(spec.base, HostView) else [],
            "rootfs": isinstance(spec.base, Rootfs),
            "disk_bytes": spec.disk_bytes,
            "workdir": spec.workdir,
            "writable_dirs": list(spec.writable_dirs),
            "own_disks": dict(spec.own_disks),
            "hostname": spec.hostname,
            "drop_caps": True,
            "seccomp": list(SECCOMP_DENY) if spec.seccomp else [],
        }
        try:
            with open(sdir / "helper.log", "wb") as log:
                outer = self.zygote.spawn(config, theirs.fileno(), log.fileno())
        finally:
            theirs.close()
        return outer, Channel(ours)

    def write_id_maps(self, pid: int) -> None:
        """Map root inside to an unprivileged host uid (a 64 Ki range when we are root)."""
        if self.is_root:
            line = f"0 {self.uid_base} {UID_RANGE}\n"
            Path(f"/proc/{pid}/uid_map").write_text(line)
            Path(f"/proc/{pid}/gid_map").write_text(line)
        else:
            Path(f"/proc/{pid}/setgroups").write_text("deny")
            Path(f"/proc/{pid}/uid_map").write_text(f"0 {os.getuid()} 1\n")
            Path(f"/proc/{pid}/gid_map").write_text(f"0 {os.getgid()} 1\n")

    def child_rlimits(self, spec: SandboxSpec) -> list[tuple[int, int, int]]:
        """rlimits of every sandbox process; cgroup limits replace them where present."""
        wanted = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, spec.open_files)]
        if spec.file_size_bytes is not None:
            wanted.append((resource.RLIMIT_FSIZE, spec.file_size_bytes))
        if spec.memory_bytes is not None and not (self.cgroups and self.cgroups.has("memory")):
            wanted.append((resource.RLIMIT_AS, spec.memory_bytes))
        if spec.pids is not None and not (self.cgroups and self.cgroups.has("pids")):
            running = reaper.processes_of_uid(self.sandbox_uid)
            wanted.append((resource.RLIMIT_NPROC, spec.pids + running))
        limits = []
        for which, value in wanted:
            _, hard = resource.getrlimit(which)  # no CAP_SYS_RESOURCE: never raise a hard limit
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            limits.append((which, value, value))
        return limits

    def forget(self, sandbox: LocalSandbox) -> None:
        self.live.pop(sandbox.id, None)

    def close_all_sync(self) -> None:
        for sandbox in list(self.live.values()):
            sandbox.close_sync()
        self.zygote.close()

    async def aclose(self) -> None:
        """Destroy every sandbox of this provider and stop its zygote."""
        await asyncio.gather(*(s.close() for s in list(self.live.values())))
        self.zygote.close()
        atexit.unregister(self.close_all_sync)
