"""Where the loop's policy samples (`engines.kind`): an engine in this process (the
default), or `reinforge serve` processes (one the user started, or those the run spawns).

Either way the rollout side talks to the engines through the same server API, and the
loop asks only for the router over their clients, the current policy version, the
transport that pushes the trainer's weights to them (`orchestrate/weight_sync.py`), and a
hold on decoding while the trainer trains (partial mode).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.orchestrate.config import (
    InProcessEngine,
    PartialLoop,
    ServedEngine,
    SpawnedEngines,
)
from reinforge.orchestrate.engine_processes import EngineLauncher, EngineProcesses
from reinforge.orchestrate.weight_sync import (
    CopiedWeights,
    EngineLinks,
    FilePush,
    SharedWeights,
    Synced,
    WeightSync,
)
from reinforge.policy.backends import SamplingEngine, load_engine, samples_on_gpu
from reinforge.policy.client import PolicyClient
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import EngineStats
from reinforge.policy.router import Router
from reinforge.train.batching import TrainBatch
from reinforge.train.trainable import full_weights
from reinforge.train.trainer import PolicyTrainer, Trainer, TrainStats

Launch = Callable[[Config, SpawnedEngines], Awaitable[EngineLauncher]]
"""Starts a run's spawned engines: on this machine, or on a cluster."""


class PolicyEngine(Protocol):
    router: Router
    sync: WeightSync

    @property
    def version(self) -> int:
        """The policy version of the weights the trainer trains now."""
        ...

    def training(self) -> AbstractContextManager[None]:
        """Held while the trainer trains and pushes: partial mode pauses decoding."""
        ...

    def model_stats(self) -> EngineStats | None:
        """The running stats of a built-in engine in this process; None for any other."""
        ...

    async def aclose(self) -> None: ...


def train_and_sync(
    engine: PolicyEngine, trainer: PolicyTrainer, batch: TrainBatch
) -> tuple[TrainStats, Synced]:
    """The batch's optimizer steps, then the new weights to every engine: one way, from
    the trainer to the engines. Runs in a worker thread while the rollout side goes on."""
    version = engine.version + 1
    with engine.training():
        with engine.sync.training(trainer):
            trained = trainer.step(batch)
        return trained, engine.sync.push(trainer, version)


class LocalEngine:
    """The engine in this process (`engines.kind = "in_process"`). The built-in engine in
    float32 runs the trainer's own model: no second copy, and the optimizer step, made
    while the engine is held, is the sync. A bfloat16 engine, or vLLM, keeps its own copy,
    refreshed after each step."""

    def __init__(
        self,
        config: Config,
        trainer: Trainer,
        tokenizer: PreTrainedTokenizerBase,
        version: int,
    ) -> None:
        self.engine: SamplingEngine
        self.sync: WeightSync
        dtype = config.engine.dtype_on(samples_on_gpu(config.model))
        shares_weights = config.model.engine == "builtin" and dtype == "float32"
        if shares_weights:
            shared = Engine(trainer.model, tokenizer, config.model.name, config.engine)
            shared.version = version
            self.engine, self.sync = shared, SharedWeights(shared)
        else:
            self.engine = load_engine(config.model, config.engine)
            with full_weights(trainer.model) as weights:  # a checkpoint's or merged weights
                self.engine.update_weights(weights, version)
            self.sync = CopiedWeights(self.engine)
        self.pause_while_training = isinstance(config.loop, PartialLoop)
        self.router = Router([PolicyClient.for_engine(self.engine, config.rollout.sampling)])

    @property
    def version(self) -> int:
        return self.engine.version

    def training(self) -> AbstractContextManager[None]:
        return self.engine.paused() if self.pause_while_training else nullcontext()

    def model_stats(self) -> EngineStats | None:
        return self.engine.stats if isinstance(self.engine, Engine) else None

    async def aclose(self) -> None:
        await self.router.aclose()
        self.engine.close()


class RemoteEngine:
    """`reinforge serve` processes, started with a weights token; the weights reach them
    by the transport their launcher gives (`EngineLinks`), a file of this machine for an
    engine the user started.

    The run's own engines are supervised (`orchestrate/supervisor.py`), which takes one
    that dies out of the router and the pushes and brings it back."""

    def __init__(
        self,
        router: Router,
        sync: EngineLinks,
        pause_lease_s: float | None,
        processes: EngineLauncher | None = None,
    ) -> None:
        self.router = router
        self.sync = sync
        self.pause_lease_s = pause_lease_s
        """Partial mode: decoding is held for the training step, for at most this long."""
        self.processes = processes
        """The run's own engines, stopped with it; None: an engine the user started."""

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
        lease = config.loop.pause_lease_s if isinstance(config.loop, PartialLoop) else None
        router = Router(clients, supervised=processes is not None)
        links = FilePush(urls, token, False) if processes is None else processes.weight_sync()
        engine = cls(router, links, lease, processes)
        try:
            engine.sync.push(trainer, version)
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
        spawned: SpawnedEngines,
        launch: Launch = EngineProcesses.start,
    ) -> RemoteEngine:
        """Start the run's own `spawned` engines (on this machine, or where `launch` places
        them) and connect to them; they stop when it closes."""
        processes = await launch(config, spawned)
        try:
            urls, token = processes.urls, processes.token
            return await cls.connect(config, trainer, version, urls, token, processes)
        except BaseException:
            processes.stop()
            raise

    @property
    def version(self) -> int:
        return self.sync.version

    @contextmanager
    def training(self) -> Iterator[None]:
        lease = self.pause_lease_s
        try:
            if lease is not None:
                self.sync.post_all("/pause", {"lease_s": lease}, "pause decoding")
            yield
        finally:  # every engine resumes, should some have refused to pause
            if lease is not None:
                self.sync.post_all("/resume", {}, "resume decoding")

    def model_stats(self) -> EngineStats | None:
        return None

    async def aclose(self) -> None:
        await self.router.aclose()
        self.sync.close()
        if self.processes is not None:
            self.processes.stop()


async def open_engine(
    config: Config,
    trainer: PolicyTrainer,
    tokenizer: PreTrainedTokenizerBase,
    version: int,
    launch: Launch = EngineProcesses.start,
) -> PolicyEngine:
    """The engines `config.engines` names, sampling the trainer's weights as `version`.
    `launch` starts spawned ones (the cluster's launcher)."""
    match config.engines:
        case InProcessEngine():
            assert isinstance(trainer, Trainer)  # `Config` refuses it for a sharded trainer
            return LocalEngine(config, trainer, tokenizer, version)
        case ServedEngine(url=url, token=token):
            return await RemoteEngine.connect(config, trainer, version, [url], token)
        case SpawnedEngines() as spawned:
            return await RemoteEngine.start(config, trainer, version, spawned, launch)
