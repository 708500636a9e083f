"""A Ray run's spawned engines (`cluster.backend = "ray"`): each in an actor that starts
`reinforge serve` listening on its node's address, which the run reaches it at, and
supervises nothing itself: the run's `Supervisor` sees it through `ended` and `restart`,
as it sees local processes. An engine keeps its URL across restarts. It logs on its own
node, and the run copies the log to its directory (`orchestrate/ray_logs.py`). Its actor
relays the run's control posts (a push, a pause, a resume) to it over the node's loopback,
the only source those routes take, so the run reaches engines on any machine."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import torch

from reinforge.config import Config
from reinforge.errors import UsageError
from reinforge.orchestrate.config import (
    BroadcastSync,
    FileSync,
    ObjectStoreSync,
    SpawnedEngines,
)
from reinforge.orchestrate.engine_host import START_S, STOP_S, EngineGone
from reinforge.orchestrate.engine_processes import engine_settings, settings_toml
from reinforge.orchestrate.ray_actors import ANSWER_S, ask, death, ray, reason, release
from reinforge.orchestrate.ray_engine_actor import EngineActor, Push
from reinforge.orchestrate.ray_logs import LogCopies
from reinforge.orchestrate.ray_weights import ObjectStorePush, RayBroadcastPush
from reinforge.orchestrate.weight_sync import EngineLinks, FilePush

if TYPE_CHECKING:
    from reinforge.orchestrate.ray_cluster import RayCluster

if ray is not None:
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError


class _ActorLost(Exception):
    """An engine's actor died or does not answer: its engine is lost with it. The message
    says how, following "engine <index>"."""


class RayEngines:
    """The run's engines as Ray actors; the `EngineLauncher` of a Ray run."""

    def __init__(self, cluster: RayCluster, config: Config, spawned: SpawnedEngines) -> None:
        self.cluster = cluster
        self.token = secrets.token_urlsafe(32)
        self.logs = config.run_dir / "engines"
        self.urls: list[str] = []
        settings = engine_settings(config, self.token, gpu=spawned.resources.gpus > 0)
        self._settings = settings_toml(settings)
        self._group, self._options = cluster.place(spawned.resources, spawned.count, "engines")
        self._actors: list[Any] = []
        self._ports: list[int | None] = [None] * spawned.count
        """Each engine's port once it has one: a restarted actor takes it again."""
        self._sync = spawned.weight_sync
        self._dtype = getattr(torch, settings.engine.dtype)
        self._copies = LogCopies([self.log(i) for i in range(spawned.count)], self._now)

    @classmethod
    async def start(
        cls, cluster: RayCluster, config: Config, spawned: SpawnedEngines
    ) -> RayEngines:
        """`spawned.count` engine actors, each answering."""
        engines = cls(cluster, config, spawned)
        engines.logs.mkdir(parents=True, exist_ok=True)
        try:
            for index in range(spawned.count):
                engines._actors.append(engines._actor(index))
            engines._copies.follow()
            engines.urls = await asyncio.to_thread(engines._started, range(spawned.count))
        except BaseException:
            engines.stop()
            raise
        engines._ports = [httpx.URL(url).port for url in engines.urls]
        return engines

    def _actor(self, index: int) -> Any:
        """Engine `index`'s actor, in its bundle, on its port once it has one."""
        actor = ray.remote(concurrency_groups={"log": 1})(EngineActor)
        actor = actor.options(**self._options[index])
        handle = actor.remote(self._settings, index, str(self.log(index)), self._ports[index])
        if isinstance(self._sync, FileSync):
            self.cluster.require_here(
                ask(handle.node, f"engine {index}"),
                f"engine {index}",
                'engines.weight_sync = "file" loads the weights from a file of the run\'s node',
            )
        return handle

    def _now(self) -> list[Any]:
        """The engines' actors now: a copy, which a restart does not change under a reader."""
        return list(self._actors)

    def _started(self, indices: range | list[int]) -> list[str]:
        refs = [self._actors[i].start.remote() for i in indices]
        try:
            return ray.get(refs, timeout=START_S + ANSWER_S)
        except RayTaskError as error:
            raise (error.cause if isinstance(error.cause, UsageError) else error) from None
        except GetTimeoutError:
            raise UsageError(
                f"engines {list(indices)} did not answer within {START_S + ANSWER_S:.0f} s "
                "of their start (is their node up?)"
            ) from None
        except RayActorError:
            raise UsageError(
                f"an actor of engines {list(indices)} died while starting its engine "
                "(is its node up?)"
            ) from None

    async def ended(self, index: int) -> str | None:
        """Asked without blocking the loop that runs every rollout."""
        try:
            code = await self._returncode(index)
        except _ActorLost as lost:
            return str(lost)
        return None if code is None else f"exited with code {code}"

    async def _returncode(self, index: int) -> int | None:
        """Engine `index`'s exit code as its actor says (None while it runs); `_ActorLost`
        should the actor have died or hang, the engine with it."""
        answer = asyncio.wrap_future(self._actors[index].returncode.remote().future())
        try:  # not `wait_for`: on Python 3.11 it swallows a cancel that meets the answer
            async with asyncio.timeout(ANSWER_S):
                return await answer
        except TimeoutError:
            how, why = "did not answer through", f"within {ANSWER_S:.0f} s (is its node up?)"
        except ActorUnavailableError as error:  # Ray cannot reach it: lost, for all we know
            how, why = "could not be reached through", f"({reason(error)})"
        except RayActorError as error:
            how, why = "died with", f"({reason(error)})"
        raise _ActorLost(f"{how} its Ray actor on node {self._node(index)} {why}")

    def _node(self, index: int) -> str:
        """The address of engine `index`'s node: where it listens, as its actor said."""
        return httpx.URL(self.urls[index]).host

    async def restart(self, index: int) -> None:
        """The engine again at its port: by its actor, or by a new one should the actor
        have died with it."""
        try:
            await self._returncode(index)
        except _ActorLost:
            ray.kill(self._actors[index])
            self._actors[index] = await asyncio.to_thread(self._actor, index)
            # placed within a bound: a dead node's bundle waits for a node that never comes
            who = f"engine {index} (on node {self._node(index)}), restarted by a new actor,"
            try:
                await asyncio.to_thread(ask, self._actors[index].node, who)
            except UsageError:  # never placed, so it started nothing: no stop to wait for
                ray.kill(self._actors[index])
                raise
        (url,) = await asyncio.to_thread(self._started, [index])
        if url != self.urls[index]:  # a new actor on another node: routed and synced by URL
            raise UsageError(f"engine {index} came back at {url}, not {self.urls[index]}")

    def log(self, index: int) -> Path:
        return self.logs / f"engine-{index}.log"

    def weight_sync(self) -> EngineLinks:
        if isinstance(self._sync, ObjectStoreSync):
            return ObjectStorePush(self, self._dtype, self._sync.delta)
        if isinstance(self._sync, BroadcastSync):
            return RayBroadcastPush(self, self._dtype, self._sync.timeout_s)
        return FilePush(self.urls, self.token, supervised=True, relay=self.relay)

    def relay(self, index: int, route: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        """`route` posted to engine `index` by its actor, on the engine's node; a weight
        load may take as long as a start. `EngineGone` should the actor be gone or silent."""
        ref = self._actors[index].post.remote(self.token, route, body, what)
        try:
            return ray.get(ref, timeout=START_S + ANSWER_S)
        except RayTaskError as error:
            raise (error.cause if isinstance(error.cause, UsageError) else error) from None
        except RayActorError as error:
            gone = f"engine {index} did not {what}: its actor died {death(error)}"
            raise EngineGone(gone) from None
        except GetTimeoutError:
            raise EngineGone(
                f"engine {index} did not {what} within {START_S + ANSWER_S:.0f} s (is its node up?)"
            ) from None

    def give(self, indices: list[int], push: Push) -> list[tuple[int, int] | None]:
        """Engines `indices` take `push`, at once: each the version it serves and the
        bytes its actor took from the store, or None for one that died (or whose actor did)."""
        refs = [self._actors[i].take_weights.remote(self.token, push) for i in indices]
        served: list[tuple[int, int] | None] = []
        for ref in refs:  # each within its deadline: a hung node must not hang the push
            try:
                served.append(ray.get(ref, timeout=START_S + ANSWER_S))
            except RayTaskError as error:
                if not isinstance(error.cause, EngineGone):
                    raise (error.cause if isinstance(error.cause, UsageError) else error) from None
                served.append(None)
            except (RayActorError, GetTimeoutError):
                served.append(None)
        return served

    def stop(self) -> None:
        """Each engine stopped by its actor, then the actors and their placement."""
        refs = [actor.stop.remote() for actor in self._actors]
        ray.wait(refs, num_returns=len(refs), timeout=STOP_S + 5.0)
        self._copies.close()
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        release(self._group)
        self._group = None
