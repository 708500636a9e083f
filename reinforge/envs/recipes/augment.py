"""Harness augmentation: each rollout meets a variant of the harness (system prompt, tool
names, descriptions and order, notes in the prompt, the tool-call format, a sub-agent
tool), so a policy learns the task rather than one harness's wording; and an eval over
fixed variants measures how much a policy's reward depends on that wording.

`HarnessVariants` is the recipe: a variant is drawn from the rollout's key, so the same
seed gives the same variants; it is recorded on the trajectory (`info["harness"]`, and
`info["harness_variant"]` when the run uses a fixed number of them).
"""

from __future__ import annotations

import copy
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from pydantic import Field, model_validator

from reinforge.envs.recipe import Rollout
from reinforge.envs.recipes.subagent import SUBAGENT_CALLS, SubAgent, SubAgentConfig
from reinforge.policy.chat import CHAT_API_FORMAT, ToolFormat
from reinforge.types import Message, Record, Section, Status, Trajectory

if TYPE_CHECKING:
    from reinforge.envs.episode import Episode
    from reinforge.envs.rubric import Term
    from reinforge.envs.tools import Tool


class HarnessAugmentation(Section):
    """What varies between rollouts; a feature left empty does not vary."""

    system_prompts: list[str] = Field(default_factory=list)
    """System prompts to draw from; `{prompt}` stands for the environment's own (empty when
    it has none), so a variant may wrap it. Empty: the environment's prompt unchanged."""
    tool_names: dict[str, list[str]] = Field(default_factory=dict)
    """Other names for a tool, by its own name, e.g. `{ search = ["lookup", "find"] }`:
    each rollout shows one of the names (its own included) and calls go to the tool."""
    tool_descriptions: dict[str, list[str]] = Field(default_factory=dict)
    """Paraphrases of a tool's description, by its own name; drawn with the original."""
    shuffle_tools: bool = True
    """Offer the tools in a drawn order."""
    notes: list[str] = Field(default_factory=list)
    """Texts that may join the system prompt (memory notes, skills), each independently."""
    note_rate: float = Field(0.5, ge=0.0, le=1.0)
    """How often each note is included."""
    tool_formats: list[ToolFormat] = Field(default_factory=list)
    """Tool-call formats to draw from: "hermes" (`<tool_call>` JSON, through the chat API)
    or "xml" (`<function=NAME><parameter=ARGUMENT>value</parameter></function>`, told in the
    system prompt and read from the reply by the environment). Empty: hermes."""
    subagent: SubAgentConfig | None = None
    """Offer the sub-agent tool to some rollouts; None: to none."""
    variants: int = Field(0, ge=0)
    """Fixed variants that rollout i of a task meets in turn (i mod N): variant 0 is the
    environment's own harness, the others are drawn from the seed; `reinforge eval` runs
    every task under each and reports reward per variant. 0: every rollout draws its own."""

    @model_validator(mode="after")
    def _prompts_use_only_prompt(self) -> Self:
        for prompt in self.system_prompts:
            try:
                prompt.format(prompt="")
            except (KeyError, IndexError, ValueError) as error:
                raise ValueError(f"system_prompts may use only {{prompt}}: {error}") from error
        return self

    def varies(self, tools: list[Tool]) -> bool:
        """Whether two variants can differ for a harness offering `tools`."""
        names = {t.name for t in tools}
        subagent = self.subagent.rate if self.subagent is not None else 0.0
        offered = len(tools) + (subagent > 0)
        return bool(
            self.system_prompts
            or self.notes
            or any(self.tool_names.get(n) or self.tool_descriptions.get(n) for n in names)
            or (self.shuffle_tools and offered > 1)
            or (len(set(self.tool_formats)) > 1 and offered > 0)
            or 0 < subagent < 1
        )

    def unknown_tools(self, tools: list[Tool]) -> list[str]:
        """Tool names the config mentions that the environment does not offer."""
        offered = {t.name for t in tools}
        return sorted((set(self.tool_names) | set(self.tool_descriptions)) - offered)

    def draw(self, rollout_key: str, index: int, seed: int | None, tools: list[Tool]) -> Variant:
        """The variant of rollout `index`, whose own key is `rollout_key`, for a harness
        offering `tools`; with fixed variants the rollout meets variant `index % variants`
        of the seed."""
        if not self.variants:
            return self._draw(random.Random(rollout_key), None)
        return self._fixed(index % self.variants, seed, tools)

    def _fixed(self, number: int, seed: int | None, tools: list[Tool]) -> Variant:
        """Variant 0 is the environment's own harness, the baseline of a robustness table;
        each later one is drawn from the seed, unlike those before it while the features
        leave room (a few draws), so N variants are N harnesses where they can be."""
        variants = [Variant.own(self)]
        while len(variants) <= number:
            for attempt in range(64):
                rng = random.Random(f"{seed}/harness-variant/{len(variants)}/{attempt}")
                drawn = self._draw(rng, len(variants))
                if all(drawn.key(tools) != other.key(tools) for other in variants):
                    break
            variants.append(drawn)
        return variants[number]

    def _draw(self, rng: random.Random, number: int | None) -> Variant:
        prompt = rng.randrange(len(self.system_prompts)) if self.system_prompts else None
        notes = [i for i in range(len(self.notes)) if rng.random() < self.note_rate]
        names = {tool: rng.choice([tool, *alias]) for tool, alias in self.tool_names.items()}
        described = {
            tool: rng.randrange(len(paraphrases) + 1) - 1
            for tool, paraphrases in self.tool_descriptions.items()
        }
        order = rng.random() if self.shuffle_tools else None
        # Drawn after the features above, so that adding these leaves their draws as they were.
        tool_format = rng.choice(self.tool_formats) if self.tool_formats else CHAT_API_FORMAT
        subagent = self.subagent is not None and rng.random() < self.subagent.rate
        return Variant(self, number, prompt, notes, names, described, order, tool_format, subagent)


