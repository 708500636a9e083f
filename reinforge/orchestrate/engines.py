"""Where the loop's policy samples, and how the trainer's new weights reach it: an engine
in this process (the default), or `reinforge serve` processes on this machine (the one at
`loop.engine_url`, or the `rollout.engines` the run starts), which take weights as a file
through `POST /v1/weights`.

Either way the rollout side talks to the engines through the same server API, and the
loop asks only for the router over their clients, the current policy version, and a
training step that ends with the weights synced to every engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.errors import UsageError
from reinforge.orchestrate.engine_processes import EngineLauncher, EngineProcesses
from reinforge.policy.backends import SamplingEngine, load_engine
from reinforge.policy.client import PolicyClient
from reinforge.policy.engine import Engine
from reinforge.policy.router import Router
from reinforge.train.batching import TrainBatch
from reinforge.train.trainable import full_weights
from reinforge.train.trainer import PolicyTrainer, Trainer, TrainStats


@dataclass(frozen=True)
class Synced:
    """What one weight sync did."""

    seconds: float
    engines: int
    bytes: int
    """The weights' size once per engine that took them; 0 when the engine shares the
    trainer's weights (the optimizer step is the sync)."""
    write_s: float = 0.0
    """The trainer writing the weights once for every engine (the file handoff); the
    rest of `seconds` is the engines loading them, at once."""


class PolicyEngine(Protocol):
    router: Router

    @property
    def version(self) -> int:
        """The policy version of the weights the trainer trains now."""
        ...

    def train_step(self, trainer: PolicyTrainer, batch: TrainBatch) -> tuple[TrainStats, Synced]:
        """The batch's optimizer steps, then the weight sync; returns the trainer's metrics
        and the sync's. Runs in a worker thread while the rollout side goes on."""
        ...

    async def aclose(self) -> None: ...


class LocalEngine:
    """The engine in this process. The built-in fp32 engine runs the trainer's own model:
    no second copy, and the optimizer step, made inside the engine's weight update, is the
    sync. A bf16 engine, or vLLM, keeps its own copy, refreshed after each step."""

    def __init__(
        self,
        config: Config,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        version: int,
    ) -> None:
        self.shared = config.model.engine == "builtin" and config.engine.dtype == "float32"
        self.engine: SamplingEngine
        if self.shared:
            self.engine = self._shared = Engine(model, tokenizer, config.model.name, config.engine)
            self.engine.version = version
        else:
            self.engine = load_engine(config.model, config.engine)
            with full_weights(model) as weights:  # a checkpoint's or adapter-merged weights
                self.engine.update_weights(weights, version)
        self.pause_while_training = config.loop.mode == "partial"
        self.router = Router([PolicyClient.for_engine(self.engine, config.rollout.sampling)])

    @property
    def version(self) -> int:
        return self.engine.version

    def train_step(self, trainer: PolicyTrainer, batch: TrainBatch) -> tuple[TrainStats, Synced]:
        assert isinstance(trainer, Trainer)  # in this process: `open_engine` sees to it
        synced_s, moved = self.engine.stats.sync_s, 0
        with self.engine.paused() if self.pause_while_training else nullcontext():
            if self.shared:
                trained = trainer.step(batch, engine=self._shared)
            else:
                trained = trainer.step(batch)
                with full_weights(trainer.model) as weights:
                    self.engine.update_weights(weights)
                    moved = sum(t.numel() * t.element_size() for t in weights.values())
        return trained, Synced(self.engine.stats.sync_s - synced_s, engines=1, bytes=moved)

    async def aclose(self) -> None:
        await self.router.aclose()
        self.engine.close()


