"""The kinds of one-line Python fix: a wrong operator, a typo in a message, a print that
should be a return, a body to write (given as an expression, or said in words). Each is
graded by what the function returns."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reinforge.envs.builtin.coding.generated.task_dir import (
    Spec,
    solve_script,
    wording,
    workdir_path,
)

MODULES = "helpers ops maths util tools core compute shapes scores".split()


def _module(rng: random.Random, modules: list[str] = MODULES) -> tuple[str, str]:
    module = rng.choice(modules)
    return module, f"{module}.py"


def _ints(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(-9, 20) for _ in range(n)]


OPERATORS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def fix_operator(rng: random.Random) -> Spec:
    module, name = _module(rng)
    fn = rng.choice("combine merge mix apply blend join pair fold".split())
    right, wrong = rng.sample(list(OPERATORS), 2)
    x, y = rng.randint(2, 9), rng.randint(2, 9)
    wordings = [
        "The function `{f}(a, b)` in `{p}` should return `a {r} b`, but it uses the wrong "
        "operator: `{f}({x}, {y})` returns `{w}` instead of `{e}`. Fix it.",
        "`{f}(a, b)` in `{p}` returns `a {o} b` where it should return `a {r} b`. Fix the "
        "operator and keep the function's name and arguments.",
    ]
    instruction = wording(
        rng,
        wordings,
        f=fn,
        p=workdir_path(name),
        r=right,
        o=wrong,
        x=str(x),
        y=str(y),
        w=str(OPERATORS[wrong](x, y)),
        e=str(OPERATORS[right](x, y)),
    )
    pairs = [(x, y), *zip(_ints(rng, 3), _ints(rng, 3), strict=True)]
    pattern = wrong.replace("*", "\\*")  # sed's regex: a literal star
    return Spec(
        "fix-operator",
        instruction,
        {name: [f"def {fn}(a, b):", f"    return a {wrong} b"]},
        solve_script(f"sed -i 's/return a {pattern} b/return a {right} b/' {name}"),
        {},
        calls={f"{module}.{fn}({a}, {b})": OPERATORS[right](a, b) for a, b in pairs},
    )


GREETINGS = "Hello Goodbye Thanks Congratulations Cheers Greetings Farewell".split()


def fix_typo(rng: random.Random) -> Spec:
    module, name = _module(rng, "texts words replies phrases".split())
    fn = rng.choice("greet farewell message salute hail".split())
    word = rng.choice(GREETINGS)
    i = rng.randrange(1, len(word))
    typo = word[:i] + word[i + 1 :]
    who = rng.choice("Sam Ann Bo Kim Lee Max Eve".split())
    wordings = [
        'The function `{f}(name)` in `{p}` has a typo: `{f}("{n}")` returns `"{t}, {n}!"`. '
        'Fix the typo so that it returns `"{c}, {n}!"`.',
        '`{f}("{n}")` in `{p}` gives `"{t}, {n}!"` but should give `"{c}, {n}!"`. Correct '
        "the spelling.",
    ]
    instruction = wording(rng, wordings, f=fn, p=workdir_path(name), n=who, t=typo, c=word)
    names = [who, *rng.sample("Zoe Tom Ivy Ray Liz Ned".split(), 2)]
    return Spec(
        "fix-typo",
        instruction,
        {name: [f"def {fn}(name):", f'    return "{typo}, " + name + "!"']},
        solve_script(f"sed -i 's/\"{typo}, /\"{word}, /' {name}"),
        {},
        calls={f"{module}.{fn}({n!r})": f"{word}, {n}!" for n in names},
    )


AGGREGATES: dict[str, tuple[Callable[[list[int]], int], str, list[str]]] = {
    "sum": (sum, "the sum", "sum_of add_all".split()),
    "max": (max, "the largest", "largest biggest top".split()),
    "min": (min, "the smallest", "smallest lowest bottom".split()),
    "len": (len, "the length", "count size_of how_many".split()),
}
"""The builtin the function prints, how the instruction says it, the function's names."""


