"""A test environment whose grader is broken on the first `broken` tasks of each step: it
raises `KeyError: 'answer'` (`bad="raise"`) or returns the value `bad` names. The other
tasks score the reply's length, so their groups vary and train. Task ids say which:
`bad-...` or `ok-...`."""

from reinforge.envs import Environment, Episode, Harness, Reward, Rubric
from reinforge.types import Task

VALUES = {"nan": float("nan"), "inf": float("inf"), "1e39": 1e39, "string": "1", "none": None}


class BrokenReward(Environment):
    name = "broken-reward"

    def __init__(self, bad: str, broken: int) -> None:
        def grade(episode: Episode) -> object:
            if episode.task.id.startswith("ok-"):
                return len(episode.completion) / 100
            if bad == "raise":
                return episode.state["answer"]
            return VALUES[bad]

        super().__init__(Harness(max_tokens_per_turn=8), Rubric(Reward(grade)))
        self.broken = broken

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        return [
            Task(
                id=f"{'bad' if i < self.broken else 'ok'}-{seed}-{i}",
                prompt=[{"role": "user", "content": f"Say {i}."}],
            )
            for i in range(n)
        ]


def load_environment(bad: str = "raise", broken: int = 2) -> Environment:
    return BrokenReward(bad, broken)
