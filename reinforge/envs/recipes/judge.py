"""An LLM judge: reward terms that ask any OpenAI-compatible endpoint to grade an episode
against a rubric written in words.

Each criterion is a rubric term of its own, named and weighted by its config. The judge
reads the conversation and the task's reference answer, reasons, and ends with a line
"Score: X" (0 to `max_score`), or, where the endpoint supports structured output, answers
a JSON object {"reasoning", "score"}. The reward is the score over `max_score`. A reply
with no score, an endpoint error, or no answer within `timeout_s` raises, so the rollout
is an error and never a silent 0. Verdicts are cached by (criterion, episode): the same
conversation, common within a group, is judged once. The judge's reasoning is kept on the
trajectory as `info["judge"][criterion]`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from pydantic import Field, model_validator

from reinforge.envs.rubric import Reward, RewardFn
from reinforge.types import Message, Section

if TYPE_CHECKING:
    import httpx

    from reinforge.envs.episode import Episode

_SCORE = re.compile(r"\**score\W{0,4}?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
"""`Score: 7`, `**Score:** 7.5`, `score = 3`; the last one in a reply counts."""


class Criterion(Section):
    name: str
    """The reward term's name, as metrics and trajectories report it."""
    rubric: str
    """What the judge grades, in words: what earns the full score, what earns none."""
    weight: float = 1.0
    """The term's weight in the total reward."""


class JudgeConfig(Section):
    """An OpenAI-compatible endpoint that grades episodes, and what it grades."""

    url: str
    """The endpoint's /v1 URL, e.g. http://127.0.0.1:8000/v1 for a `reinforge serve`."""
    model: str
    """The model to ask, as the endpoint names it."""
    criteria: list[Criterion] = Field(min_length=1)
    """Each a reward term of its own."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the endpoint's API key (keys stay out of config
    files); unset: no key."""
    max_score: float = Field(10.0, gt=0.0)
    """Scores run from 0 to this; the reward is the score divided by it."""
    timeout_s: float = Field(60.0, gt=0.0)
    """Per verdict; a judge past it makes the rollout an error."""
    structured: bool = False
    """Ask for a JSON object {reasoning, score} (OpenAI's json_schema response format),
    for endpoints that support it; the "Score: X" line is still read if the reply is not
    JSON."""
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    """The judge's sampling temperature; 0: the same episode gets the same verdict."""
    max_tokens: int = Field(512, ge=1)
    """Tokens the judge may write per verdict."""
    instructions: str = (
        "You grade an AI assistant's work against a rubric. Reason briefly about how well "
        "the conversation meets the rubric, then end your reply with one line "
        "'Score: X', where X is a number from 0 (does not meet it at all) to {max_score} "
        "(fully meets it)."
    )
    """The judge's system prompt; `{max_score}` is filled in."""

    @model_validator(mode="after")
    def _placeholders(self) -> Self:
        try:
            self.instructions.format(max_score=10)
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"instructions may use only {{max_score}}: {error}") from error
        return self


class JudgeError(Exception):
    """The judge gave no usable verdict: no score, an endpoint error, or no answer in time."""


@dataclass(frozen=True)
class Verdict:
    score: float
    """The reward: the judge's score over `max_score`, between 0 and 1."""
    reasoning: str


def parse_verdict(text: str, max_score: float) -> Verdict:
    """The verdict in a judge's reply: a JSON object with a numeric `score` (and
    `reasoning`), else the last "Score: X" in the text, with the text before it as the
    reasoning. A score outside [0, max_score] is no verdict."""
    score, reasoning = _structured(text)
    if score is None:
        found = list(_SCORE.finditer(text))
        if not found:
            raise JudgeError(f"no 'Score: X' in the judge's reply: {_tail(text)!r}")
        score, reasoning = float(found[-1].group(1)), text[: found[-1].start()].strip()
    if not 0.0 <= score <= max_score:
        raise JudgeError(f"the judge's score {score:g} is outside 0..{max_score:g}")
    return Verdict(score / max_score, reasoning)


