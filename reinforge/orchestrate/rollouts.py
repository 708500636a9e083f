"""The rollout side of the loop: groups generated continuously and handed to the trainer
through a queue, with no more in flight than the staleness bound allows.

Every group has a slot in the data order (the step whose tasks it comes from, and its
task's index there); tasks and sampling seeds follow from the slot alone, so a resumed run
regenerates exactly the groups that were in flight when it stopped.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass
from typing import Any

from reinforge.envs.environment import Environment
from reinforge.envs.registry import draw_tasks
from reinforge.policy.client import EpisodeSource
from reinforge.rollout.config import TrainRolloutConfig
from reinforge.rollout.generator import generate_group
from reinforge.types import Group, Task


@dataclass(frozen=True, order=True)
class Slot:
    batch: int
    """The step whose tasks the group comes from (in sync mode, the step that trains it,
    unless `loop.uniform_redraws` drew it in place of a set-aside group: then an earlier
    one)."""
    index: int
    """The task's index among that step's tasks."""


@dataclass
class Finished:
    slot: Slot
    group: Group

    @property
    def oldest_version(self) -> int | None:
        """The policy version of the group's oldest sampled token (None: no tokens)."""
        versions = [min(t.policy_versions) for t in self.group.trajectories if t.policy_versions]
        return min(versions, default=None)


class RolloutSide:
    """Starts groups while fewer than `capacity` are outstanding (started, and neither
    dropped nor trained and synced: the loop says so with `release`). With capacity one
    step of groups this is the synchronous loop; with (s + 1) steps the rollout side runs
    up to s steps ahead of the trainer."""

    def __init__(
        self,
        env: Environment,
        client: EpisodeSource,
        config: TrainRolloutConfig,
        run_seed: int,
        capacity: int,
        position: dict[str, Any],
    ) -> None:
        self.env = env
        self.client = client
        self.config = config
        self.run_seed = run_seed
        self.capacity = capacity
        self._next = Slot(*position["next"])
        self._pending = sorted(Slot(*slot) for slot in position["pending"])
        self._unconsumed: set[Slot] = set()
        self._outstanding = 0
        self._room = asyncio.Condition()
        self._queue: asyncio.Queue[Finished | BaseException] = asyncio.Queue()
        self._limit = asyncio.Semaphore(config.concurrency)
        self._tasks: dict[int, list[Task]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0

    @staticmethod
    def start_position(step: int) -> dict[str, Any]:
        """Where a run that has trained `step` steps and has nothing in flight goes on."""
        return {"next": [step, 0], "pending": []}

    def position(self) -> dict[str, Any]:
        """What a checkpoint keeps: the next new slot, and the slots started but not yet
        taken by the trainer, which a resumed run generates again."""
        pending = sorted(self._unconsumed | set(self._pending))
        return {
            "next": [self._next.batch, self._next.index],
            "pending": [[s.batch, s.index] for s in pending],
        }

    async def run(self) -> None:
        """Start groups for as long as the loop runs; failures reach `next_group`."""
        try:
            while True:
                async with self._room:
                    await self._room.wait_for(lambda: self._outstanding < self.capacity)
                    self._outstanding += 1
                slot = self._take_slot()
                self._unconsumed.add(slot)
                self._busy()
                running = asyncio.create_task(self._generate(slot, self._task(slot)))
                self._running.add(running)
                running.add_done_callback(self._running.discard)
        except Exception as error:
            self._queue.put_nowait(error)

    async def next_group(self) -> Finished:
        """The next group to finish, in finishing order."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        self._unconsumed.discard(item.slot)
        return item

    async def release(self, groups: int) -> None:
        """`groups` outstanding groups are done with (dropped, or trained and synced)."""
        async with self._room:
            self._outstanding -= groups
            self._room.notify_all()

    def take_idle_s(self) -> float:
        """Seconds with no group in flight since the last call."""
        now = time.perf_counter()
        if self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = now
        idle, self._idle_s = self._idle_s, 0.0
        return idle

    async def aclose(self) -> None:
        for running in list(self._running):
            running.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)

    def _take_slot(self) -> Slot:
        if self._pending:
            return self._pending.pop(0)
        slot = self._next
        last = slot.index + 1 == self.config.tasks_per_step
        self._next = Slot(slot.batch + 1, 0) if last else Slot(slot.batch, slot.index + 1)
        return slot

    def _task(self, slot: Slot) -> Task:
        if slot.batch not in self._tasks:
            seed = task_seed(self.run_seed, slot.batch)
            self._tasks[slot.batch] = draw_tasks(self.env, self.config.tasks_per_step, seed)
        for batch in [b for b in self._tasks if b < min(self._next.batch, slot.batch)]:
            del self._tasks[batch]  # no slot of it is left to start
        return self._tasks[slot.batch][slot.index]

    async def _generate(self, slot: Slot, task: Task) -> None:
        try:
            group = await generate_group(
                self.env,
                task,
                self.client,
                self.config,
                self.config.rollouts_per_task,
                task_seed(self.run_seed, slot.batch),
                self._limit,
            )
            self._queue.put_nowait(Finished(slot, group))
        except Exception as error:  # rollout failures are data; this is a broken env
            self._queue.put_nowait(error)
        finally:
            if not self._running - {asyncio.current_task()}:
                self._idle_since = time.perf_counter()

    def _busy(self) -> None:
        if self._idle_since is not None:
            self._idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None


def task_seed(seed: int, step: int) -> int:
    """The data order: the same run seed gives the same tasks at the same step."""
    return zlib.crc32(f"{seed}/{step}".encode())
