"""The built-in engine's memory: an out-of-memory fails the request that caused it while the
others run on, with the tokens they would have had without it.

The failures are real `torch.OutOfMemoryError`s, raised by a hook in the model's forward
only when the batch holds a given request; each test has its own engine (no prefix cache,
so that a run and its repeat compute the same states the same way)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest
import torch
from torch import nn

from reinforge.policy.config import EngineConfig
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import Completion, Sampled
from reinforge.policy.memory import OutOfMemory, is_out_of_memory
from reinforge.policy.models import load_model
from reinforge.policy.sampling import SamplingParams

from .conftest import EngineUnderTest

MARKER = 777
"""A token id only the prompt of the request that runs out of memory holds."""
PROMPTS = [list(range(5, 17)), list(range(30, 37))]


def sampling(max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens, temperature=1.0, top_p=1.0, stop_loops=False, seed=seed)


@pytest.fixture
def engine() -> Iterator[Engine]:
    model, tokenizer = load_model("tiny-random")
    engine = Engine(model, tokenizer, "tiny-random", EngineConfig(prefix_cache_mib=0))
    yield engine
    engine.close()


def raising(
    module: nn.Module, when: Callable[[torch.Tensor], bool], error: Exception
) -> Callable[[], None]:
    """Make `module` raise `error` whenever its input makes `when` true; returns the undo."""

    def hook(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if when(args[0]):
            raise error

    return module.register_forward_pre_hook(hook).remove


def run_with_newcomer(
    engine: Engine, newcomer: list[int]
) -> tuple[list[Completion], Future[Completion]]:
    """The two seeded `PROMPTS` decode together; once the first has 3 tokens, `newcomer`
    arrives (submitted from the engine's own thread, so it joins their running batch)."""
    heard: list[int] = []
    later: list[Future[Completion]] = []

    def submit_newcomer(step: Sampled) -> None:
        heard.extend(step.token_ids)
        if len(heard) == 3:
            later.append(engine.submit(newcomer, sampling(24, seed=9)))

    futures = [
        engine.submit(prompt, sampling(24, seed=i), submit_newcomer if i == 0 else None)
        for i, prompt in enumerate(PROMPTS)
    ]
    return [future.result(timeout=120) for future in futures], later[0]


def alone(engine: Engine) -> list[list[int]]:
    """The tokens of the two `PROMPTS` with nothing else running."""
    futures = [engine.submit(p, sampling(24, seed=i)) for i, p in enumerate(PROMPTS)]
    return [future.result(timeout=120).token_ids for future in futures]


def assert_exact(engine: Engine, completions: list[Completion]) -> None:
    """Each completion's log-probs are a plain forward's over its own sequence."""
    reference = EngineUnderTest(engine, engine.model)
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        expected = reference.forced_logprobs(prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


def test_out_of_memory_in_a_prefill_fails_the_newcomer_only(engine: Engine):
    expected = alone(engine)
    embed = engine.model.get_input_embeddings()
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    undo = raising(embed, lambda ids: ids.dim() == 2 and bool((ids == MARKER).any()), oom)
    try:
        completions, newcomer = run_with_newcomer(engine, [MARKER, 1, 2, 3])
        with pytest.raises(OutOfMemory, match="did not fit in the engine's memory: prefill"):
            newcomer.result(timeout=120)
        assert newcomer.exception().__cause__ is oom
    finally:
        undo()
    assert [c.token_ids for c in completions] == expected
    assert [c.finish_reason for c in completions] == ["length", "length"]
    assert_exact(engine, completions)
    assert len(engine.submit([MARKER, 1], sampling(4, seed=1)).result(timeout=60).token_ids) == 4


def test_out_of_memory_in_a_decode_step_fails_the_row_admitted_last(engine: Engine):
    # The LM head runs after every layer appended its new column: the retried step must
    # start from the cache as it was, or the two rows' tokens and log-probs would change.
    expected = alone(engine)
    head = engine.model.get_output_embeddings()
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    undo = raising(head, lambda x: x.dim() == 2 and x.shape[0] == 3, oom)  # 3 rows decode
    try:
        completions, newcomer = run_with_newcomer(engine, [40, 41, 42])
        with pytest.raises(OutOfMemory, match="decode step of 3 rows ran out; it came last"):
            newcomer.result(timeout=120)
    finally:
        undo()
    assert [c.token_ids for c in completions] == expected
    assert_exact(engine, completions)
    assert engine.stats.requests == 5  # the newcomer was prefilled, then left


def test_any_other_failure_in_a_step_fails_every_request_of_it(engine: Engine):
    head = engine.model.get_output_embeddings()
    broken = ValueError("a broken kernel")
    undo = raising(head, lambda x: x.dim() == 2 and x.shape[0] == 3, broken)
    try:
        futures = [engine.submit(p, sampling(24, seed=i)) for i, p in enumerate(PROMPTS)]
        futures.append(engine.submit([40, 41, 42], sampling(24, seed=9)))
        for future in futures:
            assert future.exception(timeout=120) is broken
    finally:
        undo()


def test_a_failed_cpu_allocation_is_an_out_of_memory():
    # torch's CPU allocator raises a plain RuntimeError, CUDA's a torch.OutOfMemoryError.
    with pytest.raises(RuntimeError) as failed:
        torch.empty(2**50, dtype=torch.uint8)
    assert is_out_of_memory(failed.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shapes do not match"))
