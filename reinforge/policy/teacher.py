"""A teacher: a model that scores another model's tokens, reached through the completions
API's `echo` with `logprobs` and `max_tokens: 0` (OpenAI's legacy scoring call, which
`reinforge serve` and vLLM's server answer).

A teacher loaded from a model spec runs in an engine in this process and is reached
through the server app over an in-memory transport (`PolicyClient.for_engine`); a URL is
any such server. One code path either way.
"""

from __future__ import annotations

import openai
from transformers import PreTrainedTokenizerBase

from reinforge.errors import UsageError
from reinforge.policy.backends import SamplingEngine, load_engine
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import EngineConfig, ModelConfig, SamplingConfig
from reinforge.policy.specs import is_url

_PROBE_TOKENS = 256
"""Token ids, spread over the student's vocabulary, that the vocabulary check scores."""


class Teacher:
    """Log-probs of given token ids under one model (temperature 1, the raw model)."""

    def __init__(self, client: PolicyClient, where: str, engine: SamplingEngine | None) -> None:
        self.client = client
        self.where = where
        """The spec or URL, for messages."""
        self._engine = engine

    @classmethod
    async def open(
        cls, spec: str, model: ModelConfig, engine: EngineConfig, served_name: str | None
    ) -> Teacher:
        """`spec` is a URL (`http://HOST:PORT/v1`), else a model loaded into the engine
        `model.engine` names, with the engine settings of the run."""
        if is_url(spec):
            client = await PolicyClient.for_url(spec, SamplingConfig(), served_name)
            return cls(client, spec, None)
        loaded = load_engine(model.model_copy(update={"name": spec}), engine)
        return cls(PolicyClient.for_engine(loaded, SamplingConfig()), spec, loaded)

    async def logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token i | tokens before it) for i = 1 .. n-1 (n - 1 entries)."""
        return (await self._score(token_ids))[0]

    async def check_vocabulary(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Refuse a teacher whose token ids mean other tokens than the student's: its
        log-probs would score other text. Probes ids spread over the student's vocabulary,
        its last one included, and compares the token texts the teacher returns."""
        size = len(tokenizer)
        probe = sorted({*range(0, size, max(1, size // _PROBE_TOKENS)), size - 1})
        try:
            _, tokens = await self._score(probe)
        except UsageError as error:
            raise UsageError(
                f"{error} (the student's token ids 0..{size - 1}; is the teacher's vocabulary "
                "the student's?)"
            ) from error
        if len(tokens) != len(probe):
            raise UsageError(f"the teacher {self.where} returned no text for each prompt token")
        special = set(tokenizer.all_special_ids)
        for token_id, text in zip(probe, tokens, strict=True):
            ours = tokenizer.decode([token_id])
            if token_id not in special and "\ufffd" not in ours + text and ours != text:
                raise UsageError(
                    f"the teacher {self.where} does not share the student's vocabulary: "
                    f"token {token_id} is {text!r} there and {ours!r} here"
                )

    async def _score(self, token_ids: list[int]) -> tuple[list[float], list[str]]:
        """The prompt log-probs (after the first token) and the token texts."""
        try:
            response = await self.client.openai.completions.create(
                model=self.client.model,
                prompt=token_ids,
                max_tokens=0,
                echo=True,
                logprobs=0,
                temperature=1.0,
            )
        except openai.APIError as error:
            raise UsageError(
                f"the teacher {self.where} did not score the tokens: {error}"
            ) from error
        scored = response.choices[0].logprobs if response.choices else None
        values = scored.token_logprobs if scored is not None else None
        if not values or len(values) != len(token_ids) or None in values[1:]:
            raise UsageError(
                f"the teacher {self.where} returned no log-prob for every prompt token: it "
                "must answer completions with echo=true, logprobs=0 and max_tokens=0"
            )
        return [float(v) for v in values[1:]], list(scored.tokens or [])

    async def aclose(self) -> None:
        await self.client.close()
        if self._engine is not None:
            self._engine.close()
