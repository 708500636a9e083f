"""Where the loop's policy samples, and how the trainer's new weights reach it: an engine
in this process (the default), or `reinforge serve` running as its own process on this
machine (`loop.engine_url`), which takes weights as a file through `POST /v1/weights`.

Either way the rollout side talks to the engine through the same server API, and the
loop asks only for the client, the current policy version, and a training step that ends
with the weights synced.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Protocol

import httpx
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.errors import UsageError
from reinforge.policy.backends import SamplingEngine, load_engine
from reinforge.policy.client import PolicyClient
from reinforge.policy.engine import Engine
from reinforge.train.batching import TrainBatch
from reinforge.train.trainable import full_weights
from reinforge.train.trainer import Trainer, TrainStats


class PolicyEngine(Protocol):
    client: PolicyClient

    @property
    def version(self) -> int:
        """The policy version of the weights the trainer trains now."""
        ...

    def train_step(self, trainer: Trainer, batch: TrainBatch) -> tuple[TrainStats, float]:
        """One optimizer step, then the weight sync; returns the trainer's metrics and the
        sync's seconds. Runs in a worker thread while the rollout side goes on."""
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
        self.client = PolicyClient.for_engine(self.engine, config.rollout.sampling)

    @property
    def version(self) -> int:
        return self.engine.version

    def train_step(self, trainer: Trainer, batch: TrainBatch) -> tuple[TrainStats, float]:
        synced = self.engine.stats.sync_s
        with self.engine.paused() if self.pause_while_training else nullcontext():
            if self.shared:
                trained = trainer.step(batch, update=self._shared.weight_update())
            else:
                trained = trainer.step(batch)
                with full_weights(trainer.model) as weights:
                    self.engine.update_weights(weights)
        return trained, self.engine.stats.sync_s - synced

    async def aclose(self) -> None:
        await self.client.close()
        self.engine.close()


class RemoteEngine:
    """`reinforge serve` on this machine, started with `server.weights_token`. Weights
    travel as a safetensors file (under /dev/shm, in memory, where there is one); the
    server applies them between two decode steps and its requests in flight go on."""

    def __init__(
        self, client: PolicyClient, url: str, token: str | None, pause_lease_s: float | None
    ) -> None:
        self.client = client
        self.url = url
        self.pause_lease_s = pause_lease_s
        """Partial mode: decoding is held for the training step, for at most this long."""
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token or ''}"},
            timeout=600.0,
        )
        memory = Path("/dev/shm")
        where = memory if memory.is_dir() else None
        self._dir = Path(tempfile.mkdtemp(prefix="reinforge-weights-", dir=where))
        self._version = 0

    @classmethod
    async def connect(cls, config: Config, model: PreTrainedModel, version: int) -> RemoteEngine:
        """Connect, and hand the server the trainer's weights as `version`: it may have
        started from another model or served another run."""
        url = config.loop.engine_url
        assert url is not None
        client = await PolicyClient.for_url(url, config.rollout.sampling)
        lease = config.loop.pause_lease_s if config.loop.mode == "partial" else None
        engine = cls(client, url, config.loop.engine_token, lease)
        try:
            engine.push(model, version)
        except BaseException:  # a refused first push must not leave its folder behind
            await engine.aclose()
            raise
        return engine

    @property
    def version(self) -> int:
        return self._version

    def train_step(self, trainer: Trainer, batch: TrainBatch) -> tuple[TrainStats, float]:
        if self.pause_lease_s is not None:
            self._post("/pause", {"lease_s": self.pause_lease_s}, "pause decoding")
        try:
            trained = trainer.step(batch)
            started = time.perf_counter()
            self.push(trainer.model, self._version + 1)
            return trained, time.perf_counter() - started
        finally:
            if self.pause_lease_s is not None:
                self._post("/resume", {}, "resume decoding")

    def push(self, model: PreTrainedModel, version: int) -> None:
        path = self._dir / "weights.safetensors"
        with full_weights(model) as weights:
            tensors = {name: t.detach().contiguous() for name, t in weights.items()}
            save_file(tensors, path)
        try:
            answer = self._post(
                "/weights", {"path": str(path), "version": version}, "take the weights"
            )
        finally:
            path.unlink(missing_ok=True)
        self._version = answer["policy_version"]

    def _post(self, route: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            response = self._http.post(route, json=body)
        except httpx.HTTPError as error:
            raise UsageError(f"the engine at {self.url} did not {what}: {error}") from error
        if response.status_code != 200:
            message = response.json().get("error", {}).get("message", response.text)
            raise UsageError(f"the engine at {self.url} refused to {what}: {message}")
        return response.json()

    async def aclose(self) -> None:
        await self.client.close()
        self._http.close()
        shutil.rmtree(self._dir, ignore_errors=True)


async def open_engine(
    config: Config, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int
) -> PolicyEngine:
    """The engine `config.loop` names, sampling the trainer's weights as `version`."""
    if config.loop.engine_url is None:
        return LocalEngine(config, model, tokenizer, version)
    return await RemoteEngine.connect(config, model, version)
