"""The one config tree of a training run: TOML file plus dotted `key=value` overrides.

Every field is documented where it is defined; unknown keys and wrong types are rejected
with one clear message (`UsageError`), never a traceback.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reinforge.errors import UsageError
from reinforge.policy.specs import DEFAULT_MODEL
from reinforge.train.config import AlgorithmConfig
from reinforge.types import Status


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
    name: str = DEFAULT_MODEL
    """smollm2-135m, tiny-random, or a local Hugging Face model folder."""
    sampler_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision the engine samples in; the trainer keeps fp32 weights. bfloat16 samples
    faster but from rounded weights, whose rounding noise outgrows small learning-rate
    updates: on the main job it learned less (benchmarks/README.md)."""


class EnvConfig(_Section):
    name: str = "arithmetic"
    """Built-in or installed name, path/to/env.py, or module:function."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's loader."""


class RolloutConfig(_Section):
    tasks_per_step: int = Field(8, ge=1)
    rollouts_per_task: int = Field(4, ge=1)
    """Group size: advantages are relative within a task's rollouts."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    """Per-turn token limit; None keeps the environment's."""
    concurrency: int = Field(64, ge=1)
    timeout_s: float = Field(600.0, gt=0.0)


class OptimConfig(_Section):
    lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or cosine decay to 0 at the last step."""
    grad_clip: float = Field(1.0, gt=0.0)


class LoRAConfig(_Section):
    """Low-rank adapters through PEFT: only the adapters train, the base stays frozen."""

    rank: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0.0)
    """The update is scaled by alpha / rank."""
    target_modules: str | list[str] = "all-linear"
    """PEFT's module selection: "all-linear" (every linear layer but the LM head) or names."""


class TrainerConfig(_Section):
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    micro_batch_tokens: int = Field(1024, ge=1)
    """Token budget of one forward/backward (rows x longest row); gradients accumulate.
    Activations grow with it (~1.4 MB per token for SmolLM2-135M in fp32); on a CPU 1024
    was both leaner and faster than 4096 (benchmarks/train_step.py)."""
    precision: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: the decoder's matmuls run in bf16 under autocast (AMX on recent x86 CPUs,
    tensor cores on GPUs); weights, gradients, optimizer state, the LM head and the
    log-softmax stay float32."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward: less memory, more compute."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters instead of every weight; None: full fine-tuning."""
    truncated: Literal["keep", "mask", "penalize"] = "keep"
    """A completion cut off by a token or turn limit: keep (train on it with its reward),
    mask (it still counts in its group's baseline but is left out of the loss, DAPO's
    overlong filtering) or penalize (its reward becomes `truncation_penalty`)."""
    truncation_penalty: float = 0.0
    """The reward of a truncated completion when `truncated = "penalize"`."""


class RunConfig(_Section):
    name: str = "run"
    """The run directory is `<dir>/<name>`."""
    dir: Path = Path("runs")
    steps: int = Field(20, ge=1)
    seed: int = 0
    """Seeds task order and sampling."""
    checkpoint_every: int = Field(10, ge=1)


class SFTConfig(_Section):
    """`reinforge sft`: supervised warm-up on stored trajectories. The model, optimizer,
    trainer and run sections apply as in RL; `run.steps` is derived from the data."""

    data: list[Path] = Field(default_factory=list)
    """Trajectory JSONL files, or folders: a `reinforge eval` output (trajectories.jsonl)
    or a training run (trajectories/*.jsonl)."""
    min_reward: float | None = None
    """Keep only trajectories whose reward is at least this; None keeps every reward."""
    statuses: list[Status] = Field(default_factory=lambda: [Status.OK])
    """Keep only trajectories that ended so; a truncated one teaches an unfinished answer."""
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    """Trajectories per optimizer step."""

    @field_validator("data", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        """`sft.data=runs/eval-arith` on the command line is one path, not a list."""
        return [value] if isinstance(value, str | Path) else value


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)

    @property
    def run_dir(self) -> Path:
        return self.run.dir / self.run.name


def load_config(path: Path | None, overrides: list[str]) -> Config:
    """Read the TOML file (if any), apply `a.b.c=value` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise UsageError(f"cannot read config {path}: {error.strerror}") from error
        except tomllib.TOMLDecodeError as error:
            raise UsageError(f"{path} is not valid TOML: {error}") from error
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise UsageError(f"overrides take KEY=VALUE, got {override!r}")
        _set(data, key.split("."), _parse_value(value))
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"config {where}: {first['msg']}") from error


def load_command_config(first: Path | None, overrides: list[str]) -> Config:
    """`reinforge train|sft [CONFIG.toml] [KEY=VALUE ...]`: argparse cannot tell an optional
    file from the first override, so a first argument holding "=" is an override."""
    if first is not None and "=" in str(first):
        return load_config(None, [str(first), *overrides])
    return load_config(first, overrides)


def _parse_value(text: str) -> Any:
    """TOML's value syntax (numbers, booleans, quoted strings, arrays), else plain text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


def _set(data: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        child = data.setdefault(key, {})
        if not isinstance(child, dict):
            raise UsageError(f"cannot set {'.'.join(keys)}: {key} is not a section")
        data = child
    data[keys[-1]] = value
