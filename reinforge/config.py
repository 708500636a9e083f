"""The config trees of the commands, assembled from the sections each part owns, and the
one way to load them: a TOML file plus dotted `key=value` overrides.

`reinforge train` and `reinforge sft` read `Config`, `reinforge eval` reads `EvalConfig`,
`reinforge serve` reads `ServeConfig`; a section that appears in several trees is the same
class with the same defaults. Unknown keys and wrong types are one clear message
(`UsageError`), never a traceback, and so is a key of its tree that a command does not read
(`UNREAD`) when the command line sets it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import Field, ValidationError, model_validator

from reinforge.envs.recipes.config import RecipesConfig
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
    env: RecipesConfig = Field(default_factory=RecipesConfig)
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
    env: RecipesConfig = Field(default_factory=RecipesConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    eval: EvalSection = Field(default_factory=EvalSection)


class ServeConfig(Section):
    """`reinforge serve`."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)


Root = TypeVar("Root", bound=Section)

_SAMPLES_NOTHING = "not read by sft, which samples nothing"
_RL_ONLY = "not read by sft, which trains on no rewards"
_EVAL_ONLY = "read by `reinforge eval` only, for a model served at a URL"
_CALIBRATED = "not read by sim predict: the profile measured it (give it to sim calibrate)"

UNREAD: dict[str, dict[str, str | None]] = {
    "train": {"sft": "read by `reinforge sft` only", "model.served_name": _EVAL_ONLY},
    "sft": {
        "run.steps": "sft takes its steps from the data: set sft.epochs or sft.batch_size",
        "model.engine": _SAMPLES_NOTHING,
        "model.served_name": _SAMPLES_NOTHING,
        "engine": _SAMPLES_NOTHING,
        "env": _SAMPLES_NOTHING,
        "rollout": _SAMPLES_NOTHING,
        "loop": _SAMPLES_NOTHING,
        "distill": _SAMPLES_NOTHING,
        "cluster.engine": _SAMPLES_NOTHING,
        "trainer.algorithm.advantage": _RL_ONLY,
        "trainer.truncated": _RL_ONLY,
        "trainer.uniform_groups": _RL_ONLY,
    },
    "serve": {"model.served_name": _EVAL_ONLY},
    "sim calibrate": {
        "": "not read by sim calibrate",
        "model": None,
        "model.served_name": _EVAL_ONLY,
        "engine": None,
        "trainer": None,
        "optim": None,
        "loop.mode": None,
        "rollout.sampling": None,
        "sim.profile": None,
        "sim.calibration": None,
    },
    "sim predict": {
        "": "not read by sim predict",
        "model": _CALIBRATED,
        "model.name": None,
        "model.served_name": _EVAL_ONLY,
        "model.engine": None,
        "engine": _CALIBRATED,
        "engine.dtype": None,
        "engine.max_batch": None,
        "engine.admit_group": None,
        "engine.admit_wait_steps": None,
        "trainer": _CALIBRATED,
        "trainer.truncated": None,
        "optim": _CALIBRATED,
        "env.max_tokens_per_turn": None,
        "rollout.tasks_per_step": None,
        "rollout.rollouts_per_task": None,
        "rollout.concurrency": None,
        "loop.mode": "sim predict simulates the modes of sim.modes (--mode)",
        "loop.max_staleness": None,
        "loop.uniform_redraws": None,
        "sim": None,
        "sim.calibration": "read by sim calibrate only",
    },
}
"""Keys of its tree that a command does not read, by dotted prefix, each with what to tell
a user who sets one. The longest listed prefix of a key decides: a reason means unread,
None read ("" is every key); a key of no listed prefix is read. The command line refuses an
unread key (an override or a flag) rather than ignore it; a config file may hold one, so
that one file serves train, sft and sim."""


def unread(command: str, key: str) -> str | None:
    """Why `command` (`UNREAD`'s name for it) does not read the dotted `key`; None when it
    does."""
    rules = UNREAD.get(command, {})
    parts = key.split(".")
    for end in range(len(parts), -1, -1):
        prefix = ".".join(parts[:end])
        if prefix in rules:
            return rules[prefix]
    return None


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
