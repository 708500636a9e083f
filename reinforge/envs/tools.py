"""Tools from typed Python functions: the schema comes from the signature and docstring.

pydantic builds both the JSON schema the model sees and the validator for the arguments
it sends, so the two never disagree. A tool that raises, or a call with bad arguments,
becomes an error message back to the model; the harness counts it. A sync tool runs in a
thread (`blocking.call`): one that hangs leaves the event loop, and with it the rollout's
time limit, working.

One convention reaches past the model's arguments: a parameter annotated `Episode` is
not shown to the model and receives the current episode, so a tool can use the episode's
resources (its sandbox).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, Field, ValidationError, create_model

from reinforge.envs.blocking import call
from reinforge.envs.episode import Episode

if TYPE_CHECKING:
    from reinforge.envs.environment import Environment
    from reinforge.policy.client import ChatClient

_ARG_LINE = re.compile(r"^\s{2,}(\w+)\s*(?:\([^)]*\))?:\s*(.+)$")


@dataclass(frozen=True)
class ToolResult:
    content: str
    error: bool = False


class Tool:
    """A callable the model may invoke by name with JSON arguments."""

    def __init__(self, function: Callable[..., Any], name: str | None = None) -> None:
        self.function = function
        self.name = name or function.__name__
        self.description, arg_docs = _parse_docstring(inspect.getdoc(function) or "")
        hints = get_type_hints(function)
        self._episode_param = next((n for n, h in hints.items() if h is Episode), None)
        self._arguments = _arguments_model(function, self.name, arg_docs, self._episode_param)

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry."""
        parameters = self._arguments.model_json_schema()
        parameters.pop("title", None)
        for prop in parameters.get("properties", {}).values():
            prop.pop("title", None)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    async def call(
        self, arguments: str | dict[str, Any], episode: Episode | None = None
    ) -> ToolResult:
        try:
            raw = json.loads(arguments) if isinstance(arguments, str) else arguments
            values = dict(self._arguments.model_validate(raw))
        except (ValueError, ValidationError) as error:
            return ToolResult(f"Error: invalid arguments for {self.name}: {error}", error=True)
        if self._episode_param is not None:
            values[self._episode_param] = episode
        try:
            result = await call(self.function, **values)
        except Exception as error:
            return ToolResult(f"Error: {type(error).__name__}: {error}", error=True)
        if isinstance(result, str):
            return ToolResult(result)
        try:
            return ToolResult(json.dumps(result))
        except (TypeError, ValueError) as error:  # the model sees it, as with any tool bug
            return ToolResult(f"Error: {self.name} returned no JSON value: {error}", error=True)

    async def run(
        self,
        arguments: str | dict[str, Any],
        episode: Episode,
        environment: Environment,
        client: ChatClient,
    ) -> ToolResult:
        """The call as the agent loop makes it: `call`. A tool that plays an episode of its
        own (the sub-agent) overrides it, for it needs the environment's loop and the
        rollout's client, which no other tool sees."""
        return await self.call(arguments, episode)


def tool(function: Callable[..., Any] | Callable[..., Awaitable[Any]]) -> Tool:
    """Decorator form of `Tool(function)`."""
    return Tool(function)


def _arguments_model(
    function: Callable[..., Any], name: str, arg_docs: dict[str, str], hidden: str | None
) -> type[BaseModel]:
    hints = get_type_hints(function)
    fields: dict[str, Any] = {}
    for param in inspect.signature(function).parameters.values():
        if param.name == hidden:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args and **kwargs cannot be described to a model")
        if param.name not in hints:
            raise TypeError(f"tool {name}: parameter {param.name!r} needs a type annotation")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (
            hints[param.name],
            Field(default, description=arg_docs.get(param.name)),
        )
    return create_model(f"{name}_arguments", **fields)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and per-argument descriptions."""
    summary, _, rest = doc.partition("\nArgs:")
    arg_docs: dict[str, str] = {}
    for line in rest.splitlines():
        match = _ARG_LINE.match(line)
        if match:
            arg_docs[match.group(1)] = match.group(2).strip()
        elif line and not line.startswith(" "):
            break  # the next section (Returns:, Raises:) ends the arguments
    return " ".join(summary.split()), arg_docs
