"""The weights of a Ray run through Ray's object store (`engines.weight_sync =
"object_store"`): put once by the driver, taken by each engine's actor on its own node
(`EngineActor.take_weights`), so that no file path crosses nodes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from reinforge.orchestrate.broadcast_weights import BroadcastPush
from reinforge.orchestrate.weight_sync import (
    EngineGone,
    EngineLinks,
    check_versions,
    packed_weights,
)
from reinforge.policy.weight_buckets import total_bytes
from reinforge.train.trainer import PolicyTrainer

try:
    import ray
except ImportError:  # a Ray run says so in one line (`RayCluster`)
    ray = None

if TYPE_CHECKING:
    from reinforge.orchestrate.ray_cluster import RayEngines


class ObjectStorePush(EngineLinks):
    """The trainer's weights, cast to `engine.dtype` and packed in buckets
    (`policy/weight_buckets.py`), put once in Ray's object store; each engine's actor takes
    them on its own node and hands them to its engine over localhost, so no file path
    crosses nodes. The last push stays in the store, for a restarted engine."""

    def __init__(self, engines: RayEngines, dtype: torch.dtype) -> None:
        super().__init__(engines.urls, engines.token, supervised=True, relay=engines.relay)
        self._engines = engines
        self._dtype = dtype
        self._last: list[Any] = []
        """The last push's buckets in the object store (their refs keep them there)."""

    def _deliver(self, trainer: PolicyTrainer, version: int) -> tuple[int, int, float]:
        started = time.perf_counter()
        buckets = packed_weights(trainer, self._dtype)
        self._last = [ray.put(bucket) for bucket in buckets]
        pack_s = time.perf_counter() - started
        up = self.up()
        served = self._engines.give(up, version, self._last)
        for index, answer in zip(up, served, strict=True):
            if answer is None:
                self._joined[index] = False  # died: its supervisor brings it back
        check_versions([v for v in served if v is not None], version)
        took = sum(v is not None for v in served)
        return total_bytes(buckets) * took, took, pack_s

    def _give_last(self, index: int) -> None:
        if self._engines.give([index], self.version, self._last) == [None]:
            raise EngineGone(f"engine {index} did not take the weights")


class RayBroadcastPush(BroadcastPush):
    """The broadcast to a Ray run's engines, on any node: the group's store listens on the
    driver's node address and each engine's end on its own node's, the control goes
    through each engine's actor, and a restarted engine catches up from the object store
    (no file of the driver's node reaches another machine). The store takes connections
    from any machine while a group forms: a cluster whose network others share should take
    the object store, which Ray's own authentication guards."""

    def __init__(self, engines: RayEngines, dtype: torch.dtype, timeout_s: float) -> None:
        host = ray.util.get_node_ip_address()
        super().__init__(engines.urls, engines.token, dtype, timeout_s, host, engines.relay)
        self._engines = engines

    def _give_last(self, index: int) -> None:
        refs = [ray.put(bucket) for bucket in self._last]
        if self._engines.give([index], self.version, refs) == [None]:
            raise EngineGone(f"engine {index} did not take the weights")
