"""How a trainer's new weights reach the engines that sample: one way, after the step.

The loop trains, then pushes: `synced = sync.push(trainer, version)`. Neither side calls
the other back. Its transports, by where the engine holds its weights:

| transport       | engine                                   | what a push moves           |
|-----------------|------------------------------------------|-----------------------------|
| `SharedWeights` | built-in fp32, in this process: the      | nothing; the optimizer step |
|                 | trainer's own tensors                    | is the sync                 |
| `CopiedWeights` | in this process with its own copy        | the full weights, copied in |
|                 | (bf16, vLLM)                             | place                       |
| `FilePush`      | `reinforge serve` processes              | one safetensors file each   |
|                 |                                          | engine loads, at once       |
| `ObjectStore-   | `reinforge serve` in Ray actors          | buckets in Ray's object     |
| Push` (Ray,     | (`orchestrate/ray_engine_actor.py`)      | store, one copy per node;   |
| `ray_weights`)  |                                          | with `delta`, after the     |
|                 |                                          | first only changed elements |
| `Broadcast-     | `reinforge serve` processes, of this     | buckets broadcast over a    |
| Push` (`broad-  | machine or in Ray actors, in a gloo      | group of its own, copied in |
| cast_weights`)  | group with the run's process             | as the next one lands       |

Shared tensors need one thing more: no decode step may read them while the optimizer
writes them. The loop trains inside `sync.training(trainer)`, where `SharedWeights` holds
the engine from the optimizer's first update (its own step hook) to the step's end, when
the version moves on; the trainer itself knows nothing of engines.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch

from reinforge.errors import UsageError
from reinforge.orchestrate.engine_host import EngineGone, loopback, post_to_engine
from reinforge.policy.backends import SamplingEngine
from reinforge.policy.engine import Engine
from reinforge.policy.weight_buckets import Bucket, pack
from reinforge.train.sharded import TrainerRanks
from reinforge.train.trainable import full_weights
from reinforge.train.trainer import PolicyTrainer, Trainer


@dataclass(frozen=True)
class Synced:
    """What one weight sync did."""

    seconds: float
    engines: int
    bytes: int
    """What the engines that took the weights were sent, summed over them: the weights'
    size each, or with `object_store`'s `delta` each bucket's changes where the engine could
    build it from them (`ray_weights.py`); 0 when the engine shares the trainer's weights (the
    optimizer step is the sync)."""
    write_s: float = 0.0
    """The trainer writing the weights once for every engine (the file handoff); the
    rest of `seconds` is the engines loading them, at once."""


class WeightSync(Protocol):
    def training(self, trainer: PolicyTrainer) -> AbstractContextManager[None]:
        """Around the trainer's step: what engines reading its very tensors need."""
        ...

    def push(self, trainer: PolicyTrainer, version: int) -> Synced:
        """Every engine samples the trainer's weights as `version` from its next decode
        step on. Runs in the training thread while the rollout side goes on."""
        ...


class SharedWeights:
    """The engine decodes with the trainer's own model: no second copy. No decode step
    runs from the optimizer's first update of a step to the step's end, so no token comes
    from weights between two of a batch's updates, which no version names; the version
    moves on as the hold ends."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sync_s = engine.stats.sync_s

    @contextmanager
    def training(self, trainer: PolicyTrainer) -> Iterator[None]:
        assert isinstance(trainer, Trainer)  # in this process: `LocalEngine` sees to it
        with ExitStack() as hold:  # a step that raises leaves the version as it was

            def first_update(*_: Any) -> None:
                if not held:
                    held.append(hold.enter_context(self.engine.weight_update()))

            held: list[int] = []
            hook = trainer.optimizer.register_step_pre_hook(first_update)
            try:
                yield
            finally:
                hook.remove()

    def push(self, trainer: PolicyTrainer, version: int) -> Synced:
        if self.engine.version != version:
            raise RuntimeError(
                f"the shared engine holds version {self.engine.version} after the step to "
                f"{version}: the trainer changed its weights without the engine's lock"
            )
        return Synced(self._take_sync_s(), engines=1, bytes=0)

    def _take_sync_s(self) -> float:
        """The engine's time in weight updates since the last push."""
        total = self.engine.stats.sync_s
        seconds, self._sync_s = total - self._sync_s, total
        return seconds


