"""reasoning-gym's procedural datasets as environments: `reasoning_gym:<dataset>`.

`env.args` is the dataset's own config (a dataclass in reasoning-gym), checked here as a
`Section` made from its fields, so a misspelt or ill-typed key is one line naming it as any
loader's `Args` would. The config's `seed` and `size` are the run's to set: `tasks(n,
seed)` builds the dataset of size `n` with a seed spread from `seed` (`dataset_seed`), so
a seed names the same tasks every time and two seeds share none. The reward is the
dataset's own `score_answer` of the reply's last `<answer>` block, which is where
reasoning-gym's prompts and its `extract_answer` expect the answer.

reasoning-gym is an optional dependency (`reinforge[ecosystem]`): it is imported when a
dataset is loaded, so that reinforge imports without it.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
import zlib
from typing import Any

from pydantic import ConfigDict, Field, create_model

from reinforge.envs.environment import Environment, Harness
from reinforge.envs.episode import Episode
from reinforge.envs.parsers import extract_tag
from reinforge.envs.registry import validated_args
from reinforge.envs.rubric import Reward, Rubric
from reinforge.errors import ConfigError, UsageError
from reinforge.types import Section, Task

SOURCE = "reasoning_gym"
RUN_SET = ("seed", "size")
"""Config fields that `tasks(n, seed)` sets, never `env.args`."""


def dataset_seed(seed: int) -> int:
    """The seed a dataset of `seed`'s tasks is drawn with. reasoning-gym draws entry i from
    its seed + i, so the seeds of two evals one apart (`eval --seed 0`, then 1) would
    share all but one entry; spread, they lie about 2**32 / (seeds) apart."""
    return zlib.crc32(f"reasoning_gym/{seed}".encode())


MAX_TOKENS_PER_TURN = 1024
"""Room to reason before the answer, as the system prompt asks."""
KNOWN = 'python -c "from reasoning_gym.factory import DATASETS; print(sorted(DATASETS))"'


class DatasetArgs(Section):
    """The base of a dataset's `Args`: a config field may be typed with any class."""

    model_config = ConfigDict(arbitrary_types_allowed=True)


class ReasoningGym(Environment):
    """One reasoning-gym dataset, with the config `env.args` gave it."""

    def __init__(self, dataset: str, dataset_cls: type, config: Any, system_prompt: str) -> None:
        harness = Harness(system_prompt=system_prompt, max_tokens_per_turn=MAX_TOKENS_PER_TURN)
        super().__init__(harness, Rubric(Reward(self.score_answer), pass_threshold=1.0))
        self.name = f"{SOURCE}:{dataset}"
        self.dataset = dataset
        self.dataset_cls = dataset_cls
        self.config = config
        self.scorer = self.draw(seed=0, size=1)
        """Scores every episode: a scorer reads the entry and the config, not the seed."""

    def draw(self, seed: int, size: int) -> Any:
        """The dataset of `size` entries drawn with `seed`."""
        return self.dataset_cls(config=dataclasses.replace(self.config, seed=seed, size=size))

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        if n == 0:
            return []
        dataset = self.draw(dataset_seed(seed), n)
        entries = [dataset[i] for i in range(n)]
        return [
            Task(
                id=f"{self.dataset}-{seed}-{i}",
                prompt=[{"role": "user", "content": entry["question"]}],
                answer=entry["answer"],
                info={"entry": entry},
            )
            for i, entry in enumerate(entries)
        ]

    def score_answer(self, episode: Episode) -> float:
        """The dataset's score of the last `<answer>` block; with none, of no answer."""
        answer = extract_tag(episode.completion, "answer")
        return float(self.scorer.score_answer(answer, episode.task.info["entry"]))


def load_environment(dataset: str, /, **args: Any) -> ReasoningGym:
    """The environment of reasoning-gym's `dataset`, its config made from `args`."""
    try:
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS
    except ImportError as error:
        raise UsageError(
            f"{SOURCE}:{dataset} needs reasoning-gym: pip install 'reinforge[ecosystem]'"
        ) from error
    if dataset not in DATASETS:
        close = difflib.get_close_matches(dataset, list(DATASETS), n=3)
        hint = f"close: {', '.join(close)}; " if close else ""
        raise UsageError(f"unknown reasoning-gym dataset {dataset!r}; {hint}all: {KNOWN}")
    dataset_cls, config_cls = DATASETS[dataset]
    for key in RUN_SET:
        if key in args:
            raise ConfigError(
                f"env.args.{key}",
                "set by the run: tasks are drawn with its seed (run.seed, eval --seed), "
                "as many as it asks for",
            )
    values = validated_args(dataset_args(config_cls), args)
    try:
        config = config_cls(**{key: getattr(values, key) for key in type(values).model_fields})
        return ReasoningGym(dataset, dataset_cls, config, SYSTEM_PROMPTS["default"])
    except (AssertionError, ValueError) as error:  # the config's own checks, between fields
        raise ConfigError("env.args", str(error) or type(error).__name__) from error


def dataset_args(config_cls: type) -> type[Section]:
    """The `Args` of a dataset: its config's fields, with their types and defaults, less
    the ones the run sets."""
    hints = typing.get_type_hints(config_cls)
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(config_cls):
        if field.name in RUN_SET or not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            default = Field(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=field.default_factory)
        else:
            default = Field()
        fields[field.name] = (hints[field.name], default)
    return create_model(f"{config_cls.__name__}Args", __base__=DatasetArgs, **fields)