class RemoteEngine:
    """`reinforge serve` processes on this machine, started with a weights token. Weights
    travel as one safetensors file (under /dev/shm, in memory, where there is one) that
    every engine loads at once; each applies them between two decode steps, and its
    requests in flight go on.

    The run's own engines are supervised (`orchestrate/supervisor.py`): one that dies
    `leave`s, and pushes skip it, or lose it should it die during one; restarted, it
    `rejoin`s with the last push's file, kept for that, and its version."""

    def __init__(
        self,
        router: Router,
        urls: list[str],
        token: str | None,
        pause_lease_s: float | None,
        processes: EngineLauncher | None = None,
    ) -> None:
        self.router = router
        self.urls = urls
        self.pause_lease_s = pause_lease_s
        """Partial mode: decoding is held for the training step, for at most this long."""
        self.processes = processes
        """The run's own engines, stopped with it; None: an engine the user started."""
        headers = {"Authorization": f"Bearer {token or ''}"}
        self._http = [
            httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=600.0) for url in urls
        ]
        self._pool = ThreadPoolExecutor(len(urls), thread_name_prefix="reinforge-sync")
        memory = Path("/dev/shm")
        where = memory if memory.is_dir() else None
        self._dir = Path(tempfile.mkdtemp(prefix="reinforge-weights-", dir=where))
        self._weights = self._dir / "weights.safetensors"
        self._version = 0
        self._joined = [True] * len(urls)
        """Engines that hold the last push and take the next: those up, to the pushes."""
        self._lock = threading.Lock()
        """Held by a push and by a rejoin: a restarted engine takes the last push, whole."""

    @classmethod
    async def connect(
        cls,
        config: Config,
        trainer: PolicyTrainer,
        version: int,
        urls: list[str],
        token: str | None,
        processes: EngineLauncher | None = None,
    ) -> RemoteEngine:
        """Connect, and hand every engine the trainer's weights as `version`: they may have
        started from another model or served another run."""
        # Supervised engines get no retries: a request that cannot reach its engine goes to
        # another, while a retry could reach a restarted one before it has the run's weights.
        retries = 2 if processes is None else 0
        sampling = config.rollout.sampling
        clients = [await PolicyClient.for_url(url, sampling, max_retries=retries) for url in urls]
        lease = config.loop.pause_lease_s if config.loop.mode == "partial" else None
        router = Router(clients, supervised=processes is not None)
        engine = cls(router, urls, token, lease, processes)
        try:
            engine.push(trainer, version)
        except BaseException:  # a refused first push must not leave its folder behind
            await engine.aclose()
            raise
        return engine

    @classmethod
    async def start(
        cls,
        config: Config,
        trainer: PolicyTrainer,
        version: int,
        launch: Callable[[Config], Awaitable[EngineLauncher]] = EngineProcesses.start,
    ) -> RemoteEngine:
        """Start the run's own `rollout.engines` engines (on this machine, or where
        `launch` places them) and connect to them; they stop when it closes."""
        processes = await launch(config)
        try:
            urls, token = processes.urls, processes.token
            return await cls.connect(config, trainer, version, urls, token, processes)
        except BaseException:
            processes.stop()
            raise

    @property
    def version(self) -> int:
        return self._version

    def train_step(self, trainer: PolicyTrainer, batch: TrainBatch) -> tuple[TrainStats, Synced]:
        try:
            if self.pause_lease_s is not None:
                self._post_all("/pause", {"lease_s": self.pause_lease_s}, "pause decoding")
            trained = trainer.step(batch)
            started = time.perf_counter()
            moved, engines, write_s = self.push(trainer, self._version + 1)
            seconds = time.perf_counter() - started
            return trained, Synced(seconds, engines, moved, write_s)
        finally:
            if self.pause_lease_s is not None:
                self._post_all("/resume", {}, "resume decoding")

    def push(self, trainer: PolicyTrainer, version: int) -> tuple[int, int, float]:
        """Every engine up takes the trainer's weights as `version`; returns the bytes they
        loaded, how many took them, and the seconds writing them took."""
        with self._lock:
            started = time.perf_counter()
            written = self._weights.with_suffix(".writing")
            trainer.write_weights(written)
            os.replace(written, self._weights)  # a whole file, or the last one
            write_s = time.perf_counter() - started
            size = self._weights.stat().st_size
            body = {"path": str(self._weights), "version": version}
            answers = self._post_all("/weights", body, "take the weights")
            if self.processes is None:  # nothing would restart an engine from the file
                self._weights.unlink()
            self._version = version
        served = {answer["policy_version"] for answer in answers}
        if not served <= {version}:
            raise UsageError(f"engines serve versions {sorted(served)} after a push of {version}")
        return size * len(answers), len(answers), write_s

    def leave(self, index: int) -> None:
        """Engine `index` died: pushes skip it."""
        with self._lock:
            self._joined[index] = False

    def rejoin(self, index: int) -> None:
        """Engine `index`, restarted (or found answering after a failed request), takes the
        last push, and every push after it. `EngineGone` should it die meanwhile."""
        with self._lock:
            body = {"path": str(self._weights), "version": self._version}
            _post(self._http[index], "/weights", body, "take the weights")
            self._joined[index] = True

    def joined(self, index: int) -> bool:
        return self._joined[index]

    def _post_all(self, route: str, body: dict[str, Any], what: str) -> list[dict[str, Any]]:
        """`route` on every engine up at once; their answers, or the first refusal. Of the
        run's own engines, one that cannot be reached (it died) leaves, for its supervisor
        to bring back; an engine the user started is the run's error."""
        up = [index for index, joined in enumerate(self._joined) if joined]
        answers = list(self._pool.map(lambda i: self._reach(i, route, body, what), up))
        return [answer for answer in answers if answer is not None]

    def _reach(
        self, index: int, route: str, body: dict[str, Any], what: str
    ) -> dict[str, Any] | None:
        try:
            return _post(self._http[index], route, body, what)
        except EngineGone:
            if self.processes is None:
                raise
            self._joined[index] = False
            return None

    async def aclose(self) -> None:
        await self.router.aclose()
        for http in self._http:
            http.close()
        self._pool.shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self.processes is not None:
            self.processes.stop()


class EngineGone(UsageError):
    """An engine that could not be reached: it died, or stopped answering."""


def _post(http: httpx.Client, route: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    url = str(http.base_url).rstrip("/")
    try:
        response = http.post(route, json=body)
    except httpx.HTTPError as error:
        raise EngineGone(f"the engine at {url} did not {what}: {error}") from error
    if response.status_code != 200:
        message = response.json().get("error", {}).get("message", response.text)
        raise UsageError(f"the engine at {url} refused to {what}: {message}")
    return response.json()


async def open_engine(
    config: Config,
    trainer: PolicyTrainer,
    tokenizer: PreTrainedTokenizerBase,
    version: int,
    launch: Callable[[Config], Awaitable[EngineLauncher]] = EngineProcesses.start,
) -> PolicyEngine:
    """The engines `config` names, sampling the trainer's weights as `version`: the
    server at `loop.engine_url`, else the `rollout.engines` processes the run starts
    (always processes for a sharded trainer, whose weights are not in this process), else
    one in this process. `launch` starts the run's own (the cluster's launcher)."""
    if config.loop.engine_url is not None:
        urls, token = [config.loop.engine_url], config.loop.engine_token
        return await RemoteEngine.connect(config, trainer, version, urls, token)
    if config.rollout.engines > 1 or not isinstance(trainer, Trainer):
        return await RemoteEngine.start(config, trainer, version, launch)
    return LocalEngine(config, trainer.model, tokenizer, version)
