"""Writing environments: tasks, harness, rubric, tools and parsers."""

from reinforge.envs.environment import Continue, Environment, Finished, Harness, Step
from reinforge.envs.episode import Episode
from reinforge.envs.registry import load_environment
from reinforge.envs.rubric import GroupReward, Reward, Rubric
from reinforge.envs.tools import Tool, tool

__all__ = [
    "Continue",
    "Environment",
    "Episode",
    "Finished",
    "GroupReward",
    "Harness",
    "Reward",
    "Rubric",
    "Step",
    "Tool",
    "load_environment",
    "tool",
]
