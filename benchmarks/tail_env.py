"""A long-tailed agentic workload for `benchmarks/async.py`: cheap to sample, slow to grade.

Agent rollouts graded by a test suite in a sandbox cost little CPU to score but take wall
time with a long tail (most suites finish in a second, a few take tens of seconds). Here
the grader sleeps a lognormal duration (`grade_median_s`, `grade_sigma`, capped at
`grade_cap_s`): waiting, not computing, which is what an asynchronous loop can hide. The
completions have a tail too: each task asks for a list whose length is drawn from a Pareto
law, so most answers are a few tokens and some run into the `max_tokens` cap.

The delay of the k-th graded rollout of a task is drawn from an RNG seeded by the task id
and k alone, so every loop mode, whatever it samples, waits the same durations for the
same slot of the data order (tasks follow from the run seed). The reward, how close the
number of lines is to the number asked for, is exact given the text and varies between
samples, so groups carry signal.
"""

import asyncio
import math
import random
from collections import Counter

from reinforge.envs import Environment, Episode, Harness, Reward, Rubric
from reinforge.types import Task

THINGS = ["animals", "fruits", "colours", "countries", "tools", "vegetables", "sports"]


def list_score(episode: Episode) -> float:
    """1 for exactly the number of non-empty lines asked for, falling linearly to 0 at
    twice (or none) of them."""
    wanted = episode.task.answer
    lines = sum(1 for line in episode.completion.splitlines() if line.strip())
    return max(0.0, 1.0 - abs(lines - wanted) / wanted)


class Tail(Environment):
    name = "tail"

    def __init__(self, harness: Harness, rubric: Rubric, alpha: float, max_items: int) -> None:
        super().__init__(harness, rubric)
        self.alpha = alpha
        self.max_items = max_items

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            items = min(int(rng.paretovariate(self.alpha)), self.max_items)
            things = rng.choice(THINGS)
            prompt = f"List {items} {things}, one per line, with no other text."
            tasks.append(
                Task(
                    id=f"tail-{seed}-{i}",
                    prompt=[{"role": "user", "content": prompt}],
                    answer=items,
                )
            )
        return tasks


def load_environment(
    grade_median_s: float = 1.0,
    grade_sigma: float = 1.0,
    grade_cap_s: float = 20.0,
    alpha: float = 1.0,
    max_items: int = 32,
    max_tokens: int = 64,
) -> Environment:
    graded: Counter[str] = Counter()  # rollouts graded so far, per task id

    async def tests(episode: Episode) -> float:
        """The test suite: a seeded lognormal wait, then the list's score."""
        task_id = episode.task.id
        rng = random.Random(f"{task_id}/{graded[task_id]}")
        graded[task_id] += 1
        delay = math.exp(rng.gauss(math.log(grade_median_s), grade_sigma))
        await asyncio.sleep(min(delay, grade_cap_s))
        return list_score(episode)

    return Tail(Harness(max_tokens_per_turn=max_tokens), Rubric(Reward(tests)), alpha, max_items)
