"""The shared vocabulary: Task, Trajectory, Group and their parts, and the config section.

Data only. These models cross process boundaries (JSONL run files, HTTP), so they are
pydantic models that serialise as plain JSON.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Discriminator, Field, computed_field

Message = dict[str, Any]
"""An OpenAI chat message: `{"role": ..., "content": ..., ["tool_calls": ...]}`."""


class Section(BaseModel):
    """A section of a config tree: unknown keys are rejected, and each field's docstring
    is its description (command help and the config reference read it from there)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def tagged(key: str, default: str) -> Discriminator:
    """Choose a variant of a union by its `key` field (`kind`, `mode`), taking `default`
    when the input names none, so that an override of one key (`loop.max_error_rate=0.2`,
    `loss.kl_coef=0.1`) needs no tag."""

    def tag(value: Any) -> str:
        if isinstance(value, dict):
            return value.get(key, default)
        return getattr(value, key, default)

    return Discriminator(tag)


def by_kind(value: Any) -> Any:
    """`truncated = "mask"`: a variant named by its kind alone, all else its defaults (a
    union's `BeforeValidator`)."""
    return {"kind": value} if isinstance(value, str) else value


def variant_tag(model: type[BaseModel]) -> tuple[str, str] | None:
    """The tag of a union's variant, as (key, value): its field of one literal value
    (`kind = "spawned"`, `mode = "sync"`); None for a class that is no variant."""
    for name, field in model.model_fields.items():
        values = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
        if len(values) == 1:
            return name, str(values[0])
    return None


def sections_of(annotation: Any) -> list[type[BaseModel]]:
    """The config classes a field holds: one, or the variants of a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in sections_of(arg)]


def refuse_moved(data: Any, moved: dict[str, str]) -> Any:
    """`data` as given to a section's before-validator, unless it holds a key of `moved`:
    then one line saying where that key went, rather than "unknown key"."""
    if isinstance(data, dict):
        for old, new in moved.items():
            if old in data:
                raise ValueError(f"{old} moved to {new}")
    return data


class Record(BaseModel):
    """Numbers a run reports (an eval's summary, a step's metrics line): typed, so every
    reader sees the same names, and written as plain JSON; field docstrings say what each
    number is over."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)


class Task(BaseModel):
    """One problem. Frozen, so a task travels unchanged from dataset to grader."""

    model_config = ConfigDict(frozen=True)

    id: str
    prompt: list[Message]
    answer: Any = None
    info: dict[str, Any] = Field(default_factory=dict)


class Status(StrEnum):
    OK = "ok"
    TRUNCATED = "truncated"
    """The episode hit a turn or token limit before it finished."""
    ERROR = "error"
    """The environment, a tool or a grader raised; excluded from the gradient."""
    TIMEOUT = "timeout"


class TurnTime(BaseModel):
    """One policy turn's seconds: what a reader needs to see which turn of a long
    episode was slow, and whether the policy or the environment made it so."""

    generate_s: float = 0.0
    """Waiting on the policy for the turn's reply."""
    env_s: float = 0.0
    """The environment's answer to it: the reply's tool calls, or its response."""


class Timings(BaseModel):
    generate_s: float = 0.0
    """Seconds spent waiting on the policy."""
    env_s: float = 0.0
    """Seconds in the environment: tools, feedback, opponent moves; `start_s`, `tools_s`
    and `stop_s` are parts of it."""
    start_s: float = 0.0
    """The environment's `start`: acquiring a sandbox and writing the task's files."""
    stop_s: float = 0.0
    """The environment's `stop`: for a sandbox task, copying the workspace out and
    running the verifier on it (its grading)."""
    score_s: float = 0.0
    """The rubric's share of its group's scoring time."""
    total_s: float = 0.0
    turns: list[TurnTime] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tools_s(self) -> float:
        """The environment's answers to the turns: tool calls, feedback, opponent moves."""
        return sum((turn.env_s for turn in self.turns), 0.0)


class Trajectory(BaseModel):
    """One rollout, carrying exactly what training needs.

    `token_ids` is the whole conversation as the policy saw and produced it; `loss_mask`
    is 1 only on tokens the policy sampled; `logprobs` and `policy_versions` (and
    `teacher_logprobs`, when a teacher scored it) have one entry per masked token, in order.
    """

    task_id: str
    group_id: str
    index: int = 0
    """Position within the group."""
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    """The tool schemas the policy was offered (OpenAI format): rendering the messages again
    (e.g. for SFT) needs them to reproduce the prompt the policy saw."""
    token_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    policy_versions: list[int] = Field(default_factory=list)
    teacher_logprobs: list[float] = Field(default_factory=list)
    """On-policy distillation: a teacher's log-prob of each masked token, in order; empty
    when no teacher scored the rollout."""
    rewards: dict[str, float] = Field(default_factory=dict)
    reward: float | None = None
    """The rubric's weighted total; None when the rollout was not scored (error, timeout)."""
    status: Status = Status.OK
    error: str | None = None
    turns: int = 0
    tool_errors: int = 0
    info: dict[str, Any] = Field(default_factory=dict)
    """Whatever the environment wants to keep for readers (final board, guesses...)."""
    timings: Timings = Field(default_factory=Timings)

    @property
    def completion_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def sampled_turns(self) -> list[list[int]]:
        """The token ids of each turn the policy sampled (turns are apart by at least their
        chat template's tokens)."""
        return [self.token_ids[start:end] for start, end in masked_spans(self.loss_mask)]


def masked_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    spans: list[tuple[int, int]] = []
    start = None
    for index, bit in enumerate([*loss_mask, 0]):
        if bit and start is None:
            start = index
        elif not bit and start is not None:
            spans.append((start, index))
            start = None
    return spans


class Group(BaseModel):
    """The rollouts of one task; advantages are relative within the group."""

    task: Task
    trajectories: list[Trajectory]

    @property
    def id(self) -> str:
        return self.trajectories[0].group_id if self.trajectories else self.task.id
