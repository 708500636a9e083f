"""The synchronous loop: rollout -> reward -> advantage -> loss -> step -> weight sync.

Every step samples with the current weights, trains on exactly those tokens, and copies
the new weights into the engine before the next step: on-policy. Recording (metrics,
trajectories, checkpoints) lives in `RunRecorder`.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from reinforge.config import Config
from reinforge.envs.registry import load_configured
from reinforge.errors import UsageError
from reinforge.orchestrate.record import RunRecorder, step_metrics
from reinforge.policy.client import PolicyClient
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize
from reinforge.train.checkpoints import latest_checkpoint, load_trainer_state
from reinforge.train.trainable import full_weights, is_adapter, load_trainable
from reinforge.train.trainer import Trainer, select_for_training


async def train(
    config: Config, on_step: Callable[[dict[str, Any]], None], resume: bool = False
) -> Path:
    """Run `config.run.steps` steps, or what is left of them after the last checkpoint;
    returns the run directory."""
    env = load_configured(config.env)
    checkpoint = latest_checkpoint(config.run_dir) if resume else None
    if resume and checkpoint is None:
        raise UsageError(f"nothing to resume: no checkpoint in {config.run_dir}")
    model, tokenizer = load_trainable(config.model.name, config.trainer, checkpoint)
    # An fp32 sampler runs the trainer's own model: no second copy, and a weight sync is
    # only a new version number. A bf16 sampler keeps its own copy, refreshed each step.
    shared = config.engine.dtype == "float32"
    sampler = model if shared else load_model(config.model.name, config.engine.dtype)[0]
    engine = Engine(sampler, tokenizer, config.model.name, config.engine)
    if not shared:
        with full_weights(model) as weights:
            engine.update_weights(weights)  # a checkpoint's or adapter-merged weights
    engine.version = 0
    client = PolicyClient.for_engine(engine, config.rollout.sampling)
    trainer = Trainer(
        model,
        config.trainer.for_budget(env.harness.max_sampled_tokens),
        config.optim,
        total_steps=config.run.steps,
        reference=_reference(config, model),
    )
    start_step = 0
    if checkpoint is not None:
        state = load_trainer_state(checkpoint)
        trainer.load_state_dict(state)
        start_step = state["step"]
        engine.version = state["policy_version"]
    recorder = RunRecorder(config, tokenizer, start_step)
    try:
        for step in range(start_step, config.run.steps):
            started = time.perf_counter()
            # 1. rollout: this step's tasks, k rollouts each, with the current weights
            seed = task_seed(config.run.seed, step)
            tasks = env.tasks(config.rollout.tasks_per_step, seed=seed)
            groups = await generate_groups(
                env, tasks, client, config.rollout, config.rollout.rollouts_per_task, seed
            )
            rollout_s = time.perf_counter() - started
            # 2. reward is in the trajectories; 3. advantages within each group
            selection = select_for_training(groups, config.trainer)
            # 4-5. loss and optimizer step (nothing to learn if every group was uniform)
            started = time.perf_counter()
            trained = trainer.step(selection.batch()) if selection.trajectories else {}
            train_s = time.perf_counter() - started
            # 6. weight sync: the next step samples from the new weights
            started = time.perf_counter()
            if trained and shared:
                engine.update_weights({})  # same tensors, changed in place
            elif trained:
                with full_weights(model) as weights:
                    engine.update_weights(weights)
            sync_s = time.perf_counter() - started
            summary = summarize(groups, env.rubric.pass_threshold, rollout_s)
            metrics = step_metrics(
                step, summary, selection, trained, rollout_s, train_s, sync_s, engine.version
            )
            recorder.record(step, metrics, trainer, {"policy_version": engine.version}, groups)
            on_step(metrics)
    finally:
        await client.close()
        engine.close()
        await env.aclose()
        recorder.close()
    return recorder.directory


def _reference(config: Config, model: PreTrainedModel) -> PreTrainedModel | None:
    """The frozen start point of the KL term: the configured model, not a resumed checkpoint.
    A LoRA model needs none (its base is the reference)."""
    if not config.trainer.algorithm.loss.needs_reference or is_adapter(model):
        return None
    reference, _ = load_model(config.model.name, "float32")
    return reference.requires_grad_(False)


def task_seed(seed: int, step: int) -> int:
    """The data order: the same run seed gives the same tasks at the same step."""
    return zlib.crc32(f"{seed}/{step}".encode())
