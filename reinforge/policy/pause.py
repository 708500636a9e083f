"""Decoding held across requests: what `POST /v1/pause` and `/v1/resume` do, so a trainer
in another process can train while the server's rollouts wait (partial mode) and then
hand over weights that the waiting rollouts continue under.

An engine holds decoding for the body of `paused()`, on the thread that entered it; a
pause that spans requests therefore has a thread of its own that holds it, and runs a
weight update sent meanwhile inside the hold, so no decode step comes between the pause
and the new weights. A pause ends at `resume()`, or when its lease runs out: a trainer
that dies mid-step does not stop the engine for good.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from reinforge.policy.backends import SamplingEngine

log = logging.getLogger(__name__)
T = TypeVar("T")
_RESUME = object()


class Pause:
    """At most one pause at a time on `engine`."""

    def __init__(self, engine: SamplingEngine) -> None:
        self.engine = engine
        self._inbox: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    @property
    def active(self) -> bool:
        return self._thread is not None

    def start(self, lease_s: float) -> bool:
        """Hold decoding from its next step boundary, for at most `lease_s` seconds;
        returns once it is held. False: a pause was already held (it goes on)."""
        with self._guard:
            if self.active:
                return False
            held = threading.Event()
            self._inbox = queue.Queue()
            self._thread = threading.Thread(
                target=self._hold, args=(lease_s, held), name="reinforge-pause", daemon=True
            )
            self._thread.start()
        held.wait()
        return True

    def run(self, work: Callable[[], T]) -> T:
        """`work` inside the pause when one is held (a weight update the paused rollouts
        then continue under), else here."""
        with self._guard:
            if not self.active:
                return work()
            done: Future[T] = Future()
            self._inbox.put((work, done))
        return done.result()

    def resume(self) -> bool:
        """End the pause; False: none was held."""
        with self._guard:
            thread = self._thread
            if thread is None:
                return False
            self._inbox.put(_RESUME)
        thread.join()
        return True

    def _hold(self, lease_s: float, held: threading.Event) -> None:
        ends = time.monotonic() + lease_s
        with self.engine.paused():
            held.set()
            while True:
                try:
                    item = self._inbox.get(timeout=max(ends - time.monotonic(), 0.0))
                except queue.Empty:
                    log.warning("pause lease of %.0f s ran out: decoding resumes", lease_s)
                    break
                if item is _RESUME:
                    break
                _do(item)
        with self._guard:  # from here `run` works directly; what it queued before runs here
            self._thread = None
            while not self._inbox.empty():
                item = self._inbox.get()
                if item is not _RESUME:
                    _do(item)


def _do(item: object) -> None:
    work, done = item  # type: ignore[misc]
    try:
        done.set_result(work())
    except BaseException as error:  # the caller gets it, the pause goes on
        done.set_exception(error)
