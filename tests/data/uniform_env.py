"""A test environment with groups that vary and groups that cannot: each step's first
`varying` tasks score a checksum of the reply (two different replies of the random model
score differently), the rest score 0.5 whatever the reply (every such group is uniform).
Task ids say which: `vary-...` or `same-...`."""

import zlib

from reinforge.envs import Environment, Episode, Harness, Reward, Rubric
from reinforge.types import Task


def checksum_or_half(episode: Episode) -> float:
    if episode.task.id.startswith("same-"):
        return 0.5
    return zlib.crc32(episode.completion.encode()) / 2**32


class Uniform(Environment):
    name = "uniform"

    def __init__(self, varying: int) -> None:
        super().__init__(Harness(max_tokens_per_turn=8), Rubric(Reward(checksum_or_half)))
        self.varying = varying

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        return [
            Task(
                id=f"{'vary' if i < self.varying else 'same'}-{seed}-{i}",
                prompt=[{"role": "user", "content": f"Say {i}."}],
            )
            for i in range(n)
        ]


def load_environment(varying: int = 1) -> Environment:
    return Uniform(varying)
