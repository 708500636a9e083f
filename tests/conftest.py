"""Shared fixtures: real parts at small scale (a tiny random model, the real tokenizer)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reinforge.policy.chat import ChatFormat
from reinforge.policy.config import EngineConfig
from reinforge.policy.engine import Completion, Engine
from reinforge.policy.sampling import SamplingParams


class RecordingEngine(Engine):
    """The real engine, also keeping every (prompt, completion) it produced."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.log: list[tuple[list[int], Completion]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        completion = await super().generate(prompt_ids, params)
        self.log.append((list(prompt_ids), completion))
        return completion


@pytest.fixture(scope="session")
def tiny_engine() -> Iterator[RecordingEngine]:
    from reinforge.policy.models import load_model

    model, tokenizer = load_model("tiny-random")
    engine = RecordingEngine(model, tokenizer, "tiny-random", EngineConfig())
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def chat_format(tiny_engine: Engine) -> ChatFormat:
    return ChatFormat(tiny_engine.tokenizer)
