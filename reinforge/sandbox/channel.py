"""The manager's side of the sandbox helper: the zygote, each sandbox's socket, pidfds."""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import select
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from reinforge.sandbox import _helper as wire
from reinforge.sandbox.protocol import DEFAULT_PATH, SandboxError

INIT_SCRIPT = str(Path(wire.__file__).resolve())
SPAWN_TIMEOUT_S = 30.0  # the first request waits for the zygote's Python to start
HELPER_ENV_KEPT = ("LD_LIBRARY_PATH",)
"""The only variables of the manager's environment the helper gets: the interpreter may
need them to start. Every sandbox process descends from the helper, and its read and
write builtins run without an exec, so whatever else the trainer's environment holds
(tracker, judge or cloud keys) would be readable in their /proc entries."""


def helper_env() -> dict[str, str]:
    """The helper's whole environment: a command's own comes from its request."""
    kept = {k: os.environ[k] for k in HELPER_ENV_KEPT if k in os.environ}
    return {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **kept}


class Channel:
    """The manager's end of the SOCK_SEQPACKET socket to one sandbox's helper."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._setup: asyncio.Queue[tuple[int, int, bytes]] = asyncio.Queue()
        self._exits: dict[int, asyncio.Future[int]] = {}
        self.alive = True
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        while True:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            if len(data) < wire.HEADER.size:
                continue  # never produced by our helper; ignore rather than trust
            kind, req, value = wire.HEADER.unpack_from(data)
            if kind == wire.K_EXITED:
                future = self._exits.pop(req, None)
                if future is not None and not future.done():
                    future.set_result(value)
            else:
                self._setup.put_nowait((kind, value, data[wire.HEADER.size :]))

    async def next_setup_message(self) -> tuple[int, int, bytes]:
        return await self._setup.get()

    def expect_exit(self, req_id: int) -> asyncio.Future[int]:
        future: asyncio.Future[int] = self._loop.create_future()
        if not self.alive:
            future.set_exception(SandboxError("sandbox init has exited"))
        self._exits[req_id] = future
        return future

    def send_go(self, fd: int | None) -> None:
        """Let the helper continue after its uid map is written; pass the rootfs fd."""
        try:
            socket.send_fds(self._sock, [b"M"], [] if fd is None else [fd])
        finally:
            if fd is not None:
                os.close(fd)

    async def send(self, request: dict, fds: Sequence[int] = ()) -> None:
        payload = marshal.dumps(request)
        if len(payload) > 1 << 20:
            raise SandboxError("command and environment exceed 1 MiB")
        for _ in range(2000):
            if not self.alive:
                raise SandboxError("sandbox init has exited")
            try:
                socket.send_fds(self._sock, [payload], list(fds))
                return
            except BlockingIOError:
                await asyncio.sleep(0.001)
            except OSError as error:
                raise SandboxError(f"sandbox init is unreachable: {error}") from error
        raise SandboxError("sandbox init is not reading requests")

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        if self._loop.is_closed():  # atexit, after asyncio.run: nothing left to wake
            self._sock.close()
            return
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        for future in self._exits.values():
            if not future.done():
                future.set_exception(SandboxError("sandbox init has exited"))
        self._exits.clear()
        self._setup.put_nowait((0, 0, b""))
        self._sock.close()


class Zygote:
    """The provider's one pre-imported helper: forks an outer process per sandbox.

    Its protocol is synchronous (a fork answers in about a millisecond), so it works from
    any event loop: a provider may outlive the loop that first used it.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None

    def _start(self) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.settimeout(SPAWN_TIMEOUT_S)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", INIT_SCRIPT, str(theirs.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                env=helper_env(),
            )
        finally:
            theirs.close()
        self._sock = ours
        return self._proc, ours

    def spawn(self, config: dict, sandbox_fd: int, log_fd: int) -> tuple[int, int]:
        """Start one sandbox's outer process; returns its host pid and a pidfd."""
        for _ in range(2):  # a zygote that died (killed, OOM) is replaced once
            proc, sock = (
                (self._proc, self._sock)
                if self._proc is not None and self._sock is not None and self._proc.poll() is None
                else self._start()
            )
            try:
                socket.send_fds(sock, [marshal.dumps(config)], [sandbox_fd, log_fd])
                reply, fds, _, _ = socket.recv_fds(sock, 64, 1)
            except OSError:
                reply, fds = b"", []
            if len(reply) == wire.HEADER.size and len(fds) == 1:
                return wire.HEADER.unpack(reply)[2], fds[0]
            for fd in fds:
                os.close(fd)
            self.close()
        raise SandboxError("the sandbox helper (zygote) does not start; see stderr")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


async def wait_pidfd(pidfd: int) -> None:
    """Wait, without a thread, until the process behind `pidfd` has exited."""
    if pidfd_exited(pidfd):
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(pidfd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


def pidfd_exited(pidfd: int, timeout_s: float = 0.0) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))
