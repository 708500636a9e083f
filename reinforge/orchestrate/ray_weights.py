"""The weights of a Ray run through Ray's object store (`engines.weight_sync =
"object_store"`): put once by the driver, taken by each engine's actor on its own node
(`EngineActor.take_weights`), so that no file path crosses nodes.

With `engines.weight_sync.delta`, a push after the first sends each bucket as its change
since the last push where that is smaller (`policy/weight_delta.py`): an engine's actor
keeps the buckets it last took and applies the changes to them. Every bucket also lies
whole in the store, on the driver's node, and a node pulls it only where its actor cannot
build it from a delta: no base (a new or restarted actor), another base version, or a
checksum that does not match.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from reinforge.orchestrate.broadcast_weights import BroadcastPush
from reinforge.orchestrate.engine_host import EngineGone
from reinforge.orchestrate.ray_engine_actor import Push
from reinforge.orchestrate.weight_sync import EngineLinks, check_versions, packed_weights
from reinforge.policy.weight_buckets import Bucket
from reinforge.policy.weight_delta import encode
from reinforge.train.trainer import PolicyTrainer

try:
    import ray
except ImportError:  # a Ray run says so in one line (`RayCluster`)
    ray = None

if TYPE_CHECKING:
    from reinforge.orchestrate.ray_engines import RayEngines


class ObjectStorePush(EngineLinks):
    """The trainer's weights, cast to `engine.dtype` and packed in buckets
    (`policy/weight_buckets.py`), put once in Ray's object store, with (`delta`) each
    bucket's change since the last push where that is smaller; each engine's actor takes
    them on its own node and hands them to its engine over localhost, so no file path
    crosses nodes. The last push stays in the store, whole, for a restarted engine."""

    def __init__(self, engines: RayEngines, dtype: torch.dtype, delta: bool) -> None:
        super().__init__(engines.urls, engines.token, supervised=True, relay=engines.relay)
        self._engines = engines
        self._dtype = dtype
        self._delta = delta
        """`engines.weight_sync.delta`."""
        self._held: list[Bucket] = []
        """With `delta`, the last push's buckets, in this process: what the next one's
        deltas are from."""
        self._last: list[Any] = []
        """The last push's buckets in the object store (their refs keep them there)."""
        self._sizes: list[int] = []
        """Their bytes."""

    def _deliver(self, trainer: PolicyTrainer, version: int) -> tuple[int, int, float]:
        started = time.perf_counter()
        buckets = packed_weights(trainer, self._dtype)
        self._last = [ray.put(bucket) for bucket in buckets]
        self._sizes = [bucket.data.nbytes for bucket in buckets]
        deltas = [self._changes(i, bucket) for i, bucket in enumerate(buckets)]
        self._held = buckets if self._delta else []
        pack_s = time.perf_counter() - started
        up = self.up()
        push = Push(version, self.version, deltas, self._last, self._sizes, self._delta)
        served = self._engines.give(up, push)
        for index, answer in zip(up, served, strict=True):
            if answer is None:
                self._joined[index] = False  # died: its supervisor brings it back
        took = [answer for answer in served if answer is not None]
        check_versions([v for v, _ in took], version)
        return sum(moved for _, moved in took), len(took), pack_s

    def _changes(self, index: int, bucket: Bucket) -> Any:
        if index >= len(self._held):
            return None
        delta = encode(self._held[index], bucket, self.version)
        return None if delta is None else ray.put(delta)

    def _give_last(self, index: int) -> None:
        whole = Push.whole(self.version, self._last, self._sizes, keep=self._delta)
        if self._engines.give([index], whole) == [None]:
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
        sizes = [bucket.data.nbytes for bucket in self._last]
        if self._engines.give([index], Push.whole(self.version, refs, sizes, False)) == [None]:
            raise EngineGone(f"engine {index} did not take the weights")
