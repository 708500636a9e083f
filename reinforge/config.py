"""The config trees of the commands, assembled from the sections each part owns, and the
one way to load them: a TOML file plus dotted `key=value` overrides.

`reinforge train` and `reinforge sft` read `Config`, `reinforge eval` reads `EvalConfig`,
`reinforge serve` reads `ServeConfig`; a section that appears in several trees is the same
class with the same defaults. Unknown keys and wrong types are one clear message
(`UsageError`), never a traceback.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import Field, ValidationError, model_validator

from reinforge.envs.config import EnvConfig
from reinforge.errors import ConfigError, UsageError, first_problem
from reinforge.orchestrate.config import ClusterConfig, LoopConfig, RunConfig
from reinforge.policy.config import EngineConfig, ModelConfig, ServerConfig
from reinforge.rollout.config import RolloutConfig, TrainRolloutConfig
from reinforge.train.config import OptimConfig, SFTConfig, TrainerConfig
from reinforge.train.distill import DistillConfig
from reinforge.types import Section


class Config(Section):
    """`reinforge train` and `reinforge sft`."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: TrainRolloutConfig = Field(default_factory=TrainRolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    distill: DistillConfig | None = None
    """On-policy distillation: teachers score the student's sampled tokens, and the
    negative reverse KL joins each token's advantage; None: off. docs/recipes.md."""

    @property
    def run_dir(self) -> Path:
        return self.run.dir / self.run.name

    @model_validator(mode="after")
    def _one_source_of_engines(self) -> Self:
        if self.rollout.engines > 1 and self.loop.engine_url is not None:
            raise ValueError(
                "loop.engine_url names one running engine and rollout.engines > 1 starts the "
                "run's own: set one or the other"
            )
        return self

    @model_validator(mode="after")
    def _sharded_ranks_place_themselves(self) -> Self:
        if self.trainer.world_size > 1 and self.model.device != "auto":
            raise ValueError(
                f"model.device is {self.model.device}: a sharded trainer (trainer.world_size "
                f"{self.trainer.world_size}) puts each rank on its own GPU, or the CPU; leave "
                "it at auto"
            )
        return self


class EvalSection(Section):
    tasks: int = Field(16, ge=1)
    """Tasks drawn from the environment."""
    rollouts_per_task: int = Field(1, ge=1)
    """Samples per task; pass@k is reported for this k."""
    seed: int = 0
    """Seeds which tasks are drawn and the sampling."""
    out: Path | None = None
    """Output folder; None: runs/eval-ENV-TIME."""
    max_error_rate: float = Field(0.1, ge=0.0, le=1.0)
    """Fraction of rollouts that may error or time out; past it eval exits with code 3
    (after writing everything), so a broken environment cannot pass for a weak model."""
    agent: Literal["model", "oracle", "nop"] = "model"
    """Who acts: the model, or (Harbor tasks only, no model loaded) `oracle`, which runs
    each task's solution/solve.sh, or `nop`, which does nothing. All are graded alike, so
    a task author sees oracle score 1 and nop 0."""


class EvalConfig(Section):
    """`reinforge eval`."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    eval: EvalSection = Field(default_factory=EvalSection)


class ServeConfig(Section):
    """`reinforge serve`."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)


Root = TypeVar("Root", bound=Section)


def load_config(
    root: type[Root],
    path: Path | None,
    overrides: list[str],
    values: dict[str, Any] | None = None,
) -> Root:
    """Read the TOML file (if any), set `values` (dotted key: value, as a command's flags
    give them), apply `a.b.c=value` overrides in order, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise UsageError(f"cannot read config {path}: {error.strerror}") from error
        except tomllib.TOMLDecodeError as error:
            raise UsageError(f"{path} is not valid TOML: {error}") from error
    for key, value in (values or {}).items():
        _set(data, key.split("."), value)
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise UsageError(f"overrides take KEY=VALUE, got {override!r}")
        _set(data, key.split("."), parse_value(value))
    try:
        return root.model_validate(data)
    except ValidationError as error:
        raise ConfigError(*first_problem(error)) from error


def parse_value(text: str) -> Any:
    """TOML's value syntax (numbers, booleans, quoted strings, arrays), else JSON, else the
    plain text."""
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