@dataclass(frozen=True)
class Variant:
    """One rollout's harness: which prompt, notes, names, descriptions and call format it
    drew, and whether it has the sub-agent."""

    augmentation: HarnessAugmentation = field(repr=False)
    number: int | None
    prompt: int | None
    """Index into `system_prompts`; None: the environment's own."""
    notes: list[int]
    names: dict[str, str]
    """Shown name by the tool's own name, for the tools the config renames."""
    descriptions: dict[str, int]
    """Index into the tool's paraphrases; -1: its own description."""
    order_key: float | None
    """Seeds the tool order, so the same variant always orders tools alike; None: the
    environment's order."""
    tool_format: ToolFormat = CHAT_API_FORMAT
    """How the model is asked to write tool calls; hermes is the environment's own."""
    subagent: bool = False
    """Whether the rollout is offered the `subagent` tool."""

    @classmethod
    def own(cls, augmentation: HarnessAugmentation) -> Variant:
        """The environment's harness as it is: variant 0 of fixed variants."""
        return cls(augmentation, 0, None, [], {}, {}, None)

    def key(self, tools: list[Tool]) -> tuple[object, ...]:
        """What the model sees differ between two variants of a harness offering `tools`:
        prompt, notes, the tools' shown names, descriptions and order (the sub-agent's
        among them), and, when there are tools, their call format."""
        shown = tuple((t.name, t.description) for t in self.tools(tools))
        return (self.prompt, tuple(self.notes), shown, self.tool_format if shown else None)

    def apply(self, episode: Episode, tools: list[Tool]) -> None:
        """Give `episode` this variant of a harness offering `tools`."""
        episode.messages = self.messages(episode.messages)
        if self.subagent:
            episode.state[SUBAGENT_CALLS] = 0
        episode.offer_tools(self.tools(tools), self.tool_format)

    def messages(self, messages: list[Message]) -> list[Message]:
        """`messages` with this variant's system prompt and notes."""
        has_system = bool(messages) and messages[0].get("role") == "system"
        own = (messages[0].get("content") or "") if has_system else ""
        system = own
        if self.prompt is not None:
            system = self.augmentation.system_prompts[self.prompt].format(prompt=own)
        notes = [self.augmentation.notes[i] for i in self.notes]
        system = "\n\n".join(part for part in (system, *notes) if part)
        rest = messages[1:] if has_system else messages
        if not system:
            return list(rest)
        head = messages[0] if has_system else {"role": "system"}
        return [{**head, "content": system}, *rest]

    def tools(self, tools: list[Tool]) -> list[Tool]:
        """`tools` as this variant shows them: renamed, redescribed and reordered copies
        (calls by a shown name run the tool itself), with the sub-agent when offered."""
        shown = []
        for original in tools:
            tool = copy.copy(original)
            tool.name = self.names.get(original.name, original.name)
            pick = self.descriptions.get(original.name, -1)
            if pick >= 0:
                tool.description = self.augmentation.tool_descriptions[original.name][pick]
            shown.append(tool)
        if self.subagent and self.augmentation.subagent is not None:
            shown.append(SubAgent(self.augmentation.subagent))
        if self.order_key is not None:
            random.Random(self.order_key).shuffle(shown)
        return shown

    def describe(self, shown: list[Tool]) -> dict[str, Any]:
        """What `info["harness"]` records."""
        return {
            "system_prompt": self.prompt,
            "notes": self.notes,
            "tools": [t.name for t in shown],
            "descriptions": {name: i for name, i in self.descriptions.items() if i >= 0},
            "tool_format": self.tool_format,
            "subagent": self.subagent,
        }


@dataclass(frozen=True)
class HarnessVariants:
    """Harness augmentation as a recipe, for a harness offering `tools`: each rollout meets
    the variant drawn for it."""

    augmentation: HarnessAugmentation
    tools: list[Tool]

    def draw(self, rollout: Rollout) -> Variant:
        return self.augmentation.draw(rollout.key, rollout.index, rollout.seed, self.tools)

    def prepare(self, drawn: Variant, episode: Episode) -> None:
        drawn.apply(episode, self.tools)

    def record(self, drawn: Variant, info: dict[str, Any]) -> None:
        info["harness"] = drawn.describe(drawn.tools(self.tools))
        if drawn.number is not None:
            info["harness_variant"] = drawn.number

    def terms(self) -> list[Term]:
        return []


class VariantStats(Record):
    """One fixed harness variant's rollouts in a summary."""

    rollouts: int
    reward_mean: float
    """Over the variant's scored rollouts (0 when none was scored)."""
    errored: int


def variant_metrics(trajectories: list[Trajectory]) -> dict[str, VariantStats]:
    """Per fixed variant, by number; empty when the run drew no fixed variants."""
    by_variant: dict[int, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        if "harness_variant" in trajectory.info:
            by_variant[trajectory.info["harness_variant"]].append(trajectory)
    stats: dict[str, VariantStats] = {}
    for number, group in sorted(by_variant.items()):
        scored = [t for t in group if t.status in (Status.OK, Status.TRUNCATED)]
        stats[str(number)] = VariantStats(
            rollouts=len(group),
            reward_mean=statistics.fmean(t.reward or 0.0 for t in scored) if scored else 0.0,
            errored=len(group) - len(scored),
        )
    return stats
