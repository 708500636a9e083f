"""User code that blocks, and how a rollout's time limit holds anyway.

Environment hooks, tools and graders are user code, sync or async, and every rollout of a
run shares one event loop with the others (and, in process, with the engine's server): a
call that blocks the loop stops them all, and no asyncio timeout fires meanwhile.

- Sync user code runs in a thread of its own (`call`, `in_thread`), so the loop stays free
  and the rollout's timeout fires while it runs. A thread cannot be stopped: one still
  running when its rollout gives up on it is abandoned. It runs on, its result is dropped,
  it is named in the rollout's timeout message and counted (`abandoned_threads`), and the
  run goes on.
- Async user code runs on the loop, where it can still block it (`time.sleep` in an
  `async def`, a long computation). `guarded` runs a rollout, or a group's grading, in a
  task that a `LoopWatchdog` watches: a thread that sees when the loop has been held inside
  a watched task for `max_block_s` and raises an interrupt at the line it is running
  (`PyThreadState_SetAsyncExc`). Where the loop runs on the main thread, a signal also
  ends a blocking system call (a sleep, a read) so that the interrupt is raised there. The
  task fails with `LoopBlocked`, naming that line, and the other rollouts go on. Code
  blocked inside a C call that no signal ends (on a loop outside the main thread, any
  blocking call) is interrupted only once the call returns.

Why not a thread with a loop of its own for each rollout, which would need no watchdog: an
environment shares async resources across its episodes (a sandbox pool, a judge's HTTP
client), and each of them belongs to the loop that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import inspect
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import Any, TypeVar

from reinforge.errors import user_line

log = logging.getLogger(__name__)

T = TypeVar("T")

TICK_S = 0.1
"""How often a watched loop beats and its watchdog looks: the precision of `max_block_s`."""

_WAKE = signal.SIGURG
"""Sent to the loop's thread, when that is the main thread, to end a blocking system call
so that the interrupt is raised. Ignored by default: one that arrives after the watchdog
has gone does nothing."""


class LoopBlocked(Exception):
    """Async user code held the event loop past `rollout.max_block_s`."""


class TimedOut(TimeoutError):
    """A guarded task ran past its time limit. A TimeoutError raised inside the task (a
    sandbox that did not start in time, a tool's own deadline) is the code's failure and
    goes on as itself, with its own message."""


class _Interrupt(BaseException):
    """What the watchdog raises in the blocking code. Not an `Exception`, so that the
    `except Exception` of a tool call or a grader (which turns errors into tool messages
    and grader errors) lets it through to the watched task."""


@dataclass
class _Watch:
    """What one guarded task, and the tasks it spawns, is held to, and what befell it."""

    max_block_s: float
    blocked: str = ""
    """How long, and at which line, the task held the loop when the watchdog interrupted
    it."""
    interrupted_at: float | None = None
    abandoned: list[str] = field(default_factory=list)
    """Sync callables left running in threads that the task gave up on."""


_WATCH: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar(
    "reinforge_watch", default=None
)
_abandoned: set[threading.Thread] = set()
_watchdogs: dict[asyncio.AbstractEventLoop, LoopWatchdog] = {}


async def guarded(
    coroutine: Coroutine[Any, Any, T], what: str, timeout_s: float, max_block_s: float
) -> T:
    """Run `coroutine` (`what`: a rollout, a grading) in a task of its own, within
    `timeout_s`, failing it once it holds the loop for `max_block_s`. Raises TimedOut
    saying what ran past its limit and which sync calls it left running, or LoopBlocked."""
    watch = _Watch(max_block_s)
    context = contextvars.copy_context()
    context.run(_WATCH.set, watch)
    task = asyncio.get_running_loop().create_task(coroutine, context=context)
    _watchdog().watch(task, watch)
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            return await task
    except _Interrupt:
        raise LoopBlocked(f"{what} {watch.blocked}") from None
    except TimeoutError:
        if not deadline.expired():
            raise  # the task's own
        left = ", ".join(watch.abandoned)
        still = f"; left running in abandoned threads: {left}" if left else ""
        raise TimedOut(f"{what} exceeded {timeout_s} s{still}") from None


def spawn(coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task for `coroutine`, held to the watch of the guarded task that starts it: the
    watchdog knows a task by itself, not by the task that started it."""
    task = asyncio.get_running_loop().create_task(coroutine)
    watch = _WATCH.get()
    if watch is not None:
        _watchdog().watch(task, watch)
    return task


async def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call user code that may be sync or async: an `async def` on the loop (watched there
    when a guarded task awaits it), anything else in a thread (`in_thread`); an awaitable
    that a sync function returns is awaited on the loop."""
    if inspect.iscoroutinefunction(function):
        return await function(*args, **kwargs)
    result = await in_thread(function, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


async def in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)` in a new thread, the loop free meanwhile. Not
    `asyncio.to_thread`: its shared pool has a handful of threads (CPUs + 4), which calls
    that never return would use up, and with them every later `to_thread` of the
    process."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            result = context.run(function, *args, **kwargs)
        except BaseException as error:  # noqa: BLE001  (the caller's to handle)
            _deliver(loop, future, partial(future.set_exception, error))
        else:
            _deliver(loop, future, partial(future.set_result, result))

    thread = threading.Thread(target=run, name=f"reinforge-{_name(function)}", daemon=True)
    thread.start()
    try:
        return await future
    except asyncio.CancelledError:
        if thread.is_alive():
            _abandon(thread, function)
        raise


def abandoned_threads() -> int:
    """Threads of sync user code still running after their callers gave up on them."""
    _abandoned.difference_update([thread for thread in _abandoned if not thread.is_alive()])
    return len(_abandoned)


def _deliver(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], settle: Callable[[], object]
) -> None:
    """Hand a thread's outcome to the loop, unless its caller gave up or the loop is gone."""

    def deliver() -> None:
        if not future.done():
            settle()

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(deliver)


def _abandon(thread: threading.Thread, function: Callable[..., Any]) -> None:
    _abandoned.add(thread)
    name = _name(function)
    watch = _WATCH.get()
    if watch is not None:
        watch.abandoned.append(name)
    log.warning(
        "%s still runs after its caller gave up on it: its thread is abandoned "
        "(%d abandoned threads still run)",
        name,
        abandoned_threads(),
    )


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


def _watchdog() -> LoopWatchdog:
    loop = asyncio.get_running_loop()
    watchdog = _watchdogs.get(loop)
    if watchdog is None:
        watchdog = _watchdogs[loop] = LoopWatchdog(loop)
    return watchdog


class LoopWatchdog:
    """Watches one event loop while it runs watched tasks: the loop beats every `TICK_S`,
    and a thread of the watchdog's own checks that it does. Made by the first watched task
    and gone with the last, so that a loop with no rollout in flight carries neither."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread_id = threading.get_ident()
        self._tasks: dict[asyncio.Task[Any], _Watch] = {}
        self._lock = threading.Lock()
        self._beat = time.monotonic()
        self._heart = loop.call_later(TICK_S, self._beat_again)
        self._stop = threading.Event()
        self._wakes = _install_wake()
        threading.Thread(target=self._run, name="reinforge-watchdog", daemon=True).start()

    def watch(self, task: asyncio.Task[Any], watch: _Watch) -> None:
        with self._lock:
            self._tasks[task] = watch
        task.add_done_callback(self._unwatch)

    def _unwatch(self, task: asyncio.Task[Any]) -> None:
        with self._lock:
            del self._tasks[task]
            if self._tasks:
                return
        self._heart.cancel()
        self._stop.set()
        if self._wakes:
            signal.signal(_WAKE, signal.SIG_DFL)
        del _watchdogs[self.loop]

    def _beat_again(self) -> None:
        self._beat = time.monotonic()
        self._heart = self.loop.call_later(TICK_S, self._beat_again)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S) and not self.loop.is_closed():
            beat = self._beat
            held = time.monotonic() - beat - TICK_S  # since the beat was due
            task = asyncio.current_task(self.loop)
            with self._lock:
                watch = self._tasks.get(task) if task is not None else None
            if task is None or watch is None or held < watch.max_block_s:
                continue
            last = watch.interrupted_at
            if last is None or time.monotonic() - last >= watch.max_block_s:
                self._interrupt(task, watch, held, beat)

    def _interrupt(self, task: asyncio.Task[Any], watch: _Watch, held: float, beat: float) -> None:
        """Raise `_Interrupt` in the loop's thread, which is running `task`'s code. Checked
        once more just before, as the loop may have let go meanwhile."""
        frame = sys._current_frames().get(self.thread_id)
        where = user_line(traceback.extract_stack(frame)) if frame is not None else ""
        at = f" at {where}" if where else ""
        blocked = (
            f"held the event loop for {held:.1f} s{at}, past rollout.max_block_s "
            f"({watch.max_block_s} s): async code must not block (run blocking calls in a "
            "thread, e.g. with asyncio.to_thread)"
        )
        if self._beat != beat or asyncio.current_task(self.loop) is not task:
            return
        watch.blocked, watch.interrupted_at = blocked, time.monotonic()
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self.thread_id), ctypes.py_object(_Interrupt)
        )
        if self._wakes:
            signal.pthread_kill(self.thread_id, _WAKE)


def _install_wake() -> bool:
    """Whether the loop's thread can be woken from a blocking system call: Python runs
    signal handlers on the main thread only, and a handler already set is someone else's."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(_WAKE) != signal.SIG_DFL:
        return False
    signal.signal(_WAKE, _woken)
    return True


def _woken(signum: int, frame: FrameType | None) -> None:
    """Python code run in the loop's thread, where the pending interrupt is raised."""