class CopiedWeights:
    """An engine in this process with its own copy of the weights (another dtype, or
    vLLM): each push copies the full weights (LoRA merged) in, between two decode steps."""

    def __init__(self, engine: SamplingEngine) -> None:
        self.engine = engine

    def training(self, trainer: PolicyTrainer) -> AbstractContextManager[None]:
        return nullcontext()

    def push(self, trainer: PolicyTrainer, version: int) -> Synced:
        assert isinstance(trainer, Trainer)  # in this process: `open_engine` sees to it
        started_s = self.engine.stats.sync_s
        with full_weights(trainer.model) as weights:
            self.engine.update_weights(weights, version)
            moved = sum(t.numel() * t.element_size() for t in weights.values())
        return Synced(self.engine.stats.sync_s - started_s, engines=1, bytes=moved)


class EngineLinks(ABC):
    """The run's HTTP links to `reinforge serve` engines, reached at `urls` with a weights
    token: what pauses and resumes them, and which of them take pushes. A transport to
    such engines (`FilePush`, Ray's `ObjectStorePush`) is one of these that delivers.

    Of the run's own engines (`supervised`), one that dies `leave`s, and pushes skip it,
    or lose it should it die during one; restarted, it `rejoin`s with the last push, kept
    for that, and its version. An engine the user started that cannot be reached is the
    run's error.

    Engines take pushes, pauses and resumes from loopback connections alone. This
    machine's are posted to from here; engines on other nodes through a `relay`, which
    posts from each engine's own node."""

    def __init__(
        self, urls: list[str], token: str | None, supervised: bool, relay: Relay | None = None
    ) -> None:
        self.urls = urls
        self.supervised = supervised
        self.version = 0
        """Of the last push."""
        headers = {"Authorization": f"Bearer {token or ''}"}
        self._http = [
            httpx.Client(
                base_url=url.rstrip("/"), headers=headers, timeout=600.0, transport=loopback(url)
            )
            for url in (urls if relay is None else [])
        ]
        self.post: Relay = relay or self._post_here
        self._pool = ThreadPoolExecutor(len(urls), thread_name_prefix="reinforge-sync")
        self._joined = [True] * len(urls)
        """Engines that hold the last push and take the next: those up, to the pushes."""
        self._lock = threading.Lock()
        """Held by a push and by a rejoin: a restarted engine takes the last push, whole."""

    def training(self, trainer: PolicyTrainer) -> AbstractContextManager[None]:
        return nullcontext()

    def push(self, trainer: PolicyTrainer, version: int) -> Synced:
        started = time.perf_counter()
        with self._lock:
            moved, engines, write_s = self._deliver(trainer, version)
            self.version = version
        return Synced(time.perf_counter() - started, engines, moved, write_s)

    @abstractmethod
    def _deliver(self, trainer: PolicyTrainer, version: int) -> tuple[int, int, float]:
        """The trainer's weights to every engine up, as `version`; the bytes they loaded,
        how many took them, and the seconds writing or packing them took."""

    @abstractmethod
    def _give_last(self, index: int) -> None:
        """The last push's weights to engine `index`."""

    def leave(self, index: int) -> None:
        """Engine `index` died: pushes skip it."""
        with self._lock:
            self._joined[index] = False

    def rejoin(self, index: int) -> None:
        """Engine `index`, restarted (or found answering after a failed request), takes the
        last push, and every push after it. `EngineGone` should it die meanwhile."""
        with self._lock:
            self._give_last(index)
            self._joined[index] = True

    def joined(self, index: int) -> bool:
        return self._joined[index]

    def up(self) -> list[int]:
        return [index for index, joined in enumerate(self._joined) if joined]

    def post_all(self, route: str, body: dict[str, Any], what: str) -> list[dict[str, Any]]:
        """`route` on every engine up at once; their answers, or the first refusal. Of the
        run's own engines, one that cannot be reached (it died) leaves, for its supervisor
        to bring back."""
        answers = list(self._pool.map(lambda i: self._reach(i, route, body, what), self.up()))
        return [answer for answer in answers if answer is not None]

    def _post_here(self, index: int, route: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        return post_to_engine(self._http[index], route, body, what)

    def _reach(
        self, index: int, route: str, body: dict[str, Any], what: str
    ) -> dict[str, Any] | None:
        try:
            return self.post(index, route, body, what)
        except EngineGone:
            if not self.supervised:
                raise
            self._joined[index] = False
            return None

    def close(self) -> None:
        for http in self._http:
            http.close()
        self._pool.shutdown()


class FilePush(EngineLinks):
    """Engines on the run's machine: weights travel as one safetensors file (under
    /dev/shm, in memory, where there is one) that every engine loads at once through
    `POST /v1/weights`; each applies them between two decode steps, and its requests in
    flight go on. The last push's file is kept for a restarted engine."""

    def __init__(
        self, urls: list[str], token: str | None, supervised: bool, relay: Relay | None = None
    ) -> None:
        super().__init__(urls, token, supervised, relay)
        self._dir = HeldFolder()
        self._weights = self._dir.path / "weights.safetensors"

    def _deliver(self, trainer: PolicyTrainer, version: int) -> tuple[int, int, float]:
        started = time.perf_counter()
        written = self._weights.with_suffix(".writing")
        trainer.write_weights(written)
        os.replace(written, self._weights)  # a whole file, or the last one
        write_s = time.perf_counter() - started
        size = self._weights.stat().st_size
        body = {"path": str(self._weights), "version": version}
        answers = self.post_all("/weights", body, "take the weights")
        if not self.supervised:  # nothing would restart an engine from the file
            self._weights.unlink()
        check_versions([answer["policy_version"] for answer in answers], version)
        return size * len(answers), len(answers), write_s

    def _give_last(self, index: int) -> None:
        body = {"path": str(self._weights), "version": self.version}
        self.post(index, "/weights", body, "take the weights")

    def close(self) -> None:
        super().close()
        self._dir.remove()


WEIGHTS_PREFIX = "reinforge-weights-"


class HeldFolder:
    """A new folder for weight files: in memory (/dev/shm) where there is one, since an
    engine reads them once, at once. A run killed outright (SIGKILL, the OOM killer)
    cannot remove it, and it holds the model's weights in RAM, so its owner holds an
    exclusive lock on it for life (the kernel drops the lock when the owner dies, however
    it dies), and each new one first removes those whose lock is free. A lock, not the
    owner's pid and start time as sandboxes are reaped (`sandbox/reaper.py`): containers
    given the host's IPC namespace share /dev/shm but not its pids, so there a live run
    would look dead. The name holds the owner's process id, to say whose a folder is."""

    def __init__(self) -> None:
        memory = Path("/dev/shm")
        parent = memory if memory.is_dir() else Path(tempfile.gettempdir())
        remove_abandoned(parent)
        # Locked under a name the remover skips, then renamed: never seen unlocked.
        hidden = Path(tempfile.mkdtemp(prefix=f".{WEIGHTS_PREFIX}", dir=parent))
        self._lock = os.open(hidden, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.path = parent / f"{WEIGHTS_PREFIX}{os.getpid()}-{hidden.name.rsplit('-', 1)[-1]}"
        hidden.rename(self.path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)


def remove_abandoned(parent: Path) -> None:
    """Removes the weight folders in `parent` whose owner is gone (their lock is free)."""
    for folder in parent.glob(f"{WEIGHTS_PREFIX}*"):
        try:
            handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # removed meanwhile, or not a folder
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its owner lives
            continue
        finally:
            os.close(handle)
        shutil.rmtree(folder, ignore_errors=True)


def check_versions(served: list[int], version: int) -> None:
    if not set(served) <= {version}:
        raise UsageError(f"engines serve versions {sorted(set(served))} after a push of {version}")


Relay = Callable[[int, str, dict[str, Any], str], dict[str, Any]]
"""`(index, route, body, what)`: `route` posted with `body` to engine `index` from its own
node, answered as `post_to_engine` answers (`EngineGone` should it not be reached)."""


def packed_weights(trainer: PolicyTrainer, dtype: torch.dtype) -> list[Bucket]:
    """The trainer's complete weights (LoRA merged) in buckets, cast to `dtype`. A sharded
    trainer's are sent by its rank 0, wherever it runs."""
    if isinstance(trainer, Trainer):
        with full_weights(trainer.model) as weights:
            return pack(weights, dtype)
    assert isinstance(trainer, TrainerRanks)
    return pack(trainer.weights(), dtype)
