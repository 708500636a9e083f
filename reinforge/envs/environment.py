"""Environments: tasks, a harness that drives the agent, and a rubric that scores it.

An environment is agent code. `rollout(client, task)` runs one episode as an ordinary
chat loop against the policy client; the same object serves eval, synthetic data and RL.
Multi-turn environments override `respond`, which answers each assistant turn with a
typed step: `Continue(messages)` to go on, `Finished()` to end the episode.

The sync hooks (`setup` by way of `new_episode`, `is_done`) run in threads, and async ones
on the event loop under the rollout generator's watch (`blocking.py`): environment code
that hangs fails its rollout, not the run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reinforge.envs.blocking import in_thread
from reinforge.envs.episode import Episode
from reinforge.envs.recipe import Recipe
from reinforge.envs.rubric import Rubric
from reinforge.envs.tools import Tool, ToolResult
from reinforge.policy.chat import CHAT_API_FORMAT, parse_tool_calls
from reinforge.policy.client import ChatClient, EpisodeLimit
from reinforge.types import Message, Task


@dataclass(frozen=True)
class Continue:
    """The environment answers; the agent takes another turn."""

    messages: list[Message]


@dataclass(frozen=True)
class Finished:
    """The episode is over; the rubric scores it."""


Step = Continue | Finished
Respond = Callable[[Episode], Awaitable[Step]]


@dataclass
class Harness:
    """How the agent is driven: system prompt, tools, turn limit, token limits, and the
    recipes that vary it per rollout."""

    system_prompt: str | None = None
    tools: Sequence[Tool] = ()
    max_turns: int = 1
    max_tokens_per_turn: int = 256
    max_total_tokens: int | None = None
    """Sampled tokens over the whole episode; past it the episode ends as truncated."""
    recipes: Sequence[Recipe[Any]] = ()
    """Run by the rollout generator around every rollout (a reasoning level, a harness
    variant): each prepares the episode in turn, and they record in reverse order, as
    nested context managers exit, so the last to prepare (nearest the episode) records
    first. Their reward terms join the rubric through `Environment.add_recipes`."""

    def initial_messages(self, task: Task) -> list[Message]:
        prompt = [dict(m) for m in task.prompt]
        if self.system_prompt and not (prompt and prompt[0].get("role") == "system"):
            prompt.insert(0, {"role": "system", "content": self.system_prompt})
        return prompt

    @property
    def max_sampled_tokens(self) -> int:
        """The most tokens the policy can sample in one episode."""
        per_turns = self.max_turns * self.max_tokens_per_turn
        return per_turns if self.max_total_tokens is None else min(self.max_total_tokens, per_turns)

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return [t.schema for t in self.tools] or None


class Environment:
    """Subclass and implement `tasks`; multi-turn environments also implement `respond`."""

    name = "environment"

    def __init__(self, harness: Harness | None = None, rubric: Rubric | None = None) -> None:
        self.harness = harness or Harness()
        self.rubric = rubric or Rubric()
        self._tools = {t.name: t for t in self.harness.tools}

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        """`n` tasks, the same ones for the same seed."""
        raise NotImplementedError

    def setup(self, task: Task) -> dict[str, Any]:
        """Initial per-episode state."""
        return {}

    def is_done(self, episode: Episode) -> bool:
        """Whether a turn's tool calls ended the episode (a submit tool, a solved puzzle):
        checked after each turn's tools; True ends it ok, even on the last allowed turn,
        which would otherwise count as running out of turns. Default: never."""
        return False

    async def respond(self, episode: Episode) -> Step:
        """Answer an assistant turn that made no tool call. Single-turn: always Finished."""
        return Finished()

    async def start(self, episode: Episode) -> None:
        """Acquire what the episode needs (a sandbox, a browser) into `episode.resources`."""

    async def stop(self, episode: Episode) -> None:
        """Collect what the graders need into `episode.state`, then release the resources.
        Runs however the episode ended: finished, failed or cancelled at its timeout, and
        after a `start` that raised, so it releases only what `start` acquired."""

    async def aclose(self) -> None:
        """Release what the environment holds across episodes (a sandbox pool)."""

    def new_episode(self, task: Task) -> Episode:
        return Episode(task, self.harness.initial_messages(task), self.setup(task))

    def add_recipes(self, *recipes: Recipe[Any]) -> None:
        """Run `recipes` around every rollout, after the harness's own, with their reward
        terms after the rubric's: the environment's terms keep their names and weights, so
        no environment changes to take part. A term named like one before it raises
        ValueError, leaving the environment as it was."""
        terms = [term for recipe in recipes for term in recipe.terms()]
        if terms:
            rubric = self.rubric
            self.rubric = Rubric(*rubric.terms, *terms, pass_threshold=rubric.pass_threshold)
        self.harness = replace(self.harness, recipes=[*self.harness.recipes, *recipes])

    async def rollout(
        self, client: ChatClient, task: Task, episode: Episode | None = None
    ) -> Episode:
        """Play one episode of `task`. A caller that passes its own `episode` (from
        `new_episode`) keeps the conversation so far even if the rollout raises or is
        cancelled at its time limit."""
        episode = episode or self.new_episode(task)
        try:
            with episode.clock.timing("start_s"):
                await self.start(episode)
            await self._play(client, episode)
        finally:
            with episode.clock.timing("stop_s"):
                await self.stop(episode)
        return episode

    async def _play(self, client: ChatClient, episode: Episode) -> None:
        """The agent loop: chat, run tool calls, or let the environment respond."""
        await self.agent_loop(client, episode, self.harness.max_turns, self.respond)

    async def agent_loop(
        self, client: ChatClient, episode: Episode, max_turns: int, respond: Respond
    ) -> None:
        """`_play`'s loop, for at most `max_turns` turns; a nested episode (a sub-agent's)
        runs it too, with a `respond` of its own."""
        harness = self.harness
        tools = self.episode_tools(episode)
        schemas = self.request_tools(episode)
        while episode.turns < max_turns:
            try:
                reply = await client.chat(episode.messages, schemas, harness.max_tokens_per_turn)
            except EpisodeLimit:
                episode.truncated = True
                return
            episode.messages.append(reply.message)
            episode.turns += 1
            # A turn cut at the token limit goes to the environment like any other (it may
            # call it invalid); the episode counts as truncated if it ends on such a turn.
            episode.truncated = reply.truncated
            answering = time.perf_counter()
            results = await self._run_tools(client, episode, reply.message) if tools else []
            if results:  # the reply called tools, or tried to
                episode.add(results)
                done = await in_thread(self.is_done, episode)  # through a tool, on any turn
                episode.clock.turns_s.append(time.perf_counter() - answering)
                if done:
                    episode.truncated = False
                    return
                continue
            step = await respond(episode)
            episode.clock.turns_s.append(time.perf_counter() - answering)
            if isinstance(step, Finished):
                return
            episode.add(step.messages)
        episode.truncated = True

    def episode_tools(self, episode: Episode) -> dict[str, Tool]:
        """The tools by the names this episode was shown them (a harness variant may
        rename them), in the order it was offered them."""
        if episode.tools is None:
            return self._tools
        return {t.name: t for t in episode.tools}

    def request_tools(self, episode: Episode) -> list[dict[str, Any]] | None:
        """The tool schemas that go with each of the episode's chat requests, which its
        trajectory records: the chat API's calls go through it, other formats were told in
        the system prompt (`Episode.offer_tools`). None: no tools go."""
        if episode.tool_format != CHAT_API_FORMAT:
            return None
        return [t.schema for t in self.episode_tools(episode).values()] or None

    async def _run_tools(
        self, client: ChatClient, episode: Episode, message: Message
    ) -> list[Message]:
        """Run each call; errors go back to the model as tool messages and are counted. The
        calls are the server's (`tool_calls`) or, where it parsed none, those in the text
        in the episode's format."""
        tools = self.episode_tools(episode)
        parsed = parse_tool_calls(message.get("content") or "", episode.tool_format)
        results: list[Message] = []
        for problem in parsed.errors:
            episode.tool_errors += 1
            results.append({"role": "tool", "content": f"Error: {problem}"})
        for call in message.get("tool_calls") or parsed.tool_calls:
            function = call["function"]
            episode.tool_calls += 1
            tool = tools.get(function["name"])
            arguments = function.get("arguments") or "{}"
            if tool is None:
                known = ", ".join(tools)
                result = ToolResult(
                    f"Error: no tool named {function['name']!r}; tools: {known}", error=True
                )
            else:
                result = await tool.run(arguments, episode, self, client)
            episode.tool_errors += result.error
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": call.get("id"),
                    "name": function["name"],
                    "content": result.content,
                }
            )
        return results


def jsonable(state: dict[str, Any]) -> dict[str, Any]:
    """The state as plain JSON values (anything else as its string form)."""
    return json.loads(json.dumps(state, default=str))
