"""Checkpoints: a complete Hugging Face model plus what resuming needs, written atomically;
and the run directory a resumed run continues.

`<run>/checkpoints/step_NNNNN/` holds the model (loadable by transformers and vLLM, LoRA
merged, see `trainable.save_model`), the tokenizer, `optimizer/` (the optimizer state as a
torch.distributed.checkpoint: one file per rank that wrote it, loadable on any world size)
and `trainer_state.pt` (step, policy version, schedule and RNG state). RL and SFT runs
write the same layout.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from transformers import PreTrainedTokenizerBase

from reinforge.errors import UsageError

TRAINER_STATE = "trainer_state.pt"
OPTIMIZER = "optimizer"
RUN_ENTRIES = ("config.json", "metrics.jsonl", "trajectories", "checkpoints", "engines")
"""What a run writes in its directory (`engines`: the logs of its own engine processes):
what `--overwrite` deletes, and nothing else there."""

log = logging.getLogger(__name__)


def write_checkpoint(
    run_dir: Path,
    steps_done: int,
    save_model: Callable[[Path], None],
    save_optimizer: Callable[[Path], None],
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    keep: int | None = None,
) -> Path:
    """`run_dir/checkpoints/step_NNNNN/`: the model in Hugging Face format, as `save_model`
    writes it into a folder (a trainer's `save_model`), the optimizer state in `optimizer/`
    as `save_optimizer` writes it, and `state` (the rest of what resuming needs) as
    trainer_state.pt. Written aside and renamed, so a kill mid-save never leaves a half
    checkpoint. Then, with `keep`, all but the newest `keep` checkpoints are deleted: only
    once the new one is complete, so a run always has one to resume from."""
    final = run_dir / "checkpoints" / f"step_{steps_done:05d}"
    staging = final.with_name(f".{final.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_model(staging)
    save_optimizer(staging / OPTIMIZER)
    _check_shards(staging / OPTIMIZER)
    tokenizer.save_pretrained(staging)
    torch.save(state, staging / TRAINER_STATE)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    if keep is not None:
        for old in sorted(final.parent.glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    return final


def _check_shards(folder: Path) -> None:
    """Every file of a sharded checkpoint, as its metadata lists them, is in `folder`: ranks
    on other machines write their shards to their own disks unless `folder` is on a file
    system they share with this one."""
    metadata = FileSystemReader(folder).read_metadata()
    files = {item.relative_path for item in (metadata.storage_data or {}).values()}
    missing = sorted(name for name in files if not (folder / name).exists())
    if missing:
        raise UsageError(
            f"{folder}: the optimizer shards {', '.join(missing)} were written elsewhere: a "
            "sharded trainer's ranks on other machines need the run directory on a file "
            "system they share (run.dir)"
        )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, if any."""
    found = sorted((run_dir / "checkpoints").glob(f"step_*/{TRAINER_STATE}"))
    return found[-1].parent if found else None


def resume_from(run_dir: Path) -> Path | None:
    """The checkpoint a resumed run continues from; None, said in one line, when it has
    none: a run stopped before its first checkpoint starts again from step 0 rather than
    being stuck, neither resumable nor restartable."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        log.warning("no checkpoint in %s: the run starts from step 0", run_dir)
    elif not (checkpoint / OPTIMIZER).is_dir():
        raise UsageError(
            f"{checkpoint} has no {OPTIMIZER}/: an earlier reinforge wrote it, keeping the "
            f"optimizer state in {TRAINER_STATE}; resume it with that version, or start a "
            f"new run from its weights (model.name={checkpoint})"
        )
    return checkpoint


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False)


def load_model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's model weights, from its safetensors files (one, or the shards of a
    large model), by name."""
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(path))
    return weights


def load_progress(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer state for its scalars (step, policy version, the loop's
    position), memory-mapped."""
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False, mmap=True)


def open_run(
    run_dir: Path, config_json: str, start_step: int, resume: bool, overwrite: bool
) -> TextIO:
    """`run_dir` with config.json; returns metrics.jsonl open for appending. A fresh run
    never takes over a directory that holds a run, unless told to `overwrite` it (what the
    old run wrote is deleted). A resumed one (`resume`, from `start_step`) drops what the
    steps after its checkpoint wrote, since they run again: their metrics lines and
    trajectory files, either of which the step in flight may have left cut short."""
    metrics = run_dir / "metrics.jsonl"
    if not resume and metrics.exists() and metrics.stat().st_size > 0:
        if not overwrite:
            raise UsageError(
                f"{run_dir} already holds a run: pass --resume to continue it, --overwrite "
                "to delete it and start over, or choose another run.name"
            )
        for entry in (run_dir / name for name in RUN_ENTRIES):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config_json + "\n")
    if resume:
        if metrics.exists():  # rewritten aside and renamed: a kill now loses no line
            kept = [line for line, step in _metrics_steps(metrics) if step <= start_step]
            staging = metrics.with_name(f".{metrics.name}.partial")
            staging.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
            staging.replace(metrics)
        for path in (run_dir / "trajectories").glob("step_*.jsonl"):
            if int(path.stem.removeprefix("step_")) > start_step:
                path.unlink()
    return metrics.open("a", encoding="utf-8")


def _metrics_steps(metrics: Path) -> list[tuple[str, int]]:
    """Each line of metrics.jsonl with its step. A last line cut short (a kill or a full
    disk mid-write) is dropped, said in one line: its step runs again anyway. A damaged
    line before it is a usage error, as what the run did there is unknown."""
    lines = metrics.read_text("utf-8", "replace").splitlines()
    steps: list[tuple[str, int]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            steps.append((line, json.loads(line)["step"]))
        except json.JSONDecodeError:
            if number < len(lines):
                raise UsageError(
                    f"{metrics}: line {number} is not a metrics record; remove it to resume"
                ) from None
            log.warning("%s: dropped its last line, cut short mid-write", metrics)
    return steps
