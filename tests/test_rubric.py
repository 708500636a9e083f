import asyncio

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

    def overflows(ep: Episode) -> float:
        return float("inf")

    (result,) = await Rubric(Reward(overflows)).score([episode("x")])
    assert isinstance(result, GraderError) and "not a finite number" in str(result)
    results = await Rubric(GroupReward(too_few)).score([episode("a"), episode("b")])
    assert all(isinstance(r, GraderError) for r in results)


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
