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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from reinforge.envs.recipes.config import RecipesConfig
from reinforge.errors import ConfigError, UsageError, first_problem
from reinforge.orchestrate.config import (
    ClusterConfig,
    EnginesConfig,
    InProcessEngine,
    LoopConfig,
    RunConfig,
    ServedEngine,
    SpawnedEngines,
    SyncLoop,
)
from reinforge.policy.config import EngineConfig, ModelConfig, ServerConfig
from reinforge.policy.specs import is_url
from reinforge.rollout.config import RolloutConfig, TrainRolloutConfig
from reinforge.train.config import OptimConfig, SFTConfig, TrainerConfig
from reinforge.train.distill import DistillConfig
from reinforge.types import Section, sections_of, variant_tag


class Config(Section):
    """`reinforge train` and `reinforge sft`."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    env: RecipesConfig = Field(default_factory=RecipesConfig)
    rollout: TrainRolloutConfig = Field(default_factory=TrainRolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    loop: LoopConfig = Field(default_factory=SyncLoop)
    """How rollouts and training interleave (`mode`: sync, async or partial). In every mode
    a token trained at trainer version V was sampled by version V - max_staleness or later
    (by V itself in sync mode)."""
    engines: EnginesConfig = Field(default_factory=InProcessEngine)
    """Where the policy samples (`kind`: in_process, served or spawned). A sharded trainer
    (`trainer.world_size` > 1) holds its weights in its ranks, not in the run's process:
    for one the default is one spawned engine, and in_process is refused."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    distill: DistillConfig | None = None
    """On-policy distillation: teachers score the student's sampled tokens, and the
    negative reverse KL joins each token's advantage; None: off. docs/recipes.md."""

    @property
    def run_dir(self) -> Path:
        return self.run.dir / self.run.name

    @model_validator(mode="after")
    def _sharded_trainers_sample_elsewhere(self) -> Self:
        if self.trainer.world_size == 1 or not isinstance(self.engines, InProcessEngine):
            return self
        if "engines" in self.model_fields_set:
            raise ValueError(
                f'engines.kind is "in_process": a sharded trainer (trainer.world_size '
                f"{self.trainer.world_size}) holds its weights in its ranks, not in the run's "
                'process; use engines.kind = "spawned" (its default) or "served"'
            )
        self.engines = SpawnedEngines()
        return self

    @model_validator(mode="after")
    def _transports_fit_the_cluster(self) -> Self:
        engines = self.engines
        if isinstance(engines, SpawnedEngines) and engines.weight_sync.kind == "object_store":
            if self.cluster.backend != "ray":
                raise ValueError(
                    'engines.weight_sync is "object_store", Ray\'s: it needs '
                    'cluster.backend = "ray"'
                )
        return self

    @model_validator(mode="after")
    def _custom_resources_are_rays(self) -> Self:
        asked = {"cluster.rank.custom": self.cluster.rank.custom}
        if isinstance(self.engines, SpawnedEngines):
            asked["engines.resources.custom"] = self.engines.resources.custom
        for key, custom in asked.items():
            if custom and self.cluster.backend != "ray":
                raise ValueError(
                    f"{key} asks for Ray's custom resources {custom}: it needs "
                    'cluster.backend = "ray"'
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
_NO_MODEL = "not read: a scripted agent (eval.agent oracle or nop) loads no model"
_SERVED_AT_URL = "not read for a model served at a URL, which runs with its server's settings"
_URL_ONLY = "read for a model served at a URL only (--model http://.../v1)"
_SERVER_SAMPLES = 'not read with engines.kind = "served": the server samples with its settings'
_BUILTIN_ENGINE = 'not read by the built-in engine, only by model.engine = "vllm"'
_VLLM_ENGINE = 'not read by vLLM, which admits requests itself, only by model.engine = "builtin"'
_RAY_ONLY = "not read by the local backend, whose processes share this machine, only by Ray's"
_SHARDED_ONLY = (
    "not read by a trainer of one process, only by a sharded one (trainer.world_size > 1)"
)

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
        "engines": _SAMPLES_NOTHING,
        "trainer.algorithm.advantage": _RL_ONLY,
        "trainer.truncated": _RL_ONLY,
        "trainer.uniform_groups": _RL_ONLY,
    },
    "train, a served engine (teachers at URLs only)": {
        "model.engine": _SERVER_SAMPLES,
        "engine": _SERVER_SAMPLES,
    },
    "eval, a model loaded here": {"model.served_name": _URL_ONLY},
    "eval, a model served at a URL": {
        "model": _SERVED_AT_URL,
        "model.name": None,
        "model.served_name": None,
        "engine": _SERVED_AT_URL,
    },
    "eval, a scripted agent": {"model": _NO_MODEL, "engine": _NO_MODEL},
    "serve": {"model.served_name": _EVAL_ONLY},
    "any command, the local backend": {
        "cluster.address": _RAY_ONLY,
        "cluster.rank": _RAY_ONLY,
        "engines.resources": _RAY_ONLY,
    },
    "any command, a trainer of one process": {
        "cluster.rank": _SHARDED_ONLY,
        "trainer.collective_timeout_s": _SHARDED_ONLY,
    },
    "any command, the built-in engine": {"engine.vllm": _BUILTIN_ENGINE},
    "any command, vLLM": {"engine.admit": _VLLM_ENGINE, "engine.kv_memory_fraction": _VLLM_ENGINE},
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
        "engine.admit": None,
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
that one file serves train, sft and sim. "COMMAND, WAY" lists what a command does not read
when run one way, besides COMMAND's own, and "any command, WAY" what no command run that
way reads (`readers` names the ways of a command's config)."""


MOVED: dict[str, tuple[str, str]] = {
    "loop.engine_url": ("engines.url", 'engines.kind = "served"'),
    "loop.engine_token": ("engines.token", 'engines.kind = "served"'),
    "rollout.engines": ("engines.count", 'engines.kind = "spawned"'),
    "rollout.engine_restarts": ("engines.restarts", 'engines.kind = "spawned"'),
    "cluster.engine": ("engines.resources", 'engines.kind = "spawned"'),
    "trainer.truncation_penalty": ("trainer.truncated.reward", 'kind = "penalize"'),
    "engine.admit_group": ("engine.admit.size", 'kind = "grouped"'),
    "engine.admit_wait_steps": ("engine.admit.wait_steps", 'kind = "grouped"'),
}
"""Keys that moved, each with its new key and the variant that holds it: a config that
sets one is refused in one line naming the new key."""


def readers(command: str, config: Section) -> list[str]:
    """The names in `UNREAD` of `command` running `config`: the command's own, then the
    way it runs (an eval of a model served at a URL loads no engine; a trainer of one
    process on the local backend asks for no resources) and the engine it loads, if it
    loads one."""
    names = [command]
    loads_engine = command in ("train", "serve", "sim calibrate")
    if isinstance(config, EvalConfig):
        if config.eval.agent != "model":
            names.append("eval, a scripted agent")
        elif is_url(config.model.name):
            names.append("eval, a model served at a URL")
        else:
            names.append("eval, a model loaded here")
            loads_engine = True
    if command in ("train", "sft") and isinstance(config, Config):
        if config.cluster.backend == "local":
            names.append("any command, the local backend")
        if config.trainer.world_size == 1:
            names.append("any command, a trainer of one process")
    if command == "train" and isinstance(config, Config):
        teachers = config.distill.teachers if config.distill is not None else []
        loads_teachers = any(not is_url(teacher.model) for teacher in teachers)
        if isinstance(config.engines, ServedEngine) and not loads_teachers:
            names.append("train, a served engine (teachers at URLs only)")
            loads_engine = False
    model = getattr(config, "model", None)  # the trees of the commands that load one have it
    if loads_engine and isinstance(model, ModelConfig):
        builtin = model.engine == "builtin"
        names.append("any command, the built-in engine" if builtin else "any command, vLLM")
    return names


def unread(names: Sequence[str], key: str) -> str | None:
    """Why the command of `names` (`readers`) does not read the dotted `key`; None when it
    does."""
    rules: dict[str, str | None] = {}
    for name in names:
        rules |= UNREAD.get(name, {})
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
    for old, (new, variant) in MOVED.items():
        if new.split(".")[0] in root.model_fields and _holds(data, old.split(".")):
            raise ConfigError(old, f"moved to {new} (with {variant})")
    try:
        return root.model_validate(data)
    except ValidationError as error:
        raise ConfigError(*_problem(root, error)) from error


def _holds(data: dict[str, Any], keys: list[str]) -> bool:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def _problem(root: type[BaseModel], error: ValidationError) -> tuple[str, str]:
    """`first_problem`, with the key as a config file writes it: pydantic puts a variant's
    tag in the path (`loop.sync.max_staleness`), where no file has it. A key of other
    variants says which hold it, and an unknown tag which tags there are."""
    first = error.errors()[0]
    _, problem = first_problem(error)
    loc = [str(part) for part in first["loc"]]
    keys: list[str] = []
    model: type[BaseModel] | None = root
    variants: list[type[BaseModel]] = []  # those `model` was chosen from
    while loc:
        part = loc.pop(0)
        field = None if model is None else model.model_fields.get(part)
        if field is None:  # a key unknown here, or past the classes (a dict's, a list's)
            if model in variants and first["type"] == "extra_forbidden" and not loc:
                problem = _elsewhere(part, _tag(model), variants, ".".join(keys))
            keys += [part, *loc]
            break
        keys.append(part)
        choices = sections_of(field.annotation)
        model, variants = (choices[0] if len(choices) == 1 else None), []
        if len(choices) > 1 and loc:  # the tag pydantic adds to the path
            tag = loc.pop(0)
            model = next((c for c in choices if _tag(c)[1] == tag), None)
            variants = choices
        elif len(choices) > 1 and first["type"] == "union_tag_invalid":
            keys.append(_tag(choices[0])[0])
            context = first.get("ctx", {})
            problem = f"{context.get('tag')!r} is none of {context.get('expected_tags')}"
    return ".".join(keys), problem


def _tag(variant: type[BaseModel]) -> tuple[str, str]:
    return variant_tag(variant) or ("", "")


def _elsewhere(key: str, tag: tuple[str, str], variants: list[type[BaseModel]], union: str) -> str:
    """What to say of `key`, which the variant `tag` of the union at `union` lacks."""
    holders = [f'"{_tag(v)[1]}"' for v in variants if key in v.model_fields]
    if not holders:
        return "unknown key"
    return f'a key of {union}.{tag[0]} = {" or ".join(holders)}, not of "{tag[1]}"'


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
