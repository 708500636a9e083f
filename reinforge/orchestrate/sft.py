"""The SFT loop: warm-up steps over stored trajectories with the RL trainer and the SFT loss.

The data (which trajectories, rendered how) comes from `reinforge.train.sft`; this module
orders it into batches by seed and epoch, steps the trainer, and records the run the way
an RL run is recorded, so `--resume` continues from the last checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import torch

from reinforge.config import Config
from reinforge.errors import UsageError
from reinforge.orchestrate.cluster import open_cluster, open_trainer
from reinforge.orchestrate.metrics import SftStepMetrics
from reinforge.orchestrate.record import RunRecorder
from reinforge.orchestrate.trackers import check_installed
from reinforge.policy.models import load_tokenizer
from reinforge.train.algorithm import PPOClipLoss, SFTLoss
from reinforge.train.checkpoints import load_progress, resume_from
from reinforge.train.sft import Example, schedule, train_batch


def sft_config(config: Config, examples: int) -> Config:
    """The config as SFT runs it: the SFT loss with the configured aggregation, and
    `run.steps` derived from the data. Raises UsageError on RL-only loss settings."""
    loss = config.trainer.algorithm.loss
    if isinstance(loss, PPOClipLoss) and loss.model_fields_set - {"kind", "aggregation"}:
        raise UsageError(
            "sft trains with the SFT loss: of trainer.algorithm.loss only aggregation applies"
        )
    algorithm = config.trainer.algorithm.model_copy(
        update={"loss": SFTLoss(aggregation=loss.aggregation)}
    )
    steps = len(schedule(examples, config.sft, config.run.seed))
    return config.model_copy(
        update={
            "trainer": config.trainer.model_copy(update={"algorithm": algorithm}),
            "run": config.run.model_copy(update={"steps": steps}),
        }
    )


def train_sft(
    config: Config,
    examples: list[Example],
    on_step: Callable[[SftStepMetrics], None],
    resume: bool = False,
    overwrite: bool = False,
) -> Path:
    """Train `config.sft.epochs` epochs over `examples` (config from `sft_config`), or with
    `resume` what is left of them after the run's last checkpoint (all of them when there
    is none); `overwrite`: start over in a directory that holds a run. Returns the run
    directory."""
    check_installed(config.run)
    run_dir = config.run_dir
    checkpoint = resume_from(run_dir) if resume else None
    start = 0
    if checkpoint is not None:
        state = load_progress(checkpoint)
        if state["examples"] != len(examples):
            raise UsageError(
                f"cannot resume {run_dir}: it trained on {state['examples']} examples, "
                f"the data now gives {len(examples)}"
            )
        start = state["step"]
    torch.manual_seed(config.run.seed)  # LoRA's initial adapters
    steps = schedule(len(examples), config.sft, config.run.seed)
    tokenizer = load_tokenizer(config.model.name)
    with (
        RunRecorder(config, tokenizer, start, resume, overwrite) as recorder,
        open_cluster(config) as cluster,
        closing(open_trainer(config, config.trainer, cluster, checkpoint)) as trainer,
    ):
        for step in range(start, len(steps)):
            epoch, rows = steps[step]
            started = time.perf_counter()
            trained = trainer.step(train_batch([examples[row] for row in rows]))
            seconds = time.perf_counter() - started
            metrics = SftStepMetrics(
                step=step + 1,
                epoch=epoch,
                sequences=len(rows),
                train=trained,
                time_s=seconds,
                tokens_per_s=trained.trained_tokens / seconds,
            )
            recorder.record(step + 1, metrics, trainer, {"examples": len(examples)})
            on_step(metrics)
    return run_dir
