"""The engines a policy samples with, behind one interface: the built-in transformers
engine and vLLM. The server, the in-process client and the trainer's weight sync see only
this interface, so an environment, an eval or a run does not know which one samples."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from reinforge.policy.config import EngineConfig, ModelConfig
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import Completion, EngineStats, TokenListener
from reinforge.policy.models import resolve_device
from reinforge.policy.sampling import SamplingParams
from reinforge.policy.scoring import PromptLogprobs


class SamplingEngine(Protocol):
    name: str
    tokenizer: PreTrainedTokenizerBase
    max_context: int
    """Prompt and completion tokens together."""
    eos_ids: set[int]
    version: int
    """The policy version of the weights that sample now."""
    stats: EngineStats

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: TokenListener | None = None,
    ) -> Completion:
        """The finished completion; `on_tokens` (if given) gets its tokens as they are
        sampled, before this returns."""
        ...

    async def prompt_logprobs(self, token_ids: list[int], top_logprobs: int = 0) -> PromptLogprobs:
        """The raw model's log-prob of each token after the first given those before it,
        with `top_logprobs` alternatives at each position: what a teacher is asked for."""
        ...

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """New weights (Hugging Face names) between two decode steps; returns the new
        version: `version`, else the next one. Tokens sampled after it carry it, and each
        comes wholly from the new weights."""
        ...

    def paused(self) -> AbstractContextManager[None]:
        """Hold decoding for the body; the version does not change."""
        ...

    def close(self) -> None: ...


def samples_on_gpu(model: ModelConfig) -> bool:
    """Whether this machine's engine of `model` computes on a GPU, which settles an
    `engine.dtype` of auto: vLLM takes one whenever torch sees one, the built-in engine
    takes the device `model.device` names."""
    if model.engine == "vllm":
        return torch.cuda.is_available()
    return resolve_device(model.device).type == "cuda"


def load_engine(model: ModelConfig, config: EngineConfig) -> SamplingEngine:
    if model.engine == "vllm":  # it places the model itself: `ModelConfig` takes auto only
        from reinforge.policy.vllm_engine import VllmEngine

        return VllmEngine.from_spec(model.name, config)
    return Engine.from_spec(model.name, config, resolve_device(model.device))
