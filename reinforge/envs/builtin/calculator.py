"""Word problems with a calculator tool: the smallest environment that rewards tool use.

The tool evaluates arithmetic by walking a whitelisted `ast`, never `eval`: the model's
text is untrusted input, and `__import__`, names, attributes and calls are all refused.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from collections.abc import Callable

from reinforge.envs.environment import Environment, Harness
from reinforge.envs.episode import Episode
from reinforge.envs.parsers import extract_tag, strip_think
from reinforge.envs.rubric import Reward, Rubric
from reinforge.envs.tools import Tool
from reinforge.types import Section, Task

MAX_EXPRESSION = 200
MAX_BITS = 4096
"""Bounds that keep a hostile expression (9**9**9, deep nesting) from stalling a worker."""

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

SYSTEM_PROMPT = (
    "Solve the problem. Use the calculate tool for arithmetic, "
    "then give the final answer as <answer>NUMBER</answer>."
)

Problem = Callable[[random.Random], tuple[str, int]]
"""Draws one problem: its text and its (always positive, integer) answer."""


def pencils(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    return f"A shop sells {a} boxes of {b} pencils. How many pencils is that?", a * b


def train(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(40, 300), rng.randint(3, 24)
    return f"A train travels {a} km every hour for {b} hours. How many km is that?", a * b


def wallet(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(200, 999), rng.randint(20, 199), rng.randint(20, 999)
    return (
        f"Tom has {a} dollars. He spends {b} dollars and then earns {c} dollars. "
        "How many dollars does he have now?",
        a - b + c,
    )


def school(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(12, 60), rng.randint(18, 35), rng.randint(5, 99)
    return (
        f"A school has {a} classes of {b} students. {c} students are absent. "
        "How many students are present?",
        a * b - c,
    )


def eggs(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(12, 36), rng.randint(10, 90), rng.randint(3, 30)
    return (
        f"A farm packs {a} eggs into each tray and fills {b} trays a day. "
        f"How many eggs does it pack in {c} days?",
        a * b * c,
    )


def tickets(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(10, 99)
    return (
        f"A ticket costs {a} dollars. How much do {b} tickets cost with {c} dollars off the total?",
        a * b - c,
    )


PROBLEMS: tuple[Problem, ...] = (pencils, train, wallet, school, eggs, tickets)


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; raises ValueError on anything else."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {error.msg}") from None
    return _value(tree.body)


def _value(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) * math.log2(abs(left) + 2) > MAX_BITS:
            raise ValueError("result too large")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("result too large") from None
        return _checked(result)
    raise ValueError(
        f"only numbers, + - * / ** and parentheses are allowed, not {ast.unparse(node)!r}"
    )


def _checked(result: int | float | complex) -> int | float:
    if isinstance(result, complex):  # a negative number to a fractional power
        raise ValueError("the result is not a real number")
    if isinstance(result, int) and result.bit_length() > MAX_BITS:
        raise ValueError("result too large")
    if isinstance(result, float) and not math.isfinite(result):
        raise ValueError("result too large")
    return result


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / ** and parentheses.

    Args:
        expression: the expression, e.g. "17 * 23 + 4"
    """
    result = evaluate(expression)
    if isinstance(result, float) and result.is_integer():
        return str(int(result))
    return str(result if isinstance(result, int) else round(result, 10))


def final_number(text: str) -> float | None:
    """The number inside the last <answer> tag, else the last number in the text."""
    text = strip_think(text)
    tagged = extract_tag(text, "answer")
    found = _NUMBER.findall(tagged if tagged is not None else text)
    return float(found[-1].replace(",", "")) if found else None


def correct(episode: Episode) -> float:
    """1 iff the episode ends in an answer (not a pending tool call) that is right."""
    if not episode.messages or episode.messages[-1].get("role") != "assistant":
        return 0.0
    return float(final_number(episode.completion) == episode.task.answer)


def used_tool(episode: Episode) -> float:
    """1 if some call succeeded: a small nudge toward the tool for a model new to it."""
    return float(episode.tool_calls > episode.tool_errors)


class Calculator(Environment):
    name = "calculator"

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            problem = rng.choice(PROBLEMS)
            text, answer = problem(rng)
            tasks.append(
                Task(
                    id=f"calculator-{seed}-{i}",
                    prompt=[{"role": "user", "content": text}],
                    answer=answer,
                    info={"problem": problem.__name__},
                )
            )
        return tasks


class Args(Section):
    tool_weight: float = 0.1
    """Weight of the `used_tool` term: 1 when some call to the calculator succeeded."""
    system_prompt: str | None = SYSTEM_PROMPT
    """None leaves the chat template's own default system prompt."""


def load_environment(args: Args) -> Calculator:
    harness = Harness(
        system_prompt=args.system_prompt,
        tools=[Tool(calculate)],
        max_turns=4,
        max_tokens_per_turn=128,
    )
    rubric = Rubric(Reward(correct, 1.0), Reward(used_tool, args.tool_weight), pass_threshold=1.0)
    return Calculator(harness, rubric)
