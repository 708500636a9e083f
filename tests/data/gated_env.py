"""A two-turn test environment whose first task of the run holds its second turn until the
trainer has finished `hold_until_step` steps: a deliberately slow group, without timing.

The test that trains with it counts finished steps in `steps_done` (this module, as the
registry loads it: `sys.modules["reinforge_user_env_gated_env"]`).
"""

import asyncio

from reinforge.envs import Continue, Environment, Episode, Finished, Harness, Reward, Rubric
from reinforge.types import Task

steps_done = 0


def length(episode: Episode) -> float:
    replies = [m.get("content") or "" for m in episode.messages if m["role"] == "assistant"]
    return sum(len(reply) for reply in replies) / 100


class Gated(Environment):
    name = "gated"

    def __init__(self, hold_until_step: int) -> None:
        super().__init__(Harness(max_turns=2, max_tokens_per_turn=8), Rubric(Reward(length)))
        self.hold_until_step = hold_until_step
        self.slow_task: str | None = None

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        tasks = [
            Task(id=f"gated-{seed}-{i}", prompt=[{"role": "user", "content": f"Say {i}."}])
            for i in range(n)
        ]
        if self.slow_task is None:
            self.slow_task = tasks[0].id
        return tasks

    async def respond(self, episode: Episode) -> Continue | Finished:
        if episode.turns > 1:
            return Finished()
        if episode.task.id == self.slow_task:
            while steps_done < self.hold_until_step:
                await asyncio.sleep(0.01)
        return Continue([{"role": "user", "content": "Again."}])


def load_environment(hold_until_step: int = 1) -> Environment:
    return Gated(hold_until_step)
