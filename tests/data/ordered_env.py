"""A test environment whose groups reach the trainer one at a time, in an order fixed by
the run's structure, never by how fast anything ran: a run the simulator can be held to
exactly (tests/test_sim_vs_loop.py).

It takes one task a step (`rollout.tasks_per_step=1`), so that each call of `tasks` is the
loop starting one group, the moment it gives a slot back. Episodes have one turn. A
group's rewards are 0, 1, ... over its rollouts (it varies), or 0.5 each for the slots
`uniform` names (it cannot). Its grading (a group reward) waits until

1. no group is sampling: then nothing samples while a finished group is on its way to the
   trainer, so nothing samples while the trainer trains, and each group's tokens come from
   one policy version whatever the timing;
2. the trainer has taken the group that finished before it: the loop has started a group
   since (with one task a step it starts one for every group it takes, in the place of one
   dropped or set aside, or after the step that trained it);
3. it is due: a group that finished sampling once the trainer had done m steps is due
   then, unless `holds` holds it (slot i for `holds[i]` more steps): then once the trainer
   has done m + holds[i] (`steps_done`, which the test's `on_step` counts in this module,
   `sys.modules["reinforge_user_env_ordered_env"]`);
4. it is the first of the due groups to have been ready: a group is ready when it is due,
   a held one half a step earlier (at m + holds[i] - 1/2: as if it had finished during
   that step's training); ties go to the earlier slot. Those are the times a simulated
   group is given, so that the simulator's groups arrive in this order too.
"""

import asyncio
from dataclasses import dataclass

from reinforge.envs import Environment, Episode, GroupReward, Harness, Rubric
from reinforge.types import Task

steps_done = 0
POLL_S = 0.002


@dataclass
class _Group:
    slot: int
    hold: int
    sampled_at: int | None = None
    """Steps the trainer had done when the group finished sampling; None while it samples."""
    finished: bool = False

    def due(self) -> bool:
        return self.sampled_at is not None and steps_done >= self.sampled_at + self.hold

    def ready_at(self) -> float:
        assert self.sampled_at is not None
        return self.sampled_at + self.hold - (0.5 if self.hold else 0.0)


class Ordered(Environment):
    name = "ordered"

    def __init__(self, holds: list[int], uniform: list[int]) -> None:
        super().__init__(Harness(max_tokens_per_turn=4), Rubric(GroupReward(self.grade)))
        self.holds = holds
        self.uniform = set(uniform)
        self.groups: dict[str, _Group] = {}
        """By task id, in the order the loop started them (their slots)."""
        self.started_when_last_finished: int | None = None

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        if n != 1:
            raise ValueError("the ordered environment takes one task a step")
        slot = len(self.groups)
        task = Task(id=f"ordered-{seed}-0", prompt=[{"role": "user", "content": f"Say {slot}."}])
        hold = self.holds[slot] if slot < len(self.holds) else 0
        self.groups[task.id] = _Group(slot, hold)
        return [task]

    async def grade(self, episodes: list[Episode]) -> list[float]:
        group = self.groups[episodes[0].task.id]
        group.sampled_at = steps_done
        while not self._may_finish(group):
            await asyncio.sleep(POLL_S)
        group.finished = True
        self.started_when_last_finished = len(self.groups)
        if group.slot in self.uniform:
            return [0.5] * len(episodes)
        return [float(i) for i in range(len(episodes))]

    def _may_finish(self, group: _Group) -> bool:
        if any(g.sampled_at is None for g in self.groups.values()):
            return False  # 1. a group is sampling
        last = self.started_when_last_finished
        if last is not None and len(self.groups) == last:
            return False  # 2. the trainer has not yet taken the last group to finish
        due = [g for g in self.groups.values() if not g.finished and g.due()]
        return min(due, key=lambda g: (g.ready_at(), g.slot), default=None) is group  # 3, 4


def load_environment(
    holds: list[int] | None = None, uniform: list[int] | None = None
) -> Environment:
    return Ordered(holds or [], uniform or [])
