"""Writing environments: tasks, harness, rubric, tools and parsers, and the protocol of the
recipes a run adds to any environment."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from reinforge.envs.episode import Episode
from reinforge.envs.recipe import Recipe
from reinforge.envs.rubric import GroupReward, Reward, Rubric
from reinforge.envs.tools import Tool, tool

if TYPE_CHECKING:
    from reinforge.envs.environment import Continue, Environment, Finished, Harness, Step
    from reinforge.envs.registry import load_environment

_LATER = {
    "Continue": "reinforge.envs.environment",
    "Environment": "reinforge.envs.environment",
    "Finished": "reinforge.envs.environment",
    "Harness": "reinforge.envs.environment",
    "Step": "reinforge.envs.environment",
    "load_environment": "reinforge.envs.registry",
}

__all__ = [
    "Continue",
    "Environment",
    "Episode",
    "Finished",
    "GroupReward",
    "Harness",
    "Recipe",
    "Reward",
    "Rubric",
    "Step",
    "Tool",
    "load_environment",
    "tool",
]


def __getattr__(name: str) -> Any:
    """The environment and the registry need the policy client (openai), so they load when
    first asked for: a command reads this package (`reinforge.envs.config`) to check its
    config before it pays for them."""
    if name not in _LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_LATER[name]), name)
