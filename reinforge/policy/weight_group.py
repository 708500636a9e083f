"""The engine's end of a broadcast weight sync (`engines.weight_sync = "broadcast"`): a gloo
process group of the trainer's process (rank 0) and the run's engines, private to the
sync (its own store and group, never torch's default one, which a sharded trainer's ranks
hold), over which the trainer broadcasts its weights in buckets (`weight_buckets.py`).

The trainer says over HTTP which group to join and, for each push, the buckets' manifest
and version; the bytes travel over the group alone. Buckets arrive in one of two staging
buffers while the last one is copied into the model from the other, all between two
decode steps (the engine's weights lock, held across the push, as a file's load holds it):
no decode step sees some buckets new and others old.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from reinforge.policy.backends import SamplingEngine
from reinforge.policy.weight_buckets import Entry, size_of, views


class BroadcastAborted(RuntimeError):
    """The group failed before any bucket was copied: the engine's weights are whole."""


def new_group(
    store: dist.Store, name: str, host: str, rank: int, size: int, timeout_s: float
) -> dist.ProcessGroupGloo:
    """Rank `rank` of the `size` of group `name` (under that prefix of `store`), its
    connections from `host`; returns once every rank has joined, or raises past
    `timeout_s`, which also bounds each of its broadcasts."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, options)


def client_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The trainer's rendezvous store, reached at `host`:`port`."""
    return dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s))


class WeightGroup:
    """An engine's membership of the trainer's weights group: at most one at a time (the
    trainer forms a new one whenever the engines up change)."""

    def __init__(self, engine: SamplingEngine) -> None:
        self.engine = engine
        self.name: str | None = None
        self._group: dist.ProcessGroupGloo | None = None

    def join(
        self, store_at: tuple[str, int], own: str, name: str, rank: int, size: int, timeout_s: float
    ) -> None:
        """Leave the last group and join `name`, whose store is at `store_at` (host, port),
        with this engine's end on its own address `own`, where the other ranks reach it
        (the trainer's node's address would not be its own on another machine); returns
        once all its ranks have."""
        self.name, self._group = None, None
        store = client_store(*store_at, timeout_s)
        self._group = new_group(store, name, own, rank, size, timeout_s)
        self.name = name

    def receive(self, name: str, buckets: list[tuple[Entry, ...]], version: int) -> int:
        """The trainer's broadcast of `buckets` over group `name`, copied in as `version`;
        returns the version served. `BroadcastAborted` should the group fail (a member died
        or went silent) before any bucket was copied. Past that the engine holds two
        versions' weights: it exits while decoding is still held, so that no token comes
        from them, and its supervisor restarts it with the last push's weights."""
        group = self._group
        if group is None or name != self.name:
            raise BroadcastAborted(f"this engine is not in weights group {name}")
        sizes = [size_of(entries) for entries in buckets]
        staging = [torch.empty(max(sizes), dtype=torch.uint8) for _ in range(min(len(sizes), 2))]
        with self.engine.paused():
            copied = 0
            try:
                arriving = _broadcast(group, staging[0][: sizes[0]])
                for k, entries in enumerate(buckets):
                    arriving.wait()
                    if k + 1 < len(buckets):  # the next bucket lands while this one is copied
                        arriving = _broadcast(group, staging[(k + 1) % 2][: sizes[k + 1]])
                    self.engine.update_weights(views(entries, staging[k % 2][: sizes[k]]), version)
                    copied += 1
            except (RuntimeError, KeyError, ValueError) as error:  # gloo's, or a misfit
                self.name, self._group = None, None
                if copied:
                    print(
                        f"reinforge serve: weights group {name} failed after {copied} of "
                        f"{len(buckets)} buckets ({error}); exiting rather than sampling "
                        "from two versions' weights",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(1)
                raise BroadcastAborted(f"weights group {name} failed: {error}") from error
            return self.engine.version


def _broadcast(group: dist.ProcessGroupGloo, buffer: torch.Tensor) -> dist.Work:
    return group.broadcast([buffer], dist.BroadcastOptions())
