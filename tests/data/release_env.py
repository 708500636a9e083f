"""The length environment, whose episodes after the run's first `free_steps` steps wait to
start until a file exists (`release`): what lets a test act between two steps without
timing."""

import asyncio
from pathlib import Path

from reinforge.envs import Environment, Episode, Harness, Reward, Rubric
from reinforge.types import Task


def length(episode: Episode) -> float:
    return len(episode.completion) / 100


class Released(Environment):
    name = "released"

    def __init__(self, release: str, free_steps: int) -> None:
        super().__init__(Harness(max_tokens_per_turn=8), Rubric(Reward(length)))
        self.release = Path(release)
        self.free_steps = free_steps
        self.seeds: list[int] = []
        """Each step's task seed, in the order the run drew them."""

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        if seed not in self.seeds:
            self.seeds.append(seed)
        return [
            Task(id=f"released-{seed}-{i}", prompt=[{"role": "user", "content": f"Say {i}."}],
                 info={"seed": seed})
            for i in range(n)
        ]  # fmt: skip

    async def start(self, episode: Episode) -> None:
        if self.seeds.index(episode.task.info["seed"]) >= self.free_steps:
            while not self.release.exists():
                await asyncio.sleep(0.05)


def load_environment(release: str, free_steps: int = 2) -> Environment:
    return Released(release, free_steps)
