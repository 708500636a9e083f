"""What a run adds to any environment from its `env` config section: reasoning levels and
harness variants in its harness; a token-budget override, a loop penalty, judged criteria
and a conciseness bonus in its rubric. The environment's own terms come first and keep
their names and weights, so no environment changes to take part.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from reinforge.envs.config import EnvConfig
from reinforge.envs.judge import Judge
from reinforge.envs.levels import over_budget
from reinforge.envs.loops import looping
from reinforge.envs.rubric import GroupReward, Override, Reward, Rubric
from reinforge.envs.subagent import subagent
from reinforge.errors import UsageError

if TYPE_CHECKING:
    from reinforge.envs.environment import Environment
    from reinforge.envs.episode import Episode


def add_recipes(environment: Environment, config: EnvConfig) -> None:
    """Give `environment` the levels and rubric terms `config` asks for."""
    terms: list[Reward | GroupReward | Override] = []
    if config.augment is not None:
        unknown = config.augment.unknown_tools(list(environment.harness.tools))
        offered_names = [t.name for t in environment.harness.tools]
        if unknown:
            offered = ", ".join(offered_names) or "none"
            raise UsageError(
                f"env.augment names tools that {environment.name!r} does not offer: "
                f"{', '.join(unknown)} (its tools: {offered})"
            )
        if config.augment.subagent is not None and subagent.__name__ in offered_names:
            raise UsageError(
                f"env.augment.subagent: {environment.name!r} has a tool named "
                f"{subagent.__name__!r} already"
            )
        environment.harness = replace(environment.harness, augment=config.augment)
    if config.levels is not None:
        environment.harness = replace(environment.harness, levels=config.levels)
        terms.append(Override(over_budget, config.levels.over_budget_reward))
    if config.loop_penalty > 0:
        terms.append(Reward(looping, -config.loop_penalty))
    if config.judge is not None:
        terms.extend(Judge(config.judge).terms())
    if config.conciseness > 0:
        terms.append(GroupReward(conciseness, config.conciseness))
    if not terms:
        return
    rubric = environment.rubric
    try:
        environment.rubric = Rubric(*rubric.terms, *terms, pass_threshold=rubric.pass_threshold)
    except ValueError as error:  # a judged criterion named like one of the env's terms
        raise UsageError(f"environment {environment.name!r}: {error}") from error


def conciseness(episodes: list[Episode]) -> list[float]:
    """0.5 - (tokens - fewest) / (most - fewest), over the tokens each episode sampled:
    0.5 for the group's shortest, -0.5 for its longest, 0 for all when they are equally
    long. Kimi k1.5's length reward (Kimi Team, 2025) without its split by correctness,
    which a term cannot see: weighted below the reward gap between a right and a wrong
    answer, it orders answers of equal worth by length and never lifts a short wrong
    answer above a right one. Pinned by `test_conciseness_is_relative_to_the_group`."""
    lengths = [sum(len(turn) for turn in e.sampled_token_ids) for e in episodes]
    fewest, most = min(lengths, default=0), max(lengths, default=0)
    if most == fewest:
        return [0.0] * len(episodes)
    return [0.5 - (length - fewest) / (most - fewest) for length in lengths]
