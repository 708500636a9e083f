"""`reinforge sandbox bench`: the latencies that decide whether sandboxes fit an RL loop.

A rollout creates a sandbox, runs tens of short tool calls with model turns in between
(pause/resume), and destroys it; these are measured one at a time and `n` at once.
"""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import tarfile
import time
from collections.abc import Awaitable, Callable

from reinforge.sandbox.protocol import SandboxProvider, SandboxSpec

UPLOAD_FILES, UPLOAD_FILE_BYTES = 100, 100 * 1024  # a 10 MB tree


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


async def _timed(step: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await step()
    return (time.perf_counter() - start) * 1000


def _tree_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(UPLOAD_FILES):
            data = os.urandom(UPLOAD_FILE_BYTES)
            info = tarfile.TarInfo(f"tree/d{i % 10}/f{i}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def run_bench(
    provider: SandboxProvider, n: int = 32, spec: SandboxSpec | None = None
) -> dict[str, float]:
    """All figures in milliseconds; see benchmarks/sandbox.md for what each one means."""
    spec = spec or SandboxSpec()

    async def lifecycle() -> None:
        sandbox = await provider.create(spec)
        try:
            await sandbox.exec(["true"])
        finally:
            await sandbox.close()

    await lifecycle()  # warm the page cache and the interpreter; not counted
    sequential = [await _timed(lifecycle) for _ in range(n)]
    wall_start = time.perf_counter()
    concurrent = await asyncio.gather(*(_timed(lifecycle) for _ in range(n)))
    concurrent_wall = (time.perf_counter() - wall_start) * 1000

    sandbox = await provider.create(spec)
    try:
        execs = [await _timed(lambda: sandbox.exec(["true"])) for _ in range(n)]
        # what a rollout leaves behind: idle processes and one that is busy when frozen
        await sandbox.exec("for i in 1 2 3; do sleep 1000 & done; while :; do :; done >/dev/null &")
        pauses, resumes = [], []
        for _ in range(n):
            pauses.append(await _timed(sandbox.pause))
            resumes.append(await _timed(sandbox.resume))
        await sandbox.exec("kill -9 -1")  # everything but pid 1 and this shell
        tree = _tree_tar()
        uploads = []
        for i in range(5):
            dest = f"/tmp/upload{i}"
            uploads.append(await _timed(lambda: sandbox.upload_tar(tree, dest)))  # noqa: B023
    finally:
        await sandbox.close()

    return {
        "n": n,
        "create_exec_destroy_p50_ms": percentile(sequential, 50),
        "create_exec_destroy_p99_ms": percentile(sequential, 99),
        "concurrent_create_exec_destroy_p50_ms": percentile(list(concurrent), 50),
        "concurrent_create_exec_destroy_p99_ms": percentile(list(concurrent), 99),
        "concurrent_total_ms": concurrent_wall,
        "exec_p50_ms": percentile(execs, 50),
        "exec_p99_ms": percentile(execs, 99),
        "pause_p50_ms": percentile(pauses, 50),
        "pause_p99_ms": percentile(pauses, 99),
        "resume_p50_ms": percentile(resumes, 50),
        "resume_p99_ms": percentile(resumes, 99),
        "upload_10mb_p50_ms": statistics.median(uploads),
    }
