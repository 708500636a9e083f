"""`reinforge sim calibrate`: time the engine and the trainer a run would use, on this
machine, and keep what the simulator needs as a `Profile`.

Everything is measured through the loop's own parts: the engine `orchestrate/engines.py`
opens for the config (built-in or vLLM, shared with the trainer or not) and its
`train_and_sync` (an optimizer step, then the weight sync). A decode step is timed from the
engine's token listener: every running row gets its k-th token from the same iteration,
so the first listener call of each token index marks an iteration's end, and the rows
still answering are its batch.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from reinforge.orchestrate.engines import LocalEngine, train_and_sync
from reinforge.policy.backends import SamplingEngine, samples_on_gpu
from reinforge.policy.engine_thread import Sampled
from reinforge.policy.models import load_model
from reinforge.policy.sampling import SamplingParams
from reinforge.sim.config import CalibrationSection, SimConfig
from reinforge.sim.profile import Curve, Point, Profile, Sharing, TrainerTimes
from reinforge.train.batching import TrainBatch
from reinforge.train.trainable import is_adapter, load_trainable
from reinforge.train.trainer import Trainer
from reinforge.types import Trajectory

COMPLETION_TOKENS = 64
"""Sampled tokens of each row of a timed trainer step (after its prompt)."""
SHARING_ROWS = 8
"""Rows decoding while a trainer step runs beside them."""
Say = Callable[[str], None]


def calibrate(config: SimConfig, say: Say) -> Profile:
    """Load the model once, then time decode and prefill, trainer steps and syncs, and both
    sides working at once. `say` gets a line as each part starts."""
    return asyncio.run(_calibrate(config, say))


async def _calibrate(config: SimConfig, say: Say) -> Profile:
    say(f"loading {config.model.name}")
    model, tokenizer = load_trainable(config.model.name, config.trainer)
    trainer = Trainer(
        model,
        config.trainer.for_budget(COMPLETION_TOKENS),
        config.optim,
        total_steps=len(config.sim.calibration.train_tokens) + 3,
        reference=_reference(config, model),
    )
    engine = LocalEngine(config, trainer, tokenizer, version=0)
    calibration = config.sim.calibration
    vocab = len(tokenizer)
    try:
        batches = calibration.batches or _powers_of_two(config.engine.max_batch)
        say(f"decode steps at batch {', '.join(map(str, batches))}")
        decode, prefill = await _engine_curves(engine.engine, batches, calibration, vocab)
        say(f"trainer steps of {', '.join(map(str, calibration.train_tokens))} tokens")
        times, sync_s = await _trainer_times(engine, trainer, calibration, vocab)
        say("decoding and training at once")
        sharing = await _sharing(engine, trainer, decode, times, calibration, vocab)
    finally:
        await engine.aclose()
    return Profile(
        model=config.model.name,
        engine=config.model.engine,
        dtype=config.engine.dtype_on(samples_on_gpu(config.model)),
        threads=torch.get_num_threads(),
        decode=decode,
        prefill=prefill,
        trainer=times,
        sync_s=sync_s,
        sharing=sharing,
    )


def _powers_of_two(most: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 <= most:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == most else [*sizes, most]


class _Stamps:
    """When each row got each of its tokens."""

    def __init__(self, rows: int) -> None:
        self.rows: list[list[float]] = [[] for _ in range(rows)]

    def listener(self, row: int) -> Callable[[Sampled], None]:
        def heard(sampled: Sampled) -> None:
            self.rows[row].extend([time.perf_counter()] * len(sampled.token_ids))

        return heard

    def first_token_s(self) -> float:
        return min(row[0] for row in self.rows if row)

    def steps(self) -> list[tuple[int, float, float]]:
        """(batch, start, end) of each decode iteration: from the previous token's first
        listener call to this one's."""
        steps = []
        for k in range(1, max(len(row) for row in self.rows)):
            ends = [row[k] for row in self.rows if len(row) > k]
            start = min(row[k - 1] for row in self.rows if len(row) >= k)
            steps.append((len(ends), start, min(ends)))
        return steps


async def _generate(
    engine: SamplingEngine,
    stamps: _Stamps,
    calibration: CalibrationSection,
    tokens: int,
    vocab: int,
) -> float:
    """A distinct random prompt per row of `stamps`, all at once (one burst, so one
    prefill); returns when they were submitted."""
    rows = len(stamps.rows)
    rng = random.Random(rows)
    submitted = time.perf_counter()
    await asyncio.gather(
        *(
            engine.generate(
                _prompt(rng, calibration.prompt_tokens, vocab),
                SamplingParams(
                    max_tokens=tokens, temperature=1.0, top_p=1.0, stop_loops=False, seed=row
                ),
                stamps.listener(row),
            )
            for row in range(rows)
        )
    )
    return submitted


async def _engine_curves(
    engine: SamplingEngine, batches: list[int], calibration: CalibrationSection, vocab: int
) -> tuple[Curve, Curve]:
    await _generate(engine, _Stamps(2), calibration, 4, vocab)  # warm-up: first calls allocate
    decode: defaultdict[int, list[float]] = defaultdict(list)
    prefill: defaultdict[int, list[float]] = defaultdict(list)
    for _ in range(calibration.rounds):
        by_batch: defaultdict[int, list[float]] = defaultdict(list)
        for rows in batches:
            stamps = _Stamps(rows)
            submitted = await _generate(
                engine, stamps, calibration, calibration.decode_tokens, vocab
            )
            prefill[rows * calibration.prompt_tokens].append(stamps.first_token_s() - submitted)
            for batch, start, end in stamps.steps():
                by_batch[batch].append(end - start)
        # rows that stop early (EOS) leave a few steps at odd batches: keep the well-measured
        for batch, seconds in by_batch.items():
            if len(seconds) >= 3:
                decode[batch].append(statistics.median(seconds))
    return _unloaded(decode), _unloaded(prefill)


