"""A two-turn test environment whose rollouts after the run's first step, with `hold`,
wait in their second turn until cancelled: a run stopped then is surely gathering
rollouts, without timing. The reward is the replies' length, so groups vary."""

import asyncio

from reinforge.envs import Continue, Environment, Episode, Finished, Harness, Reward, Rubric
from reinforge.types import Task


def length(episode: Episode) -> float:
    replies = [m.get("content") or "" for m in episode.messages if m["role"] == "assistant"]
    return sum(len(reply) for reply in replies) / 100


class Held(Environment):
    name = "held"

    def __init__(self, hold: bool) -> None:
        super().__init__(Harness(max_turns=2, max_tokens_per_turn=8), Rubric(Reward(length)))
        self.hold = hold
        self.first_seed: int | None = None

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
        if self.hold and not episode.task.id.startswith(f"held-{self.first_seed}-"):
            await asyncio.Event().wait()
        return Continue([{"role": "user", "content": "Again."}])


def load_environment(hold: bool = True) -> Environment:
    return Held(hold)
