"""The weights as a broadcast over a process group (`engines.weight_sync = "broadcast"`):
the run's process is rank 0 of a gloo group with every engine up, and each push sends
the weights over it once, in buckets of the engines' dtype, while each engine copies the
last bucket in as the next arrives (`policy/weight_group.py`). No file is written and no
tensor crosses HTTP, which carries the control alone: which group to join, and each
push's manifest and version.

The group is the sync's own: a store the run's process listens on and a group made from
it (`ProcessGroupGloo`), never torch's default group, which a sharded trainer's ranks hold.
Its timeout (`engines.weight_sync.timeout_s`) bounds the forming of the group and each push
over it, so an engine that dies mid-push costs at most that long. The push reports it gone
(its supervisor restarts it), the group is formed again from the engines still up at the
next push, and the restarted engine catches up on the last push by a file, as `FilePush`
hands weights over.

The run's own machine's engines take control from loopback only, and connect to the store
and the group over loopback: no other machine can join the group. A Ray run's engines may
be on other machines (`ray_weights.RayBroadcastPush`): the store listens on the driver's
node address, each engine's end of the group is on its own node's address, and the
control goes through each engine's actor, which posts it on the engine's node.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import Future
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from reinforge.errors import UsageError
from reinforge.orchestrate.engine_host import EngineGone
from reinforge.orchestrate.weight_sync import EngineLinks, Relay, check_versions, packed_weights
from reinforge.policy.weight_buckets import Bucket, MemoryFile, manifest, total_bytes
from reinforge.policy.weight_group import new_group
from reinforge.train.trainer import PolicyTrainer

T = TypeVar("T")
HOST = "127.0.0.1"
"""Where the store listens and the group connects for engines of the run's machine."""


class BroadcastPush(EngineLinks):
    """Weights broadcast to the run's own engines over a group of this process and them.
    The last push's buckets are kept, for a restarted engine."""

    def __init__(
        self,
        urls: list[str],
        token: str | None,
        dtype: torch.dtype,
        timeout_s: float,
        host: str = HOST,
        relay: Relay | None = None,
    ) -> None:
        super().__init__(urls, token, supervised=True, relay=relay)
        self._dtype = dtype
        self._timeout_s = timeout_s
        self._host = host
        self._listener = socket.create_server((host, 0))
        """The store's socket: on loopback for the run's machine's engines, so no other
        machine may join the group and send them weights, as none may post them
        (`/v1/weights`); on the driver's node address for a Ray run's."""
        self._store = dist.TCPStore(
            host,
            self._listener.getsockname()[1],
            None,
            True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=self._listener.fileno(),
        )
        self._group: dist.ProcessGroupGloo | None = None
        self._name = ""
        self._members: list[int] = []
        """The engines in the group, rank 1 on."""
        self._formed = 0
        self._last: list[Bucket] = []

    def _deliver(self, trainer: PolicyTrainer, version: int) -> tuple[int, int, float]:
        started = time.perf_counter()
        self._last = packed_weights(trainer, self._dtype)
        pack_s = time.perf_counter() - started
        if self._members != self.up():
            self._form()
        if not self._members:
            return 0, 0, pack_s
        body = {"group": self._name, "version": version, "buckets": manifest(self._last)}
        members = self._members
        answers = [self._pool.submit(self._take, index, body) for index in members]
        try:
            assert self._group is not None
            for bucket in self._last:
                data = torch.from_numpy(bucket.data)
                self._group.broadcast([data], dist.BroadcastOptions()).wait()
        except RuntimeError:  # an engine died or went silent: the others' receives end now
            self._disband()
        served = [self._within(answer) for answer in answers]
        for index, answer in zip(members, served, strict=True):
            if answer is None:
                self._joined[index] = False  # its supervisor restarts it, or gives it the push
        took = [v for v in served if v is not None]
        if len(took) < len(members):
            self._disband()  # formed again, from the engines up, at the next push
        check_versions(took, version)
        return total_bytes(self._last) * len(took), len(took), pack_s

    def _take(self, index: int, body: dict[str, object]) -> int | None:
        """Engine `index`'s version once it has taken the broadcast; None: it could not."""
        route, what = "/weights/broadcast", "take the weights"
        try:
            answer = self.post(index, route, body, what)
        except UsageError:  # gone, or its group failed
            return None
        return answer["policy_version"]

    def _within(self, answer: Future[T]) -> T | None:
        """`answer`, or None from an engine still silent the group's timeout after the
        broadcast ended: it hangs, and its supervisor finds it so."""
        try:
            return answer.result(timeout=self._timeout_s)
        except TimeoutError:
            return None

    def _form(self) -> None:
        """A new group of this process and the engines up; an engine gone leaves the
        pushes, and the group forms from the others."""
        self._disband()
        members = self.up()
        while members:
            self._formed += 1
            name = f"weights-{self._formed}"
            size = len(members) + 1
            joins = [
                self._pool.submit(self._join, index, name, rank, size)
                for rank, index in enumerate(members, start=1)
            ]
            try:
                group = new_group(self._store, name, self._host, 0, size, self._timeout_s)
            except RuntimeError:
                group = None
            gone = [i for i, join in zip(members, joins, strict=True) if not self._within(join)]
            if group is not None and not gone:
                self._group, self._name, self._members = group, name, members
                return
            if not gone:  # every engine answered, yet the group did not form
                raise UsageError(
                    f"the engines' weights group did not form within {self._timeout_s:g} s "
                    "(engines.weight_sync.timeout_s)"
                )
            for index in gone:
                self._joined[index] = False
            members = self.up()

    def _join(self, index: int, name: str, rank: int, size: int) -> bool:
        """Whether engine `index` answered, joined or not (a group fails for any engine's
        sake); False: it is gone."""
        body = {"host": self._host, "port": self._store.port, "group": name, "rank": rank,
                "size": size, "timeout_s": self._timeout_s}  # fmt: skip
        try:
            self.post(index, "/weights/group", body, "join the weights group")
        except EngineGone:
            return False
        except UsageError:
            pass
        return True

    def _disband(self) -> None:
        """Drop the group: members still waiting on it fail at once."""
        group, self._group, self._members = self._group, None, []
        if group is not None:
            group.shutdown()

    def _give_last(self, index: int) -> None:
        """As the buckets in a memory file with their manifest, as an object store's actor
        hands them over: the group forms again, with this engine, at the next push."""
        memory = MemoryFile()
        body = {"path": memory.path, "buckets": manifest(self._last), "version": self.version}
        try:
            with memory.holding([bucket.data.nbytes for bucket in self._last]) as lay:
                for i, bucket in enumerate(self._last):
                    lay(i, bucket)
                self.post(index, "/weights", body, "take the weights")
        finally:
            memory.close()

    def close(self) -> None:
        self._disband()
        super().close()
        self._listener.close()