def return_not_print(rng: random.Random) -> Spec:
    module, name = _module(rng)
    agg = rng.choice(list(AGGREGATES))
    value, what, fns = AGGREGATES[agg]
    fn, arg = rng.choice(fns), rng.choice("values items numbers".split())
    example = _ints(rng, 3)
    wordings = [
        "The function `{f}({a})` in `{p}` prints {w} of `{a}` instead of returning it, so "
        "`{f}({x})` returns `None`. Change it so that it returns it (`{f}({x})` is `{r}`).",
        "`{f}({a})` in `{p}` should return {w} of `{a}`, but it prints it and returns "
        "`None`. Make it return the value: `{f}({x})` must be `{r}`.",
    ]
    instruction = wording(
        rng,
        wordings,
        f=fn,
        a=arg,
        p=workdir_path(name),
        w=what,
        x=str(example),
        r=str(value(example)),
    )
    lists = [example, _ints(rng, 4), _ints(rng, 2)]
    return Spec(
        "return-not-print",
        instruction,
        {name: [f"def {fn}({arg}):", f"    print({agg}({arg}))"]},
        solve_script(f"sed -i 's/print({agg}({arg}))/return {agg}({arg})/' {name}"),
        {},
        calls={f"{module}.{fn}({xs!r})": value(xs) for xs in lists},
    )


def implement(rng: random.Random) -> Spec:
    module, name = _module(rng)
    fn = rng.choice("scale shift bump grow offset step adjust convert".split())
    op, k = rng.choice(list(OPERATORS)), rng.randint(2, 9)
    x = rng.randint(2, 9)
    wordings = [
        "Implement `{f}(x)` in `{p}`: it returns `x {o} {k}`. For example `{f}({x})` is `{r}`.",
        "`{f}(x)` in `{p}` is not written yet. Make it return `x {o} {k}` (so `{f}({x})` "
        "is `{r}`).",
    ]
    result = OPERATORS[op](x, k)
    instruction = wording(
        rng, wordings, f=fn, p=workdir_path(name), o=op, k=str(k), x=str(x), r=str(result)
    )
    xs = [x, *_ints(rng, 3)]
    return Spec(
        "implement",
        instruction,
        {name: [f"def {fn}(x):", "    raise NotImplementedError"]},
        solve_script(f"sed -i 's/raise NotImplementedError/return x {op} {k}/' {name}"),
        {},
        calls={f"{module}.{fn}({v})": OPERATORS[op](v, k) for v in xs},
    )


@dataclass(frozen=True)
class Behaviour:
    """What a described function returns: in words (`{a}` is its argument), as the
    expression a solution writes, and as a Python function for the expected values."""

    words: str
    expression: str
    value: Callable[[Any], Any]
    names: tuple[str, ...]