class Judge:
    """Grades episodes by the criteria of one `JudgeConfig`; holds the cache of verdicts.
    `transport` reaches the endpoint in process instead of over the network (tests)."""

    def __init__(
        self, config: JudgeConfig, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        self._transport = transport
        self._verdicts: dict[str, Verdict] = {}
        self._pending: dict[str, asyncio.Future[Verdict]] = {}

    def terms(self) -> list[Reward]:
        """One rubric term per criterion."""
        return [Reward(self._term(c), c.weight, c.name) for c in self.config.criteria]

    def _term(self, criterion: Criterion) -> RewardFn:
        async def judged(episode: Episode) -> float:
            verdict = await self.verdict(criterion, episode)
            episode.state.setdefault("judge", {})[criterion.name] = verdict.reasoning
            return verdict.score

        return judged

    async def verdict(self, criterion: Criterion, episode: Episode) -> Verdict:
        """The judge's verdict on `episode` by `criterion`, asked once per distinct pair:
        concurrent asks of the same pair share one request, and failures are not kept."""
        messages = self.messages(criterion, episode)
        key = hashlib.sha256(json.dumps([self.config.model, messages]).encode()).hexdigest()
        if key in self._verdicts:
            return self._verdicts[key]
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._ask(messages))
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        verdict = await asyncio.shield(pending)  # one caller's cancellation spares the rest
        self._verdicts[key] = verdict
        return verdict

    def messages(self, criterion: Criterion, episode: Episode) -> list[Message]:
        """What the judge is asked: the instructions, the rubric, the conversation and the
        reference answer (when the task has one)."""
        conversation = "\n\n".join(
            f"[{m.get('role')}]\n{m.get('content') or ''}" for m in episode.messages
        )
        request = f"## Rubric\n{criterion.rubric}\n\n## Conversation\n{conversation}"
        if episode.task.answer is not None:
            request += f"\n\n## Reference answer\n{episode.task.answer}"
        system = self.config.instructions.format(max_score=f"{self.config.max_score:g}")
        return [{"role": "system", "content": system}, {"role": "user", "content": request}]

    async def _ask(self, messages: list[Message]) -> Verdict:
        import httpx  # here, not above: `JudgeConfig` is read with every config
        import openai

        config = self.config
        http = None if self._transport is None else httpx.AsyncClient(transport=self._transport)
        client = openai.AsyncOpenAI(
            base_url=config.url,
            api_key=os.environ.get(config.api_key_env) or "EMPTY",
            max_retries=0,
            timeout=config.timeout_s,
            http_client=http,
        )
        try:
            async with client:
                response = await asyncio.wait_for(
                    client.chat.completions.create(
                        model=config.model,
                        messages=messages,  # type: ignore[arg-type]
                        temperature=config.temperature,
                        max_tokens=config.max_tokens,
                        response_format=_SCHEMA if config.structured else openai.omit,  # type: ignore[arg-type]
                    ),
                    timeout=config.timeout_s,
                )
        except (TimeoutError, openai.APITimeoutError) as error:
            raise JudgeError(
                f"the judge at {config.url} gave no verdict within {config.timeout_s:g} s"
            ) from error
        except openai.APIError as error:
            raise JudgeError(f"the judge at {config.url} failed: {error}") from error
        return parse_verdict(response.choices[0].message.content or "", config.max_score)


_SCHEMA: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"reasoning": {"type": "string"}, "score": {"type": "number"}},
            "required": ["reasoning", "score"],
            "additionalProperties": False,
        },
    },
}


def _structured(text: str) -> tuple[float | None, str]:
    """(score, reasoning) of a reply that is a JSON verdict; (None, "") of any other."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None, ""
    if not isinstance(value, dict):
        return None, ""
    score = value.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float):
        return None, ""
    return float(score), str(value.get("reasoning") or "")


def _tail(text: str, chars: int = 200) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]
