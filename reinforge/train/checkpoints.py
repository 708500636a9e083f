"""Checkpoints: a complete Hugging Face model plus what resuming needs, written atomically.

`<run>/checkpoints/step_NNNNN/` holds the model (loadable by transformers and vLLM, LoRA
merged, see `trainable.save_model`), the tokenizer, and `trainer_state.pt` (step, policy
version, optimizer, schedule and RNG state). RL and SFT runs write the same layout.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.train.trainable import save_model

TRAINER_STATE = "trainer_state.pt"


def write_checkpoint(
    run_dir: Path,
    steps_done: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
) -> Path:
    """`run_dir/checkpoints/step_NNNNN/`: the model in Hugging Face format and `state` (what
    resuming needs) as trainer_state.pt. Written aside and renamed, so a kill mid-save never
    leaves a half checkpoint."""
    final = run_dir / "checkpoints" / f"step_{steps_done:05d}"
    staging = final.with_name(f".{final.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    save_model(model, staging)
    tokenizer.save_pretrained(staging)
    torch.save(state, staging / TRAINER_STATE)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, if any."""
    found = sorted((run_dir / "checkpoints").glob(f"step_*/{TRAINER_STATE}"))
    return found[-1].parent if found else None


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False)
