"""Single-turn integer arithmetic: the smallest environment that a tiny model can learn.

Level 1 is the task the TRL baseline uses (two numbers in 0..99, + or -, "What is A + B?
Answer with just the number."), so runs compare side by side; higher levels add
multiplication, three-digit numbers and three operands with precedence.
"""

from __future__ import annotations

import random
import re

from pydantic import Field

from reinforge.envs.environment import Environment, Harness
from reinforge.envs.episode import Episode
from reinforge.envs.parsers import last_integer, strip_think
from reinforge.envs.rubric import Reward, Rubric
from reinforge.types import Section, Task

_JUST_A_NUMBER = re.compile(r"-?\d[\d,]*\.?")


def correct(episode: Episode) -> float:
    """1 iff the last integer written is the answer: forgiving of prose around it."""
    return float(last_integer(strip_think(episode.completion)) == episode.task.answer)


def format_reward(episode: Episode) -> float:
    """1 iff the reply is the number alone, which is what the prompt asks for."""
    return float(_JUST_A_NUMBER.fullmatch(strip_think(episode.completion)) is not None)


def expression(rng: random.Random, difficulty: int) -> tuple[str, int]:
    """A random expression for the level and its value."""
    if difficulty == 1:
        a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-")
        return f"{a} {op} {b}", _apply(a, op, b)
    if difficulty == 4:
        a, b, c = (rng.randint(2, 99) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        if op2 == "*" and op1 != "*":  # precedence: b * c binds first
            value = _apply(a, op1, _apply(b, op2, c))
        else:
            value = _apply(_apply(a, op1, b), op2, c)
        return f"{a} {op1} {b} {op2} {c}", value
    op = rng.choice("+-*")
    if op == "*":
        low, high = (2, 9) if difficulty == 2 else (10, 99)
        a, b = rng.randint(10, 99), rng.randint(low, high)
    else:
        top = 99 if difficulty == 2 else 999
        a, b = rng.randint(10, top), rng.randint(10, top)
    return f"{a} {op} {b}", _apply(a, op, b)


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


class Arithmetic(Environment):
    name = "arithmetic"

    def __init__(self, difficulty: int, harness: Harness, rubric: Rubric) -> None:
        super().__init__(harness, rubric)
        self.difficulty = difficulty

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            text, value = expression(rng, self.difficulty)
            prompt = f"What is {text}? Answer with just the number."
            tasks.append(
                Task(
                    id=f"arithmetic-{seed}-{i}",
                    prompt=[{"role": "user", "content": prompt}],
                    answer=value,
                    info={"difficulty": self.difficulty, "expression": text},
                )
            )
        return tasks


class Args(Section):
    difficulty: int = Field(1, ge=1, le=4)
    """1: two numbers in 0..99, + or -; 2 adds multiplication by 2..9; 3 three-digit numbers
    and multiplication by 10..99; 4 three operands with precedence."""
    system_prompt: str | None = None
    """None leaves the chat template's own default system prompt."""
    format_weight: float = 0.1
    """Weight of the `format` term: 1 when the reply is the number alone."""


def load_environment(args: Args) -> Arithmetic:
    harness = Harness(system_prompt=args.system_prompt, max_turns=1, max_tokens_per_turn=48)
    rubric = Rubric(
        Reward(correct, 1.0),
        Reward(format_reward, args.format_weight, name="format"),
        pass_threshold=1.0,
    )
    return Arithmetic(args.difficulty, harness, rubric)
