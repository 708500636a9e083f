"""SandboxPool: warm sandboxes, bounded concurrency, auto-pause, cleanup on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import reinforge
from reinforge.sandbox import LocalProvider, LocalSandbox
from reinforge.sandbox.pool import SandboxPool

from .helpers import host_pid_alive, namespace_cpu_ticks

# In the test process itself, the pool must not take over SIGTERM or make pytest a child
# subreaper; both are exercised in a subprocess by test_sigterm_cleans_up_before_exit.
IN_PROCESS = {"handle_sigterm": False, "subreaper": False}


async def test_warm_sandboxes_wait_paused_and_resume_on_first_call(
    provider: LocalProvider,
) -> None:
    async with SandboxPool(provider, warm=2, max_concurrency=4, **IN_PROCESS) as pool:
        assert len(pool.idle) == 2
        assert all(isinstance(s, LocalSandbox) and s.paused for s in pool.idle)
        async with pool.sandbox() as sandbox:
            result = await sandbox.exec("echo ready")
            assert result.stdout == b"ready\n"
            assert sandbox.inner.paused  # frozen again while the model "thinks"
            await sandbox.write_files({"a.txt": b"A"})
            assert await sandbox.read_files(["a.txt"]) == {"a.txt": b"A"}
            assert sandbox.inner.paused
        for _ in range(500):  # the pool refills itself in the background
            if len(pool.idle) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(pool.idle) == 2


async def test_background_work_is_frozen_between_calls(provider: LocalProvider) -> None:
    async with SandboxPool(provider, warm=0, **IN_PROCESS) as pool:
        async with pool.sandbox() as sandbox:
            await sandbox.exec("while :; do :; done >/dev/null 2>&1 &")
            inner = sandbox.inner
            assert isinstance(inner, LocalSandbox) and inner.paused
            before = namespace_cpu_ticks(inner)
            await asyncio.sleep(0.3)  # the model "thinks": the busy loop must not run
            assert namespace_cpu_ticks(inner) == before


async def test_concurrent_calls_are_not_frozen_mid_run(provider: LocalProvider) -> None:
    async with SandboxPool(provider, warm=0, **IN_PROCESS) as pool:
        async with pool.sandbox() as sandbox:
            slow = asyncio.ensure_future(sandbox.exec("sleep 0.3; echo slow", timeout=5))
            fast = await sandbox.exec("echo fast")
            assert fast.stdout == b"fast\n"
            result = await slow  # its sandbox was not paused when `fast` finished
            assert result.stdout == b"slow\n" and not result.timed_out


async def test_max_concurrency_bounds_lent_sandboxes(provider: LocalProvider) -> None:
    async with SandboxPool(provider, warm=0, max_concurrency=2, **IN_PROCESS) as pool:
        first, second = await pool.acquire(), await pool.acquire()
        third = asyncio.ensure_future(pool.acquire())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not third.done()
        init = first.inner.init_pid
        await first.close()
        assert not host_pid_alive(init)  # released = destroyed, never reused
        await asyncio.wait_for(third, 10)
        await second.close()
        await third.result().close()


async def test_aclose_destroys_idle_and_lent(provider: LocalProvider, tmp_path) -> None:
    local = LocalProvider(state_dir=tmp_path / "state")
    pool = await SandboxPool(local, warm=2, **IN_PROCESS).start()
    lent = await pool.acquire()
    pids = [s.init_pid for s in pool.idle] + [lent.inner.init_pid]
    await pool.aclose()
    assert not [p for p in pids if p and host_pid_alive(p)]
    assert list((tmp_path / "state").iterdir()) == []


SIGTERMED_PARENT = """
import asyncio, sys
from pathlib import Path
from reinforge.sandbox import LocalProvider
from reinforge.sandbox.pool import SandboxPool

async def main():
    pool = await SandboxPool(LocalProvider(state_dir=Path(sys.argv[1])), warm=3).start()
    lent = await pool.acquire()
    await lent.exec("setsid sleep 1000 &")
    print("ready", flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


def test_sigterm_cleans_up_before_exit(tmp_path) -> None:
    state = tmp_path / "state"
    env = dict(os.environ, PYTHONPATH=str(Path(reinforge.__file__).resolve().parents[1]))
    parent = subprocess.Popen(
        [sys.executable, "-c", SIGTERMED_PARENT, str(state)], stdout=subprocess.PIPE, env=env
    )
    assert parent.stdout is not None
    assert parent.stdout.readline() == b"ready\n"
    assert len(list(state.iterdir())) == 4
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == -signal.SIGTERM
    assert list(state.iterdir()) == []  # cleaned by the handler, not by a later reaper
