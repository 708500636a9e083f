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
import contextlib
import itertools
import os
import resource
import shutil
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from reinforge.sandbox import _helper as wire
from reinforge.sandbox import reaper
from reinforge.sandbox._io import PipeReader, feed_pipe, parse_read_frames, write_frames
from reinforge.sandbox.cgroups import Cgroups, SandboxCgroup
from reinforge.sandbox.channel import Channel, Zygote, pidfd_exited, wait_pidfd
from reinforge.sandbox.protocol import (
    DEFAULT_PATH,
    MIB,
    TIMEOUT_EXIT_CODE,
    Capabilities,
    ExecResult,
    HostView,
    OutputCallback,
    Rootfs,
    SandboxClosed,
    SandboxError,
    SandboxPaused,
    SandboxSpec,
)

UID_RANGE = 65536
SETUP_TIMEOUT_S = 15.0
EXIT_GRACE_S = 0.1  # output still buffered after the command exited (not background holders)
FREEZE_POLLS = 10_000  # ~10 s of 1 ms polls before a pause gives up
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


class LocalSandbox:
    """One running sandbox of the local backend. Create it with `LocalProvider.create`."""

    def __init__(
        self,
        provider: LocalProvider,
        sandbox_id: str,
        spec: SandboxSpec,
        state_dir: Path,
        cgroup: SandboxCgroup | None,
        capabilities: Capabilities,
    ) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.capabilities = capabilities
        self.state_dir = state_dir
        self.cgroup = cgroup
        self.init_pid: int | None = None  # host pid of the sandbox's pid 1
        self._init_start: int | None = None
        self._provider = provider
        self._rlimits = provider.child_rlimits(spec)
        self._outer: tuple[int, int] | None = None  # host pid and pidfd of the helper
        self._channel: Channel | None = None
        self._ids = itertools.count(1)
        self._paused_at: float | None = None
        self._paused_total = 0.0
        self._stopped: set[int] = set()
        self._closing: asyncio.Future[None] | None = None
        self._lifetime: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------- commands

    async def exec(
        self,
        cmd: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int = MIB,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        full_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        full_env.update(self.spec.env)
        full_env.update(env or {})
        request = {"op": "exec", "argv": argv, "env": full_env}
        return await self._run(request, cwd, timeout, stdin, max_output_bytes, on_output)

    async def write_files(self, files: Mapping[str, bytes], *, mode: int = 0o644) -> None:
        paths = {self._absolute(p): data for p, data in files.items()}
        result = await self._run(
            {"op": "exec", "builtin": "write"}, None, None, write_frames(paths, mode), MIB
        )
        if result.exit_code != 0:
            raise SandboxError(f"write_files failed: {result.stderr.decode(errors='replace')}")

    async def read_files(
        self, paths: Sequence[str], *, max_bytes: int = MIB
    ) -> dict[str, bytes | None]:
        absolute = [self._absolute(p) for p in paths]
        request = {"op": "exec", "builtin": "read", "paths": absolute, "max_bytes": max_bytes}
        cap = len(paths) * (max_bytes + wire.READ_FRAME.size)
        result = await self._run(request, None, None, None, cap)
        if result.exit_code != 0:
            raise SandboxError(f"read_files failed: {result.stderr.decode(errors='replace')}")
        contents = parse_read_frames(result.stdout, len(paths), max_bytes)
        return dict(zip(paths, contents, strict=True))

    async def upload_tar(self, tar_bytes: bytes, dest: str) -> None:
        script = 'mkdir -p "$1" && exec tar -x --no-same-owner -C "$1"'
        result = await self.exec(
            ["/bin/sh", "-c", script, "sh", self._absolute(dest)], stdin=tar_bytes
        )
        if result.exit_code != 0:
            raise SandboxError(f"upload_tar failed: {result.stderr.decode(errors='replace')}")

    async def download_tar(self, src: str, *, max_bytes: int = 1 << 30) -> bytes:
        path = Path(self._absolute(src))
        result = await self.exec(
            ["tar", "-c", "-C", str(path.parent), path.name], max_output_bytes=max_bytes
        )
        if result.exit_code != 0 or result.truncated:
            reason = (
                "larger than max_bytes"
                if result.truncated
                else result.stderr.decode(errors="replace")
            )
            raise SandboxError(f"download_tar failed: {reason}")
        return result.stdout

    def _absolute(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir}/{path}"

    async def _run(
        self,
        request: dict,
        cwd: str | None,
        timeout: float | None,
        stdin: bytes | None,
        max_output_bytes: int,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Fork one process in the sandbox via pid 1 and collect it. Shared by every op."""
        channel = self._usable_channel()
        req_id = next(self._ids)
        request.update(
            id=req_id, cwd=cwd or self.spec.workdir, stdin=stdin is not None, rlimits=self._rlimits
        )
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin is not None else (-1, -1)
        passed = [fd for fd in (in_r, out_w, err_w) if fd >= 0]
        stdout = PipeReader(out_r, max_output_bytes, on_output and partial(on_output, "stdout"))
        stderr = PipeReader(err_r, max_output_bytes, on_output and partial(on_output, "stderr"))
        feeder = None
        started, paused_before = time.monotonic(), self._paused_clock()
        exited = channel.expect_exit(req_id)
        try:
            try:
                await channel.send(request, passed)
            finally:
                for fd in passed:
                    os.close(fd)
            if stdin is not None:
                feeder = asyncio.ensure_future(feed_pipe(in_w, stdin))
            timed_out = await self._wait_exit(exited, timeout, started, paused_before)
            if timed_out:
                await channel.send({"op": "kill", "id": req_id})
            try:
                status = await exited
            except SandboxError:
                if self._closing is not None:
                    raise SandboxClosed(f"sandbox {self.id} was closed during the call") from None
                raise self._death() from None
            await asyncio.wait([stdout.eof, stderr.eof], timeout=EXIT_GRACE_S)
        except BaseException:
            if channel.alive and not exited.done():
                with contextlib.suppress(Exception):
                    await asyncio.shield(channel.send({"op": "kill", "id": req_id}))
            raise
        finally:
            stdout.close()
            stderr.close()
            if feeder is not None:
                feeder.cancel()
            elif in_w >= 0:
                os.close(in_w)
        code = TIMEOUT_EXIT_CODE if timed_out else (128 - status if status < 0 else status)
        return ExecResult(
            exit_code=code,
            stdout=stdout.value(),
            stderr=stderr.value(),
            duration=time.monotonic() - started,
            timed_out=timed_out,
            truncated=stdout.truncated or stderr.truncated,
        )

    async def _wait_exit(
        self, exited: asyncio.Future[int], timeout: float | None, started: float, paused0: float
    ) -> bool:
        """Wait for the command; True if it ran `timeout` seconds of *unpaused* time."""
        while True:
            if timeout is None:
                await asyncio.wait([exited])
                return False
            ran = time.monotonic() - started - (self._paused_clock() - paused0)
            if ran >= timeout:
                return True
            done, _ = await asyncio.wait([exited], timeout=timeout - ran)
            if done:
                return False

    def _paused_clock(self) -> float:
        now = time.monotonic()
        return self._paused_total + (now - self._paused_at if self._paused_at else 0.0)

    def _usable_channel(self) -> Channel:
        if self._closing is not None:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        if self._paused_at is not None:
            raise SandboxPaused(f"sandbox {self.id} is paused")
        if self._channel is None or not self._channel.alive:
            raise self._death()
        return self._channel

    def _death(self) -> SandboxError:
        reason = "its pid 1 exited"
        kills = self.cgroup.oom_kills() if self.cgroup is not None else 0
        if kills:  # the likely cause: a full memory limit leaves only pid 1 to kill
            reason += f" after {kills} OOM kill(s); tmpfs files count against memory_bytes"
        return SandboxError(f"sandbox {self.id} died: {reason}")

    # ---------------------------------------------------------------- pause / resume

    async def pause(self) -> None:
        """Freeze every process (cgroup freezer); SIGSTOP each one where there is none."""
        if self._paused_at is not None or self._closing is not None:
            return
        self._paused_at = time.monotonic()  # from now on, new calls are refused
        if self.cgroup is not None and self.cgroup.freeze_file is not None:
            self.cgroup.start_freeze()
            for attempt in range(FREEZE_POLLS):
                if self.cgroup.frozen():
                    break
                await asyncio.sleep(0 if attempt < 20 else 0.001)
            else:  # a task stuck in uninterruptible sleep: do not pretend
                self.cgroup.thaw()
                self._paused_at = None
                raise SandboxError(f"sandbox {self.id} did not freeze within ~10 s")
        else:
            self._stopped = reaper.signal_namespace(self.init_pid, signal.SIGSTOP)
            for _ in range(1000):  # SIGSTOP is asynchronous: wait until each one took
                running = reaper.not_stopped(reaper.pid_namespace_members(self.init_pid))
                if not running:
                    break
                self._stopped |= reaper.signal_namespace(self.init_pid, signal.SIGSTOP)
                await asyncio.sleep(0.001)

    async def resume(self) -> None:
        if self._paused_at is None:
            return
        if self.cgroup is not None and self.cgroup.freeze_file is not None:
            self.cgroup.thaw()
        else:
            for pid in self._stopped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
            reaper.signal_namespace(self.init_pid, signal.SIGCONT)
        self._paused_total += time.monotonic() - self._paused_at
        self._paused_at = None

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    # ---------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        """Handshake with the helper: write its uid map, learn pid 1, wait for ready.

        pid 1 sends READY itself while its parent sends PID, so on busy cores READY can
        arrive first; the handshake ends only when both have.
        """
        assert self._outer is not None and self._channel is not None
        outer, channel = self._outer, self._channel
        ready = False
        while not (ready and self.init_pid is not None):
            kind, value, tail = await channel.next_setup_message()
            if kind == wire.K_MAP:
                self._provider.write_id_maps(outer[0])
                channel.send_go(self._rootfs_fd(outer[0]))
            elif kind == wire.K_PID:
                self.init_pid, self._init_start = value, reaper.start_time(value)
                reaper.record(self.state_dir, self.cgroup, self.init_pid, self._init_start)
            elif kind == wire.K_READY:
                ready = True
            elif kind == wire.K_FAIL:
                raise SandboxError(f"sandbox setup failed: {tail.decode(errors='replace')}")
            elif self.cgroup is not None and self.cgroup.oom_kills():
                raise SandboxError("sandbox setup was OOM-killed: memory_bytes is too small")
            else:
                raise SandboxError(f"sandbox helper exited during setup: {self._helper_log()}")
        if self.spec.lifetime_s is not None:
            loop = asyncio.get_running_loop()
            self._lifetime = loop.call_later(
                self.spec.lifetime_s, lambda: asyncio.ensure_future(self.close())
            )

    def _rootfs_fd(self, helper_pid: int) -> int | None:
        """The rootfs opened *inside the helper's new mount namespace*, by us.

        overlayfs only accepts a lower layer from the mounter's own mount namespace, and
        the helper cannot open it itself: as the sandbox's root it may lack the right to
        cross the directories above it. We can, through /proc/PID/root.
        """
        if not isinstance(self.spec.base, Rootfs):
            return None
        path = Path(self.spec.base.path).resolve()
        return os.open(f"/proc/{helper_pid}/root{path}", os.O_PATH | os.O_DIRECTORY)

    def _helper_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.state_dir / "helper.log").read_text()[-2000:].strip() or "no output"
        return "no output"

    async def close(self) -> None:
        """Kill everything and free every resource. Idempotent; survives cancellation."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._teardown())
        await asyncio.shield(self._closing)

    async def _teardown(self) -> None:
        if self._lifetime is not None:
            self._lifetime.cancel()
        self.kill()
        if self._outer is not None:
            await wait_pidfd(self._outer[1])
        self._finish()

    def kill(self) -> None:
        """SIGKILL pid 1: the kernel then kills every process in the pid namespace."""
        if self.init_pid is not None and reaper.start_time(self.init_pid) == self._init_start:
            with contextlib.suppress(OSError):
                os.kill(self.init_pid, signal.SIGKILL)
        elif self._outer is not None:  # still in setup: pid 1 dies with it (PDEATHSIG)
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._outer[1], signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.thaw()  # frozen tasks only die once thawed
        elif self._stopped:
            for pid in self._stopped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)

    def close_sync(self) -> None:
        """Blocking teardown for atexit and signal handlers (no event loop needed)."""
        self.kill()
        if self._outer is not None:
            pidfd_exited(self._outer[1], timeout_s=5.0)
        self._finish()

    def _finish(self) -> None:
        if self.init_pid is not None:  # pid 1 may be our orphan if we are a subreaper
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.init_pid, os.WNOHANG)
        if self._channel is not None:
            self._channel.close()
        if self._outer is not None:
            os.close(self._outer[1])
            self._outer = None
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self._provider.forget(self)

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _check_workdir(spec: SandboxSpec) -> None:
    workdir = spec.workdir
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
            sandbox._outer, sandbox._channel = self._spawn(spec, sdir, cgroup)
            await asyncio.wait_for(sandbox._start(), SETUP_TIMEOUT_S)
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
