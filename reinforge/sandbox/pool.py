"""A pool of pre-warmed sandboxes for rollouts, with bounded concurrency and auto-pause.

A rollout borrows one sandbox for its whole episode and the pool destroys it afterwards
(a computer is never reused across rollouts). While the rollout waits for the model, its
sandbox is frozen so that background processes (a server the agent started, a build)
use no CPU, and it is thawed at the next tool call. Cleanup is layered so that nothing
leaks: context managers, a SIGTERM handler, the provider's atexit hook, PDEATHSIG in the
local backend, a child subreaper, and reaping of a crashed run's leftovers at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence

from reinforge.sandbox.protocol import (
    MIB,
    Capabilities,
    ExecResult,
    OutputCallback,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
)

PR_SET_CHILD_SUBREAPER = 36
log = logging.getLogger(__name__)


def become_subreaper() -> bool:
    """Orphans of our descendants (a sandbox's pid 1 whose helper died) come to us."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


class PooledSandbox:
    """A borrowed sandbox: resumes before each call and, if asked, pauses after it."""

    def __init__(self, pool: SandboxPool, inner: Sandbox) -> None:
        self._pool = pool
        self.inner = inner
        self.id = inner.id
        self.capabilities: Capabilities = inner.capabilities
        self._active = 0
        self._gate = asyncio.Lock()  # serialises pause/resume transitions

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[Sandbox]:
        async with self._gate:
            if self._active == 0:
                await self.inner.resume()
            self._active += 1
        try:
            yield self.inner
        finally:
            async with self._gate:
                self._active -= 1
                if self._active == 0 and self._pool.pause_idle:
                    with contextlib.suppress(Exception):  # closed meanwhile: nothing to pause
                        await self.inner.pause()

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
        async with self._running() as sandbox:
            return await sandbox.exec(
                cmd,
                cwd=cwd,
                env=env,
                timeout=timeout,
                stdin=stdin,
                max_output_bytes=max_output_bytes,
                on_output=on_output,
            )

    async def write_files(self, files: Mapping[str, bytes], *, mode: int = 0o644) -> None:
        async with self._running() as sandbox:
            await sandbox.write_files(files, mode=mode)

    async def read_files(
        self, paths: Sequence[str], *, max_bytes: int = MIB
    ) -> dict[str, bytes | None]:
        async with self._running() as sandbox:
            return await sandbox.read_files(paths, max_bytes=max_bytes)

    async def upload_tar(self, tar_bytes: bytes, dest: str) -> None:
        async with self._running() as sandbox:
            await sandbox.upload_tar(tar_bytes, dest)

    async def download_tar(self, src: str, *, max_bytes: int = 1 << 30) -> bytes:
        async with self._running() as sandbox:
            return await sandbox.download_tar(src, max_bytes=max_bytes)

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def close(self) -> None:
        await self._pool.release(self)

    async def __aenter__(self) -> PooledSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxPool:
    """`warm` idle sandboxes ready (paused), at most `max_concurrency` lent at once."""

    def __init__(
        self,
        provider: SandboxProvider,
        spec: SandboxSpec | None = None,
        *,
        max_concurrency: int = 32,
        warm: int = 4,
        pause_idle: bool = True,
        handle_sigterm: bool = True,
        subreaper: bool = True,
    ) -> None:
        if max_concurrency < 1 or warm < 0:
            raise ValueError("max_concurrency must be >= 1 and warm >= 0")
        self.provider = provider
        self.spec = spec or SandboxSpec()
        self.max_concurrency = max_concurrency
        self.warm = warm
        self.pause_idle = pause_idle
        self._handle_sigterm = handle_sigterm
        self._subreaper = subreaper
        self._slots = asyncio.Semaphore(max_concurrency)
        self.idle: list[Sandbox] = []
        self.lent: set[PooledSandbox] = set()
        self._refill: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> SandboxPool:
        if self._subreaper:
            become_subreaper()
        # Only where the process has no plan of its own for SIGTERM: a `reinforge` command
        # stops as on Ctrl-C, saving first, and closes the pool on its way out.
        self._handle_sigterm &= signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        if self._handle_sigterm:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._on_sigterm)
        await self._fill()
        return self

    async def _fill(self) -> None:
        while not self._closed and len(self.idle) < self.warm:
            sandbox = await self.provider.create(self.spec)
            if self._closed:
                await sandbox.close()
                return
            if self.pause_idle:
                await sandbox.pause()
            self.idle.append(sandbox)

    def _schedule_fill(self) -> None:
        if self._refill is None or self._refill.done():
            self._refill = asyncio.ensure_future(self._background_fill())

    async def _background_fill(self) -> None:
        """Refill failures are not fatal: the next `acquire` creates on demand."""
        try:
            await self._fill()
        except Exception:  # noqa: BLE001
            log.warning("could not pre-warm a sandbox", exc_info=True)

    async def acquire(self) -> PooledSandbox:
        """Borrow a sandbox, waiting while `max_concurrency` are already lent."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        await self._slots.acquire()
        try:
            sandbox = self.idle.pop() if self.idle else await self.provider.create(self.spec)
        except BaseException:
            self._slots.release()
            raise
        self._schedule_fill()
        pooled = PooledSandbox(self, sandbox)
        self.lent.add(pooled)
        return pooled

    async def release(self, pooled: PooledSandbox) -> None:
        """Destroy a borrowed sandbox and free its slot. Idempotent."""
        if pooled not in self.lent:
            return
        self.lent.discard(pooled)
        try:
            await pooled.inner.close()
        finally:
            self._slots.release()

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[PooledSandbox]:
        """`async with pool.sandbox() as sb:` borrows one for the block, then destroys it."""
        pooled = await self.acquire()
        try:
            yield pooled
        finally:
            await asyncio.shield(self.release(pooled))

    async def aclose(self) -> None:
        """Destroy every sandbox, idle and lent."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refill
        idle, self.idle = self.idle, []
        closing = [s.close() for s in idle] + [self.release(p) for p in list(self.lent)]
        await asyncio.gather(*closing, return_exceptions=True)
        if self._handle_sigterm:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)

    def _on_sigterm(self) -> None:
        asyncio.ensure_future(self._terminate())

    async def _terminate(self) -> None:
        """Clean up, then die of SIGTERM as the sender asked (exit status 143)."""
        try:
            await self.aclose()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
