"""Checkpoints: a complete Hugging Face model plus what resuming needs, written atomically;
and the run directory a resumed run continues.

`<run>/checkpoints/step_NNNNN/` holds the model (loadable by transformers and vLLM, LoRA
merged, see `trainable.save_model`), the tokenizer, and `trainer_state.pt` (step, policy
version, optimizer, schedule and RNG state). RL and SFT runs write the same layout.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
from transformers import PreTrainedTokenizerBase

from reinforge.errors import UsageError

TRAINER_STATE = "trainer_state.pt"


def write_checkpoint(
    run_dir: Path,
    steps_done: int,
    save_model: Callable[[Path], None],
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    keep: int | None = None,
) -> Path:
    """`run_dir/checkpoints/step_NNNNN/`: the model in Hugging Face format, as `save_model`
    writes it into a folder (a trainer's `save_model`), and `state` (what resuming needs)
    as trainer_state.pt. Written aside and renamed, so a kill mid-save never leaves a half
    checkpoint. Then, with `keep`, all but the newest `keep` checkpoints are deleted: only
    once the new one is complete, so a run always has one to resume from."""
    final = run_dir / "checkpoints" / f"step_{steps_done:05d}"
    staging = final.with_name(f".{final.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_model(staging)
    tokenizer.save_pretrained(staging)
    torch.save(state, staging / TRAINER_STATE)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    if keep is not None:
        for old in sorted(final.parent.glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, if any."""
    found = sorted((run_dir / "checkpoints").glob(f"step_*/{TRAINER_STATE}"))
    return found[-1].parent if found else None


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False)


def load_progress(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer state for its scalars (step, policy version, the loop's
    position), memory-mapped: the optimizer's tensors, gigabytes that the trainer reads
    for itself (on every rank), are never read here."""
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False, mmap=True)


def open_run(run_dir: Path, config_json: str, start_step: int) -> TextIO:
    """`run_dir` with config.json; returns metrics.jsonl open for appending. A fresh run
    never reuses a directory that holds a run; a resumed one drops the metrics of the steps
    after its checkpoint, which run again."""
    metrics = run_dir / "metrics.jsonl"
    if start_step == 0 and metrics.exists() and metrics.stat().st_size > 0:
        raise UsageError(
            f"{run_dir} already holds a run: pass --resume to continue it, "
            "or choose another run.name"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config_json + "\n")
    if metrics.exists():
        kept = [
            line
            for line in metrics.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["step"] <= start_step
        ]
        metrics.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    return metrics.open("a", encoding="utf-8")
