"""The logs of a Ray run's engines, copied to the driver's node as they grow.

Each engine writes its log in its own node's temp folder (`EngineActor`), a path no other
machine shares; its actor hands out what was added since a byte offset. The run copies
that into `<run>/engines/engine-<i>.log` about once a second, and once more as the engines
stop, so that `reinforge view`, the dashboard and the run's error lines read engine logs
where they read a local run's. A log copied whole once its engine stopped is then deleted
from its node, where nothing else would ever delete it; one that could not be copied
whole stays there, and the run says so in a line.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import ray
    from ray.exceptions import RayError
except ImportError:  # a Ray run says so in one line (`RayCluster`)
    ray = None

COPY_S = 1.0
"""Between two copies of what the engines added to their logs."""
ASK_S = 10.0
"""How long an actor may take to hand over its log: one whose node died or hangs is
skipped, and tried again at the next copy."""
CHUNK = 1 << 20
"""The most bytes of a log one question brings."""


class LogCopies:
    """Each engine's log, copied from its actor's node to `paths[i]`. An engine restarted by
    a new actor starts a new log on its node, whose bytes follow the old one's."""

    def __init__(self, paths: list[Path], actors: Callable[[], list[Any]]) -> None:
        self.paths = paths
        self._actors = actors
        """The engines' actors now (a restart may replace one)."""
        self._copied: dict[int, tuple[Any, int]] = {}
        """Of each engine: the actor copied from, and how many bytes of its log."""
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, name="reinforge-engine-logs", daemon=True
        )  # a run that fails before it stops its engines still exits

    def follow(self) -> None:
        """Copy in the background until `close`."""
        self._thread.start()

    def close(self) -> None:
        """Stop following, then copy what is left (the engines' last words) and delete each
        log from its node once copied whole."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        for index, actor in enumerate(self._actors()):
            if not (self._copy_all(index, actor) and self._drop(index, actor)):
                print(
                    f"reinforge: engine {index}'s log could not be copied whole to "
                    f"{self.paths[index]}: the rest stays on its node "
                    f"(reinforge-engine-*/engine-{index}.log in its temp folder)",
                    file=sys.stderr,
                    flush=True,
                )

    def copy(self) -> None:
        for index, actor in enumerate(self._actors()):
            self._copy_all(index, actor)

    def _follow(self) -> None:
        while not self._done.wait(COPY_S):
            self.copy()

    def _copy_all(self, index: int, actor: Any) -> bool:
        """Whether engine `index`'s log was copied to its end."""
        while (copied := self._copy(index, actor)) == CHUNK:
            pass
        return copied is not None

    def _copy(self, index: int, actor: Any) -> int | None:
        """Bytes of engine `index`'s log copied; None if its actor did not answer or the
        copy could not be written (tried again at the next copy)."""
        copied_from, offset = self._copied.get(index, (None, 0))
        if actor is not copied_from:
            offset = 0
        asked = actor.log_since.options(concurrency_group="log").remote(offset, CHUNK)
        try:
            added: bytes = ray.get(asked, timeout=ASK_S)
            with self.paths[index].open("ab") as log:
                log.write(added)
        except (RayError, OSError):
            return None
        self._copied[index] = (actor, offset + len(added))
        return len(added)

    def _drop(self, index: int, actor: Any) -> bool:
        """Whether engine `index`'s actor deleted its log, all of which is copied."""
        _, copied = self._copied[index]
        asked = actor.drop_log.options(concurrency_group="log").remote(copied)
        try:
            return ray.get(asked, timeout=ASK_S)
        except RayError:
            return False