LIST_BEHAVIOURS = [
    Behaviour("the first element of the non-empty list `{a}`", "{a}[0]", lambda v: v[0],
              ("first", "head", "front")),
    Behaviour("the second element of `{a}`, a list of at least two", "{a}[1]", lambda v: v[1],
              ("second", "runner_up", "next_one")),
    Behaviour("how many elements the list `{a}` has", "len({a})", len,
              ("count_items", "length", "total_items")),
    Behaviour("the sum of the numbers in `{a}`", "sum({a})", sum, ("total", "add_up", "summed")),
    Behaviour("the largest number in `{a}`", "max({a})", max, ("peak", "highest", "maximum")),
    Behaviour("the smallest number in `{a}`", "min({a})", min, ("least", "lowest", "minimum")),
    Behaviour("the numbers of `{a}` sorted from smallest to largest, as a new list",
              "sorted({a})", sorted, ("ordered", "sort_up", "ascending")),
    Behaviour("the list `{a}` without its first element", "{a}[1:]", lambda v: v[1:],
              ("rest", "tail", "drop_first")),
    Behaviour("the first two elements of `{a}`, as a list", "{a}[:2]", lambda v: v[:2],
              ("first_two", "top_two", "opening_pair")),
    Behaviour("how many times 0 appears in `{a}`", "{a}.count(0)", lambda v: v.count(0),
              ("zeros", "count_zeros", "zero_count")),
]  # fmt: skip
INT_BEHAVIOURS = [
    Behaviour("`{a}` doubled", "{a} * 2", lambda v: v * 2, ("double", "twice", "doubled")),
    Behaviour("the absolute value of `{a}`", "abs({a})", abs,
              ("magnitude", "absolute", "size")),
    Behaviour("`True` when `{a}` is even and `False` otherwise", "{a} % 2 == 0",
              lambda v: v % 2 == 0, ("is_even", "even", "even_number")),
    Behaviour("`True` when `{a}` is greater than 0 and `False` otherwise", "{a} > 0",
              lambda v: v > 0, ("is_positive", "positive", "above_zero")),
    Behaviour("the remainder of `{a}` divided by 3", "{a} % 3", lambda v: v % 3,
              ("mod_three", "remainder", "leftover")),
    Behaviour("`{a}` with its sign flipped", "-{a}", lambda v: -v,
              ("negate", "flip_sign", "opposite")),
]  # fmt: skip
TEXT_BEHAVIOURS = [
    Behaviour("`{a}` in upper case", "{a}.upper()", str.upper, ("shout", "to_upper", "loud")),
    Behaviour("`{a}` in lower case", "{a}.lower()", str.lower, ("hush", "to_lower", "quiet")),
    Behaviour("the first character of the non-empty string `{a}`", "{a}[0]", lambda v: v[0],
              ("initial", "first_letter", "first_char")),
    Behaviour("how many characters `{a}` has", "len({a})", len,
              ("char_count", "text_length", "letters")),
    Behaviour("`{a}` without the spaces at its start and end", "{a}.strip()", str.strip,
              ("trim", "tidy", "strip_spaces")),
    Behaviour("`{a}` written twice in a row", "{a} * 2", lambda v: v * 2,
              ("repeat_twice", "echo", "twice_over")),
]  # fmt: skip
WORDS = ["apple", "Sky", "  river ", "Blue Door", "x", "  tea", "Moon  ", "gRaPe"]


def implement_described(rng: random.Random) -> Spec:
    """A body to write from what it returns, said in words: unlike `implement`, whose
    instruction names the expression, the expression is the agent's to find."""
    module, name = _module(rng)
    group, args, draw = rng.choice(
        [
            (LIST_BEHAVIOURS, "items values numbers xs".split(), lambda: _list(rng)),
            (INT_BEHAVIOURS, "n x number value".split(), lambda: rng.randint(-9, 20)),
            (TEXT_BEHAVIOURS, "text word s name".split(), lambda: rng.choice(WORDS)),
        ]
    )
    behaviour, arg = rng.choice(group), rng.choice(args)
    fn = rng.choice(behaviour.names)
    inputs = [draw() for _ in range(4)]
    while not _telling(behaviour, inputs):
        inputs = [draw() for _ in range(4)]
    wordings = [
        "Implement `{f}({a})` in `{p}`: it returns {w}. For example `{f}({x})` is `{r}`.",
        "`{f}({a})` in `{p}` is not written yet. It should return {w}; for example "
        "`{f}({x})` must be `{r}`.",
    ]
    instruction = wording(
        rng,
        wordings,
        f=fn,
        a=arg,
        p=workdir_path(name),
        w=behaviour.words.format(a=arg),
        x=repr(inputs[0]),
        r=repr(behaviour.value(inputs[0])),
    )
    body = behaviour.expression.format(a=arg)
    return Spec(
        "implement-described",
        instruction,
        {name: [f"def {fn}({arg}):", "    raise NotImplementedError"]},
        solve_script(f"sed -i 's/raise NotImplementedError/return {body}/' {name}"),
        {},
        calls={f"{module}.{fn}({v!r})": behaviour.value(v) for v in inputs},
    )


def _list(rng: random.Random) -> list[int]:
    """Three to seven numbers, a 0 among them somewhere."""
    numbers = [0, *_ints(rng, rng.randint(2, 6))]
    return rng.sample(numbers, len(numbers))


def _telling(behaviour: Behaviour, inputs: list[Any]) -> bool:
    """Whether the calls on `inputs` tell the behaviour from a constant and from returning
    the argument as it came (`abs` of positive numbers alone would pass `return n`)."""
    values = [repr(behaviour.value(v)) for v in inputs]
    changed = any(value != repr(v) for value, v in zip(values, inputs, strict=True))
    return len(set(values)) > 1 and changed
