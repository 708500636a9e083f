"""The SFT loop: warm-up steps over stored trajectories with the RL trainer and the SFT loss.

The data (which trajectories, rendered how) comes from `reinforge.train.sft`; this module
orders it into batches by seed and epoch, steps the trainer, and records the run the way
an RL run is recorded, so `--resume` continues from the last checkpoint.

Ctrl-C lets the step in flight finish and be recorded (an optimizer step cut halfway would
leave weights no checkpoint describes), checkpoints it and ends with `Interrupted`; a
second Ctrl-C stops at once, with only the checkpoints written so far.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from types import FrameType

import torch

from reinforge.config import Config
from reinforge.errors import Interrupted, UsageError
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
        _finishing_steps() as interrupted,
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
            if interrupted.is_set():
                saved = recorder.save_last(trainer)
                raise Interrupted(f"step {step + 1} finished, as it was training; {saved}")
    return run_dir


@contextmanager
def _finishing_steps() -> Iterator[threading.Event]:
    """An event that the first Ctrl-C sets instead of raising, for the loop to stop at once
    the step is recorded; a second raises KeyboardInterrupt. Outside the main thread, where
    no signal arrives, the event is never set."""
    interrupted = threading.Event()

    def note(signum: int, frame: FrameType | None) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
