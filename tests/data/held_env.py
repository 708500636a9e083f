"""A two-turn test environment whose rollouts after the run's first step (from the first,
with `hold_first`), with `hold`, wait in their second turn until cancelled: a run stopped
then is surely gathering rollouts, without timing. The first to wait says `holding` on
stderr. The reward is the replies' length, so groups vary."""

import asyncio
import sys

from reinforge.envs import Continue, Environment, Episode, Finished, Harness, Reward, Rubric
from reinforge.types import Task


def length(episode: Episode) -> float:
    replies = [m.get("content") or "" for m in episode.messages if m["role"] == "assistant"]
    return sum(len(reply) for reply in replies) / 100


class Held(Environment):
    name = "held"

    def __init__(self, hold: bool, hold_first: bool) -> None:
        super().__init__(Harness(max_turns=2, max_tokens_per_turn=8), Rubric(Reward(length)))
        self.hold = hold
        self.hold_first = hold_first
        self.first_seed: int | None = None
        self.said = False

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        if self.first_seed is None:
            self.first_seed = seed
        return [
            Task(id=f"held-{seed}-{i}", prompt=[{"role": "user", "content": f"Say {i}."}])
            for i in range(n)
        ]

    async def respond(self, episode: Episode) -> Continue | Finished:
        if episode.turns > 1:
            return Finished()
        first_step = episode.task.id.startswith(f"held-{self.first_seed}-")
        if self.hold and (self.hold_first or not first_step):
            if not self.said:
                print("holding", file=sys.stderr, flush=True)
                self.said = True
            await asyncio.Event().wait()
        return Continue([{"role": "user", "content": "Again."}])


def load_environment(hold: bool = True, hold_first: bool = False) -> Environment:
    return Held(hold, hold_first)
