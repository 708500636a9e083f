import asyncio

import pytest

from reinforge.envs import Episode, GroupReward, Reward, Rubric
from reinforge.envs.rubric import GraderError, Scores
from reinforge.types import Task


def episode(text: str) -> Episode:
    task = Task(id="t", prompt=[{"role": "user", "content": "q"}], answer="yes")
    return Episode(task, [*task.prompt, {"role": "assistant", "content": text}])


def correct(ep: Episode) -> float:
    return float(ep.completion == ep.task.answer)


def short(ep: Episode) -> bool:
    return len(ep.completion) < 4


async def shortest_in_group(eps: list[Episode]) -> list[float]:
    best = min(len(e.completion) for e in eps)
    return [float(len(e.completion) == best) for e in eps]


async def test_weighted_terms_and_group_terms():
    rubric = Rubric(
        Reward(correct), Reward(short, weight=0.5), GroupReward(shortest_in_group, 0.25)
    )
    results = await rubric.score([episode("yes"), episode("no, sorry")])
    # "yes": correct 1, short 1 (x0.5), shortest 1 (x0.25) -> 1.75
    # "no, sorry": 0 + 0 + 0 -> 0
    assert results == [
        Scores({"correct": 1.0, "short": 1.0, "shortest_in_group": 1.0}, 1.75),
        Scores({"correct": 0.0, "short": 0.0, "shortest_in_group": 0.0}, 0.0),
    ]


async def test_a_raising_grader_is_an_error_not_zero():
    def broken(ep: Episode) -> float:
        if ep.completion == "boom":
            raise RuntimeError("grader crashed")
        return 1.0

    results = await Rubric(Reward(broken)).score([episode("fine"), episode("boom")])
    assert results[0] == Scores({"broken": 1.0}, 1.0)
    assert isinstance(results[1], GraderError) and "grader crashed" in str(results[1])


async def test_non_numbers_and_wrong_group_lengths_are_errors():
    def says_yes(ep: Episode) -> str:
        return "yes"

    def too_few(eps: list[Episode]) -> list[float]:
        return [1.0]

    (result,) = await Rubric(Reward(says_yes)).score([episode("x")])
    assert isinstance(result, GraderError)
    results = await Rubric(GroupReward(too_few)).score([episode("a"), episode("b")])
    assert all(isinstance(r, GraderError) for r in results)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param(float("nan"), "returned nan, not a finite float32 number", id="nan"),
        pytest.param(float("inf"), "returned inf, not a finite float32 number", id="inf"),
        # finite in float64, inf in float32
        pytest.param(1e39, "returned 1e+39, not a finite float32 number", id="1e39"),
        pytest.param(10**400, "returned 1000", id="past-float64"),
        pytest.param("1.0", "returned '1.0' (str), not a number", id="string"),
        pytest.param(None, "returned None (NoneType), not a number", id="none"),
    ],
)
async def test_a_value_that_is_no_finite_float32_is_an_error_naming_the_grader(value, problem):
    def grade(ep: Episode) -> object:
        return value

    async def grade_group(eps: list[Episode]) -> list[object]:
        return [value for _ in eps]

    where = f"{__file__}:{grade.__code__.co_firstlineno}"
    (result,) = await Rubric(Reward(grade)).score([episode("x")])
    assert isinstance(result, GraderError)
    assert str(result).startswith(f"reward 'grade' {problem}") and str(result).endswith(
        f"({where})"
    )
    results = await Rubric(GroupReward(grade_group)).score([episode("a"), episode("b")])
    assert all(isinstance(r, GraderError) for r in results)
    assert str(results[0]).startswith(f"group reward 'grade_group' {problem}")


async def test_float32_s_largest_values_score_and_a_total_past_them_is_an_error():
    def large(ep: Episode) -> float:
        return 3.4e38

    assert await Rubric(Reward(large)).score([episode("x")]) == [Scores({"large": 3.4e38}, 3.4e38)]
    (result,) = await Rubric(Reward(large, weight=2.0)).score([episode("x")])
    assert isinstance(result, GraderError)
    assert str(result) == (
        "the weighted total of rewards {'large': 3.4e+38} is 6.8e+38, not a finite float32 number"
    )


async def test_a_raising_grader_is_named_with_the_line_that_raised():
    def grade(ep: Episode) -> float:
        return ep.state["answer"]

    (result,) = await Rubric(Reward(grade)).score([episode("x")])
    line = grade.__code__.co_firstlineno + 1
    assert str(result) == f"reward 'grade' raised KeyError: 'answer' ({__file__}:{line})"


async def test_a_term_grades_the_group_concurrently():
    # Each grader waits until all three have started: run one after another, the first
    # gives up after 30 s and is a grader error; run together, all three finish.
    started = asyncio.Event()
    running = 0

    async def waits_for_the_others(ep: Episode) -> float:
        nonlocal running
        running += 1
        if running == 3:
            started.set()
        await asyncio.wait_for(started.wait(), timeout=30)
        return 1.0

    results = await Rubric(Reward(waits_for_the_others)).score([episode(x) for x in "abc"])
    assert [r.total for r in results] == [1.0, 1.0, 1.0]
