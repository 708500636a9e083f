"""A complete user environment: reverse a word. Run it with

reinforge eval examples/reverse_env.py --model smollm2-135m --tasks 8 --rollouts 2
"""

import random

from reinforge.envs import Environment, Episode, Harness, Reward, Rubric
from reinforge.envs.parsers import extract_tag
from reinforge.types import Task

WORDS = ["planet", "garden", "silver", "rocket", "forest", "bridge", "candle", "window"]


def reversed_correctly(episode: Episode) -> float:
    answer = extract_tag(episode.completion, "answer") or episode.completion.strip()
    return float(answer == episode.task.answer)


def used_answer_tags(episode: Episode) -> float:
    return float(extract_tag(episode.completion, "answer") is not None)


class Reverse(Environment):
    name = "reverse"

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        words = [rng.choice(WORDS) for _ in range(n)]
        return [
            Task(
                id=f"reverse-{seed}-{i}",
                prompt=[
                    {
                        "role": "user",
                        "content": f"Reverse the word '{w}'. Reply as <answer>...</answer>.",
                    }
                ],
                answer=w[::-1],
            )
            for i, w in enumerate(words)
        ]


def load_environment() -> Environment:
    return Reverse(
        harness=Harness(max_tokens_per_turn=32),
        rubric=Rubric(Reward(reversed_correctly), Reward(used_answer_tags, weight=0.1)),
    )