def _unloaded(measured: dict[int, list[float]]) -> Curve:
    """The engine's own times from rounds measured under a shared machine's load, which
    only ever adds time: each point's least-loaded round, and no point above one at a
    larger batch (more rows never take less time, so a larger batch's time bounds it)."""
    points = sorted((x, min(seconds)) for x, seconds in measured.items())
    bounded, floor = [], math.inf
    for x, seconds in reversed(points):
        floor = min(floor, seconds)
        bounded.append((x, floor))
    return Curve.of(bounded)


def _prompt(rng: random.Random, tokens: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab) for _ in range(tokens)]


def _batch(rows: int, calibration: CalibrationSection, vocab: int) -> TrainBatch:
    """`rows` sampled-looking trajectories with advantages of both signs."""
    rng = random.Random(rows)
    prompt = calibration.prompt_tokens
    trajectories = [
        Trajectory(
            task_id="calibrate",
            group_id="calibrate",
            index=row,
            token_ids=_prompt(rng, prompt + COMPLETION_TOKENS, vocab),
            loss_mask=[0] * prompt + [1] * COMPLETION_TOKENS,
            logprobs=[-5.0] * COMPLETION_TOKENS,
            policy_versions=[0] * COMPLETION_TOKENS,
        )
        for row in range(rows)
    ]
    return TrainBatch.from_trajectories(trajectories, [(-1.0) ** row for row in range(rows)])


async def _train_step(
    engine: LocalEngine, trainer: Trainer, batch: TrainBatch
) -> tuple[float, float]:
    """(seconds without the sync, seconds of the sync) of one step as the loop takes it."""
    started = time.perf_counter()
    _, synced = await asyncio.to_thread(train_and_sync, engine, trainer, batch)
    return time.perf_counter() - started - synced.seconds, synced.seconds


async def _trainer_times(
    engine: LocalEngine, trainer: Trainer, calibration: CalibrationSection, vocab: int
) -> tuple[TrainerTimes, float]:
    row = calibration.prompt_tokens + COMPLETION_TOKENS
    sizes = [max(round(tokens / row), 1) for tokens in calibration.train_tokens]
    await _train_step(engine, trainer, _batch(sizes[0], calibration, vocab))  # warm-up
    steps: defaultdict[int, list[float]] = defaultdict(list)
    syncs = []
    for rows in sizes * calibration.rounds:
        train_s, sync_s = await _train_step(engine, trainer, _batch(rows, calibration, vocab))
        steps[rows * row].append(train_s)
        syncs.append(sync_s)
    measured = [(tokens, min(seconds)) for tokens, seconds in sorted(steps.items())]
    fixed_s, tokens_per_s = _fit(measured)
    points = [Point(x=x, seconds=s) for x, s in measured]
    times = TrainerTimes(fixed_s=fixed_s, tokens_per_s=tokens_per_s, measured=points)
    return times, statistics.median(syncs)


def _fit(measured: list[tuple[float, float]]) -> tuple[float, float]:
    """`seconds = fixed + tokens / rate` by least squares; through the origin when the
    noise makes the fixed part negative, or when one size was measured."""
    xs, ys = [x for x, _ in measured], [y for _, y in measured]
    if len(set(xs)) > 1:
        slope, fixed = statistics.linear_regression(xs, ys)
        if fixed >= 0 and slope > 0:
            return fixed, 1.0 / slope
    return 0.0, sum(xs) / sum(ys)


async def _sharing(
    engine: LocalEngine,
    trainer: Trainer,
    decode: Curve,
    times: TrainerTimes,
    calibration: CalibrationSection,
    vocab: int,
) -> Sharing:
    """A trainer step of the middle size while `SHARING_ROWS` rows decode: each side's
    time over its time alone (decode steps against the curve at their batch)."""
    row = calibration.prompt_tokens + COMPLETION_TOKENS
    middle = calibration.train_tokens[len(calibration.train_tokens) // 2]
    batch = _batch(max(round(middle / row), 1), calibration, vocab)
    alone_train = times.seconds(float(batch.attention_mask.sum()))
    room = engine.engine.max_context - calibration.prompt_tokens - 1
    tokens = min(int(3 * alone_train / decode(SHARING_ROWS)) + 32, room)
    stamps = _Stamps(SHARING_ROWS)
    generating = asyncio.create_task(_generate(engine.engine, stamps, calibration, tokens, vocab))
    while not generating.done() and not any(len(r) > 2 for r in stamps.rows):
        await asyncio.sleep(0.01)  # until the rows are decoding
    started = time.perf_counter()
    train_s, _ = await _train_step(engine, trainer, batch)
    ended = time.perf_counter()
    await generating
    during = [(e - s) / decode(b) for b, s, e in stamps.steps() if s >= started and e <= ended]
    return Sharing(
        decode=max(statistics.median(during), 1.0) if during else 1.0,
        train=max(train_s / alone_train, 1.0),
    )


def _reference(config: SimConfig, model: PreTrainedModel) -> PreTrainedModel | None:
    """The KL term's frozen model, loaded as the loop loads it: its forward is part of a
    trainer step's time."""
    if not config.trainer.algorithm.loss.needs_reference or is_adapter(model):
        return None
    reference, _ = load_model(config.model.name, "float32")
    return reference.requires_grad_(False)
