"""The run's engines brought back when they die: the supervisor of spawned engines.

Twice a second it looks at every engine. One whose process exited (or, on a cluster, whose
Ray actor died or stopped answering), or that a request could not reach and that no longer
answers `/health`, is taken out of the router and the weight pushes, restarted on its
port, handed the last push's weights and version, and only then routed to again. Meanwhile
its episodes' turns go to the other engines (`Router.lost`), so no rollout fails because
an engine died and every token records the version that sampled it. Each restart is one
line on stderr and counted in the step's metrics; the `engines.restarts` + 1st death stops
the run with one line.
"""

from __future__ import annotations

import asyncio
import sys

import httpx

from reinforge.errors import UsageError
from reinforge.orchestrate.config import EnginesConfig, SpawnedEngines
from reinforge.orchestrate.engine_host import EngineGone, answers
from reinforge.orchestrate.engine_processes import EngineLauncher
from reinforge.orchestrate.engines import PolicyEngine, RemoteEngine

WATCH_S = 0.5
"""Between two looks at the engines."""


class Supervisor:
    def __init__(self, engine: PolicyEngine, engines: EnginesConfig) -> None:
        self.engine = engine if isinstance(engine, RemoteEngine) else None
        """The run's own engines; None: nothing to supervise (an engine in this process, or
        one the user started)."""
        self.limit = engines.restarts if isinstance(engines, SpawnedEngines) else 0
        self.restarts = 0
        self._reported = 0

    def take_restarts(self) -> int:
        """Restarts since the last call."""
        restarts, self._reported = self.restarts - self._reported, self.restarts
        return restarts

    async def watch(self) -> None:
        """For as long as the run goes; raises when an engine dies once too often."""
        if self.engine is None or self.engine.processes is None:
            await asyncio.Event().wait()  # never set: nothing to watch
            return
        engine, processes = self.engine, self.engine.processes
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                for index in range(len(engine.sync.urls)):
                    await self._check(http, engine, processes, index)
                await asyncio.sleep(WATCH_S)

    async def _check(
        self, http: httpx.AsyncClient, engine: RemoteEngine, processes: EngineLauncher, index: int
    ) -> None:
        router, sync, ended = engine.router, engine.sync, await processes.ended(index)
        if ended is None and index not in router.down and sync.joined(index):
            return  # serving
        if ended is None and not await answers(http, sync.urls[index]):
            # one that exited while it was asked is said to have, with its code
            ended = await processes.ended(index) or "stopped answering"
        if ended is not None:
            self._count(processes, index, ended)
            router.take_down(index)
            sync.leave(index)
            await processes.restart(index)
        try:  # restarted, or answering again after a failed request or push
            await asyncio.to_thread(sync.rejoin, index)
        except EngineGone:
            return  # gone again: the next look restarts it
        await router.serve_again(index)

    def _count(self, processes: EngineLauncher, index: int, died: str) -> None:
        log = processes.log(index)
        if self.restarts == self.limit:
            raise UsageError(
                f"engine {index} {died} after {self.restarts} restarts of the run's engines "
                f"(engines.restarts = {self.limit}): stopping the run (log: {log})"
            )
        self.restarts += 1
        print(
            f"reinforge: engine {index} {died}; restarting it ({self.restarts} of at most "
            f"{self.limit} restarts, log: {log})",
            file=sys.stderr,
            flush=True,
        )
