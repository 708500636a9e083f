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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from reinforge.orchestrate.broadcast_weights import BroadcastPush
from reinforge.orchestrate.weight_sync import (
    EngineGone,
    EngineLinks,
    check_versions,
    packed_weights,
)
from reinforge.policy.weight_buckets import Bucket
from reinforge.policy.weight_delta import Delta, apply, encode
from reinforge.train.trainer import PolicyTrainer

try:
    import ray
except ImportError:  # a Ray run says so in one line (`RayCluster`)
    ray = None

if TYPE_CHECKING:
    from reinforge.orchestrate.ray_engines import RayEngines


FETCHERS = 8
"""Whole buckets an engine's actor fetches at once, each laid as soon as it is here: enough
that one is laid while the next travel, few enough that a model of hundreds of buckets
does not start a thread for each."""


@dataclass(frozen=True)
class Push:
    """One push as the engines' actors take it. Its refs travel inside it, so Ray fetches
    none of them to an actor's node until the actor asks for it."""

    version: int
    base: int
    """The version the deltas apply to: the push before."""
    deltas: list[Any]
    """Per bucket, the ref of its `Delta`, or None where it goes whole."""
    full: list[Any]
    """Every bucket whole (refs)."""
    sizes: list[int]
    """Every bucket's bytes: where each lies in the file its engine reads, known before
    any arrives."""
    keep: bool
    """Whether an actor keeps the buckets for the next push's deltas (`delta`): else it
    drops them once its engine has them, and the store may free them."""

    @classmethod
    def whole(cls, version: int, full: list[Any], sizes: list[int], keep: bool) -> Push:
        """Every bucket whole: what a rejoining engine takes."""
        return cls(version, version, [None] * len(full), full, sizes, keep)


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


class HeldBuckets:
    """The buckets an engine's actor last took, with `delta`: what the next push's deltas
    apply to. One taken whole stays a view of its node's copy in the store (one for all
    the node's actors, kept there until the next push replaces it); one built from a delta
    is the actor's own."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.buckets: list[Bucket] = []

    def take(self, push: Push, lay: Callable[[int, Bucket], None]) -> tuple[list[Bucket], int]:
        """`push`'s buckets, built from its deltas where they apply and fetched whole where
        not, each given to `lay` with its index as soon as it is here (from another thread
        for one fetched); and the bytes fetched for them. Whole buckets are fetched
        `FETCHERS` at a time, so that one is laid while the next still travel."""
        based = self.version == push.base and len(self.buckets) == len(push.full)
        wanted = [i for i, ref in enumerate(push.deltas) if based and ref is not None]
        deltas: list[Delta] = ray.get([push.deltas[i] for i in wanted])
        moved = sum(delta.nbytes for delta in deltas)
        built: dict[int, Bucket] = {}
        for i, delta in zip(wanted, deltas, strict=True):
            bucket = apply(self.buckets[i], self.version, delta)
            if bucket is not None:
                built[i] = bucket
        whole = [i for i in range(len(push.full)) if i not in built]

        def fetch(index: int) -> Bucket:
            bucket = ray.get(push.full[index])
            lay(index, bucket)
            return bucket

        with ThreadPoolExecutor(min(max(len(whole), 1), FETCHERS)) as pool:
            fetching = [pool.submit(fetch, i) for i in whole]
            for i, bucket in built.items():
                lay(i, bucket)
            for i, future in zip(whole, fetching, strict=True):
                built[i] = future.result()
                moved += built[i].data.nbytes
        buckets = [built[i] for i in range(len(push.full))]
        self.buckets, self.version = (buckets, push.version) if push.keep else ([], None)
        return buckets, moved


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
