"""The built-in engine's memory: an out-of-memory fails the request that caused it while the
others run on, with the tokens they would have had without it; requests join the batch
while its KV cache stays within a budget, a fraction of the memory free at start.

The out-of-memory failures are real `torch.OutOfMemoryError`s, raised by a hook in the
model's forward only when the batch holds a given request; each test has its own engine
(no prefix cache, so that a run and its repeat compute the same states the same way)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from torch import nn

from reinforge.config import ServeConfig, load_config
from reinforge.policy.backends import load_engine
from reinforge.policy.cgroups import cgroup_folders
from reinforge.policy.config import EngineConfig
from reinforge.policy.decode import LlamaDecoder
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import Completion, Sampled
from reinforge.policy.memory import (
    OutOfMemory,
    cgroup_memory_left,
    free_memory,
    is_out_of_memory,
    kv_budget,
    kv_token_bytes,
    memory_files,
)
from reinforge.policy.models import load_model
from reinforge.policy.sampling import SamplingParams

from .conftest import EngineUnderTest

MIB = 2**20

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


@pytest.fixture
def small_engine() -> Iterator[Engine]:
    """An engine whose KV budget holds 100 tokens' states: the two `PROMPTS` (36 and 31
    tokens at most) fit together, a third of 64 does not, one of 114 never does."""
    model, tokenizer = load_model("tiny-random")
    budget = 100 * kv_token_bytes(model.config, model.dtype)
    engine = Engine(model, tokenizer, "tiny-random", EngineConfig(prefix_cache_mib=0), budget)
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


def raising_at_the_head(
    engine: Engine, when: Callable[[torch.Tensor], bool], error: Exception
) -> Callable[[], None]:
    """Make the engine's decode step raise `error` at its vocabulary projection, after
    every layer appended its new column, whenever the projection's input makes `when`
    true; returns the undo. (The step multiplies by the head's weight, not through its
    module, where it lays weights out: no module hook would run.)"""
    decoder = engine._decode_step
    assert isinstance(decoder, LlamaDecoder)
    head = decoder.head

    def failing(x: torch.Tensor) -> torch.Tensor:
        if when(x):
            raise error
        return head(x)

    decoder.head = failing
    return lambda: setattr(decoder, "head", head)


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
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    undo = raising_at_the_head(engine, lambda x: x.shape[0] == 3, oom)  # 3 rows decode
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
    broken = ValueError("a broken kernel")
    undo = raising_at_the_head(engine, lambda x: x.shape[0] == 3, broken)
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


def test_a_request_too_long_for_the_budget_fails_alone(small_engine: Engine):
    expected = alone(small_engine)
    prefilled = small_engine.stats.requests
    futures = [small_engine.submit(p, sampling(24, seed=i)) for i, p in enumerate(PROMPTS)]
    long = small_engine.submit(list(range(100, 190)), sampling(24, seed=3))
    with pytest.raises(OutOfMemory) as refused:
        long.result(timeout=120)
    message = str(refused.value)
    assert "the KV states of 114 tokens (a prompt of 90 and max_tokens 24)" in message
    assert "KV budget of 50.0 KiB (engine.kv_memory_fraction" in message
    assert "\n" not in message
    assert [f.result(timeout=120).token_ids for f in futures] == expected
    assert small_engine.stats.requests == prefilled + 2  # the long one was never prefilled


def test_a_request_that_does_not_fit_now_waits_for_rows_to_leave(small_engine: Engine):
    # 3 rows of up to 64 tokens would pass the budget: the newcomer joins once the two
    # running rows have left. Without the budget it would join within a few steps.
    newcomer = list(range(200, 240))
    expected = small_engine.submit(newcomer, sampling(24, seed=9)).result(timeout=120)
    running: list[Future[Completion]] = []
    at_first_token: list[list[bool]] = []
    later: list[Future[Completion]] = []

    def note(step: Sampled) -> None:  # on the newcomer's first token: are the others done?
        if not at_first_token:
            at_first_token.append([f.done() for f in running])

    def submit_newcomer(step: Sampled) -> None:
        if not later:
            later.append(small_engine.submit(newcomer, sampling(24, seed=9), note))

    for i, prompt in enumerate(PROMPTS):
        running.append(small_engine.submit(prompt, sampling(24, seed=i), submit_newcomer))
    assert all(len(f.result(timeout=120).token_ids) == 24 for f in running)
    assert later[0].result(timeout=120).token_ids == expected.token_ids
    assert at_first_token == [[True, True]]


def plant_memory_limit(root: Path, limit: int, usage: int) -> None:
    """Memory limit and usage files where this process's own cgroup lines point, under
    `root`, for either cgroup version."""
    for folder, v2 in cgroup_folders("memory", root):
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in zip(memory_files(v2), (limit, usage), strict=True):
            (folder / name).write_text(f"{value}\n")


def mem_available() -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if "MemAvailable" in x)
    return int(line.split()[1]) * 1024


def test_the_budget_on_the_cpu_is_the_fraction_of_the_memory_available(tmp_path):
    cpu = torch.device("cpu")
    plant_memory_limit(tmp_path, 1024 * MIB, 256 * MIB)  # a cgroup with 768 MiB left
    assert cgroup_memory_left(tmp_path) == 768 * MIB
    assert free_memory(cpu, tmp_path) == 768 * MIB
    assert kv_budget(cpu, 0.25, tmp_path) == 192 * MIB
    unlimited = tmp_path / "unlimited"  # v1 says "no limit" with a huge number
    plant_memory_limit(unlimited, 2**63 - 4096, 256 * MIB)
    before = mem_available()
    budget = kv_budget(cpu, 0.5, unlimited)
    after = mem_available()
    assert 0.5 * min(before, after) - 1 <= budget <= 0.5 * max(before, after)
    assert cgroup_memory_left(tmp_path / "absent") is None


def test_kv_bytes_per_token_come_from_the_model_config():
    model, _ = load_model("tiny-random")  # 2 layers, 1 KV head of 32
    assert kv_token_bytes(model.config, torch.float32) == 2 * 2 * 1 * 32 * 4
    assert kv_token_bytes(model.config, torch.bfloat16) == 2 * 2 * 1 * 32 * 2


def test_the_fraction_key_refuses_a_request_too_long_for_it():
    # A fraction of the free memory that holds about 200 tokens' states of tiny-random: a
    # request of 36 runs, one of 1024 is refused, however the free memory moves meanwhile.
    model, _ = load_model("tiny-random")
    fraction = 200 * kv_token_bytes(model.config, model.dtype) / free_memory(torch.device("cpu"))
    overrides = ["model.name=tiny-random", "model.device=cpu"]
    config = load_config(
        ServeConfig, None, [*overrides, f"engine.kv_memory_fraction={fraction:.3e}"]
    )
    engine = load_engine(config.model, config.engine)
    try:
        assert isinstance(engine, Engine)
        assert 100 * 512 < engine.kv_budget.max_bytes < 400 * 512
        short = engine.submit(PROMPTS[0], sampling(24, seed=0))
        long = engine.submit(list(range(1000)), sampling(24, seed=0))
        with pytest.raises(OutOfMemory, match=r"1024 tokens .*\(engine.kv_memory_fraction"):
            long.result(timeout=120)
        assert len(short.result(timeout=120).token_ids) == 24
    finally:
        engine.close()
