"""A test environment whose reward varies even for a random model: the reply's length."""

from reinforge.envs import Environment, Episode, Harness, Reward, Rubric
from reinforge.types import Task


def length(episode: Episode) -> float:
    return len(episode.completion) / 100


class Length(Environment):
    name = "length"

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        return [
            Task(id=f"length-{seed}-{i}", prompt=[{"role": "user", "content": f"Say {i}."}])
            for i in range(n)
        ]


def load_environment() -> Environment:
    return Length(Harness(max_tokens_per_turn=8), Rubric(Reward(length)))
