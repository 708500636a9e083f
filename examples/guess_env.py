"""A multi-turn environment with a tool: find a secret number. Run it with

reinforge eval examples/guess_env.py --model smollm2-135m --tasks 8 --rollouts 2

The model may call `compare` as often as it likes to learn whether the secret is higher or
lower than a number, and answers with <answer>N</answer>. A wrong answer is told so and
uses up one of its tries; the episode ends at the right answer or after the last try.
"""

import random
from typing import Any

from pydantic import Field

from reinforge.envs import (
    Continue,
    Environment,
    Episode,
    Finished,
    Harness,
    Reward,
    Rubric,
    Step,
    tool,
)
from reinforge.envs.parsers import extract_tag, last_integer
from reinforge.types import Section, Task

PROMPT = (
    "I am thinking of a whole number from 1 to {high}. Call the compare tool to narrow it "
    "down, then reply with your answer as <answer>N</answer>. You have {tries} tries."
)


@tool
def compare(number: int, episode: Episode) -> str:
    """Compare a number with the secret number.

    Args:
        number: The number to compare with the secret.
    """
    episode.state["compared"].append(number)
    secret = episode.task.answer
    if number < secret:
        return f"The secret number is higher than {number}."
    if number > secret:
        return f"The secret number is lower than {number}."
    return f"{number} is the secret number."


def found(episode: Episode) -> float:
    return float(episode.state["solved"])


def first_try(episode: Episode) -> float:
    answers = episode.state["answers"]
    return float(bool(answers) and answers[0] == episode.task.answer)


class GuessNumber(Environment):
    name = "guess-number"

    def __init__(self, high: int, tries: int, harness: Harness, rubric: Rubric) -> None:
        super().__init__(harness, rubric)
        self.high = high
        self.tries = tries

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        prompt = PROMPT.format(high=self.high, tries=self.tries)
        return [
            Task(
                id=f"guess-{seed}-{i}",
                prompt=[{"role": "user", "content": prompt}],
                answer=rng.randint(1, self.high),
            )
            for i in range(n)
        ]

    def setup(self, task: Task) -> dict[str, Any]:
        return {"compared": [], "answers": [], "solved": False}

    async def respond(self, episode: Episode) -> Step:
        """Answer a reply that made no tool call."""
        state = episode.state
        answer = extract_tag(episode.completion, "answer")
        number = last_integer(answer) if answer is not None else None
        if number is None:
            return Continue([{"role": "user", "content": "Answer as <answer>N</answer>."}])
        state["answers"].append(number)
        state["solved"] = number == episode.task.answer
        left = self.tries - len(state["answers"])
        if state["solved"] or left == 0:
            return Finished()
        return Continue([{"role": "user", "content": f"{number} is wrong. Tries left: {left}."}])


class Args(Section):
    high: int = Field(100, ge=2)
    """The secret is a whole number from 1 to high."""
    tries: int = Field(3, ge=1)
    """Answers the model may give."""


def load_environment(args: Args) -> GuessNumber:
    return GuessNumber(
        args.high,
        args.tries,
        harness=Harness(tools=[compare], max_turns=12, max_tokens_per_turn=64),
        rubric=Rubric(Reward(found), Reward(first_try, weight=0.2)),
    )
