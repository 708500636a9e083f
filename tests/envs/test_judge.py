"""The LLM judge on hand-made replies: parsing, the cache, timeouts and failures as
errors (never 0), reasoning kept on the episode; and the conciseness bonus.

The endpoint here is a small OpenAI-compatible app reached over httpx's ASGI transport: the
real openai client and HTTP handling, with replies a test chooses. The call path against a
real `reinforge serve` is in tests/test_recipes.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from reinforge.envs.episode import Episode
from reinforge.envs.recipes.conciseness import conciseness
from reinforge.envs.recipes.judge import Criterion, Judge, JudgeConfig, JudgeError, parse_verdict
from reinforge.envs.rubric import GraderError, Rubric, Scores
from reinforge.types import Task

TASK = Task(id="t", prompt=[{"role": "user", "content": "What is 40 + 2?"}], answer=42)
CORRECT = Criterion(name="correct", rubric="The reply gives the reference answer.")
CLEAR = Criterion(name="clear", rubric="The reply is easy to follow.", weight=0.5)


@pytest.mark.parametrize(
    "reply, score, reasoning",
    [
        ("It says 42, the reference.\nScore: 8", 0.8, "It says 42, the reference."),
        ("Close enough. **Score:** 7.5/10", 0.75, "Close enough."),
        (
            "Score: 2 at first sight; on reflection\nScore: 10",
            1.0,
            "Score: 2 at first sight; on reflection",
        ),
        ('{"reasoning": "right", "score": 3}', 0.3, "right"),
        ("score = 0", 0.0, ""),
    ],
)
def test_parse_a_verdict(reply, score, reasoning):
    verdict = parse_verdict(reply, max_score=10)
    assert (verdict.score, verdict.reasoning) == (score, reasoning)


@pytest.mark.parametrize(
    "reply, problem",
    [
        ("It is right, I would say.", "no 'Score: X'"),
        ("Score: 11", "outside 0..10"),
        ("Score: -1", "outside 0..10"),
        ('{"reasoning": "no number", "score": "high"}', "no 'Score: X'"),
    ],
)
def test_a_reply_without_a_usable_score_is_no_verdict(reply, problem):
    with pytest.raises(JudgeError, match=problem):
        parse_verdict(reply, max_score=10)


class Endpoint:
    """An OpenAI-compatible chat endpoint answering `reply(request)`, after `delay_s`;
    keeps every request it got."""

    def __init__(self, reply: Callable[[dict[str, Any]], str], delay_s: float = 0.0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def complete(request: dict[str, Any]) -> dict[str, Any]:
            self.requests.append(request)
            await asyncio.sleep(delay_s)
            message = {"role": "assistant", "content": reply(request)}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "judge",
                "choices": [choice],
            }

    def judge(self, *criteria: Criterion, **settings: Any) -> Judge:
        given = {"url": "http://judge/v1", "model": "judge", "criteria": list(criteria)}
        config = JudgeConfig.model_validate({**given, **settings})
        return Judge(config, transport=httpx.ASGITransport(app=self.app))


def _episode(reply: str) -> Episode:
    return Episode(TASK, [*TASK.prompt, {"role": "assistant", "content": reply}], turns=1)


def _by_criterion(request: dict[str, Any]) -> str:
    """Full marks for correctness when the conversation holds 42; 5 for clarity."""
    asked = request["messages"][1]["content"]
    if "easy to follow" in asked:
        return "Readable.\nScore: 5"
    return "Gives 42.\nScore: 10" if "[assistant]\n42" in asked else "Wrong.\nScore: 0"


async def test_each_criterion_is_its_own_term_and_verdicts_are_cached():
    endpoint = Endpoint(_by_criterion)
    rubric = Rubric(*endpoint.judge(CORRECT, CLEAR).terms())
    group = [_episode("42"), _episode("42"), _episode("41")]
    scores = await rubric.score(group)
    # correct 1 x 1 + clear 0.5 x 0.5 = 1.25; the wrong one 0 + 0.25
    assert scores == [
        Scores({"correct": 1.0, "clear": 0.5}, 1.25),
        Scores({"correct": 1.0, "clear": 0.5}, 1.25),
        Scores({"correct": 0.0, "clear": 0.5}, 0.25),
    ]
    assert len(endpoint.requests) == 4  # two episodes alike: 2 criteria x 2 distinct
    assert group[0].state["judge"] == {"correct": "Gives 42.", "clear": "Readable."}
    assert group[2].state["judge"]["correct"] == "Wrong."
    asked = endpoint.requests[0]["messages"]
    assert "Score: X" in asked[0]["content"] and "10 (fully meets it)" in asked[0]["content"]
    assert "## Reference answer\n42" in asked[1]["content"]
    await rubric.score([_episode("42")])
    assert len(endpoint.requests) == 4  # judged before: from the cache


async def test_an_unparsable_verdict_is_an_error_and_is_not_cached():
    endpoint = Endpoint(lambda request: "I cannot decide.")
    rubric = Rubric(*endpoint.judge(CORRECT).terms())
    (result,) = await rubric.score([_episode("42")])
    assert isinstance(result, GraderError)
    assert "JudgeError: no 'Score: X' in the judge's reply: 'I cannot decide.'" in str(result)
    await rubric.score([_episode("42")])
    assert len(endpoint.requests) == 2  # asked again


async def test_a_judge_past_its_timeout_is_an_error_not_zero():
    endpoint = Endpoint(lambda request: "Score: 10", delay_s=30.0)
    rubric = Rubric(*endpoint.judge(CORRECT, timeout_s=0.05).terms())
    (result,) = await rubric.score([_episode("42")])
    assert isinstance(result, GraderError)
    assert "gave no verdict within 0.05 s" in str(result)


async def test_an_endpoint_error_is_an_error():
    judge = Endpoint(lambda request: "Score: 10").judge(CORRECT, url="http://judge/elsewhere")
    with pytest.raises(JudgeError, match="failed: .*404"):
        await judge.verdict(CORRECT, _episode("42"))


async def test_structured_output_is_asked_for_and_read():
    endpoint = Endpoint(lambda request: '{"reasoning": "exact", "score": 9}')
    judge = endpoint.judge(CORRECT, structured=True)
    verdict = await judge.verdict(CORRECT, _episode("42"))
    assert (verdict.score, verdict.reasoning) == (0.9, "exact")
    schema = endpoint.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["reasoning", "score"]
    plain = Endpoint(lambda request: "Score: 9")
    await plain.judge(CORRECT).verdict(CORRECT, _episode("42"))
    assert "response_format" not in plain.requests[0]


def test_conciseness_is_relative_to_the_group():
    lengths = [2, 4, 6, 6]
    episodes = [_episode("x") for _ in lengths]
    for episode, n in zip(episodes, lengths, strict=True):
        episode.sampled_token_ids = [[0] * n]
    # 0.5 - (n - 2) / (6 - 2): 0.5, 0.0, -0.5, -0.5
    assert conciseness(episodes) == [0.5, 0.0, -0.5, -0.5]
    assert conciseness(episodes[2:]) == [0.0, 0.0]  # equally long: no bonus
