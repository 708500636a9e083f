"""A running local sandbox: every command is forked by the sandbox's own pid 1.

The manager never forks into the sandbox itself. It hands each command's pipes to pid 1
over the channel, so every process is born inside all of the sandbox's namespaces, its
cgroup and its rlimits, and dies with pid 1. Timeouts count unpaused time only, so a
paused rollout is not charged for the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from reinforge.sandbox import _helper as wire
from reinforge.sandbox import reaper
from reinforge.sandbox._io import PipeReader, feed_pipe, parse_read_frames, write_frames
from reinforge.sandbox.cgroups import SandboxCgroup
from reinforge.sandbox.channel import Channel, pidfd_exited, wait_pidfd
from reinforge.sandbox.freezer import Freezer, freezer_for
from reinforge.sandbox.protocol import (
    DEFAULT_PATH,
    MIB,
    TIMEOUT_EXIT_CODE,
    Capabilities,
    ExecResult,
    OutputCallback,
    Rootfs,
    SandboxClosed,
    SandboxError,
    SandboxPaused,
    SandboxSpec,
    TarTooLarge,
)

if TYPE_CHECKING:
    from reinforge.sandbox.local import LocalProvider

SETUP_TIMEOUT_S = 15.0
EXIT_GRACE_S = 0.1  # output still buffered after the command exited (not background holders)


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
        self._freezer: Freezer | None = None  # chosen once pid 1 is known
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
        request = self._command(argv, env)
        return await self._run(request, cwd, timeout, stdin, max_output_bytes, on_output)

    def _command(self, argv: list[str], env: Mapping[str, str] | None) -> dict:
        """An exec request: the command's whole environment is the defaults, the spec's
        and its own, nothing of the manager's."""
        full_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        full_env.update(self.spec.env)
        full_env.update(env or {})
        return {"op": "exec", "argv": argv, "env": full_env}

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
        request = self._command(["tar", "-c", "-C", str(path.parent), path.name], None)
        # Killed as soon as it passes the cap: a 1 TB sparse file would take minutes to read.
        result = await self._run(request, None, None, None, max_bytes, stop_when_full=True)
        if result.truncated:
            raise TarTooLarge(f"download_tar of {src}: larger than {max_bytes} bytes")
        if result.exit_code != 0:
            raise SandboxError(f"download_tar failed: {result.stderr.decode(errors='replace')}")
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
        stop_when_full: bool = False,
    ) -> ExecResult:
        """Fork one process in the sandbox via pid 1 and collect it. Shared by every op.
        `stop_when_full` kills it once its stdout passes `max_output_bytes`, instead of
        draining the rest."""
        channel = self._usable_channel()
        req_id = next(self._ids)
        request.update(
            id=req_id, cwd=cwd or self.spec.workdir, stdin=stdin is not None, rlimits=self._rlimits
        )
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin is not None else (-1, -1)
        passed = [fd for fd in (in_r, out_w, err_w) if fd >= 0]
        kill = partial(channel.send, {"op": "kill", "id": req_id})
        on_full = (lambda: asyncio.ensure_future(kill())) if stop_when_full else None
        stdout = PipeReader(
            out_r, max_output_bytes, on_output and partial(on_output, "stdout"), on_full
        )
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
        assert self._freezer is not None  # chosen in `start`, before anyone has the sandbox
        self._paused_at = time.monotonic()  # from now on, new calls are refused
        if not await self._freezer.freeze():  # e.g. a task in uninterruptible sleep
            self._paused_at = None
            raise SandboxError(f"sandbox {self.id} did not freeze within ~10 s")

    async def resume(self) -> None:
        if self._paused_at is None:
            return
        assert self._freezer is not None
        self._freezer.thaw()
        self._paused_total += time.monotonic() - self._paused_at
        self._paused_at = None

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    # ---------------------------------------------------------------- lifecycle

    async def start(self, helper: tuple[int, int], channel: Channel) -> None:
        """Take over a freshly spawned helper (host pid and pidfd) and set the sandbox up.

        The helper is ours before the first await, so `close` kills it even when setup
        fails, times out or is cancelled.
        """
        self._outer, self._channel = helper, channel
        try:
            await asyncio.wait_for(self._handshake(), SETUP_TIMEOUT_S)
        except TimeoutError:  # said as the sandbox's: a bare TimeoutError names nothing
            raise SandboxError(
                f"sandbox {self.id} was not set up within {SETUP_TIMEOUT_S:.0f} s"
            ) from None

    async def _handshake(self) -> None:
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
                self._freezer = freezer_for(self.cgroup, self.init_pid, self._init_start)
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
        if self._freezer is not None:
            self._freezer.thaw()  # frozen tasks only die once thawed

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
