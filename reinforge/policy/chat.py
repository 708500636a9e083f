"""Chat templates as token sequences, built so that multi-turn episodes stay token-exact.

The first prompt of an episode is the chat template rendered and tokenized once. Every
later prompt is the previous prompt, plus the exact tokens the engine sampled, plus the
template's tokens for the messages that came after (tool results, environment feedback).
Earlier turns are never re-rendered, so a template that rewrites history (or a sampled
token sequence that differs from the canonical tokenization of its text) cannot shift
what the policy saw.

Templates that do not understand `tools` get the tool schemas in the system prompt and
are parsed in the Hermes `<tool_call>{...}</tool_call>` format. An assistant message's
`tool_calls` (how OpenAI clients send a call back as history) are written back in that
same format for such templates, so a call parsed out of sampled text renders to the text
that was sampled; templates with tool support get `tool_calls` themselves, with
`arguments` as a dict where the template serialises or walks it.

A harness may ask for another call format instead (`ToolFormat`, e.g. "xml"): it tells the
model the tools and the format in the system prompt (`with_tool_prompt`), sends no `tools`,
and reads the calls out of the reply's text (`parse_tool_calls(text, format)`). Those calls
stay in the assistant message's text, never in its `tool_calls`, so its history renders as
it was sampled with any template.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from reinforge.types import Message

if TYPE_CHECKING:  # environments import this module; keep transformers out of their path
    from transformers import PreTrainedTokenizerBase

_SENTINEL = "\x00reinforge-sentinel\x00"
_DUMMY: list[Message] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
]
# A template that writes `arguments | tojson` or walks `arguments | items` wants a dict
# (Hugging Face's convention); one that pastes `arguments` as is wants OpenAI's string.
_DICT_ARGUMENTS = re.compile(r"arguments['\"\]]*\s*\|\s*(?:tojson|items|dictsort)")


ToolFormat = Literal["hermes", "xml"]
"""How the model writes a tool call. "hermes": a `<tool_call>` block holding
`{"name": ..., "arguments": {...}}`, what templates with tool support teach and what the
server turns into `tool_calls`. "xml": Qwen3-Coder's style, `<function=NAME>` holding one
`<parameter=ARGUMENT>value</parameter>` block per argument, each value plain text."""

CHAT_API_FORMAT: ToolFormat = "hermes"
"""The format the chat API's `tools` and `tool_calls` stand for, so the one an
environment uses unless a harness variant asks for another."""


class TemplateError(ValueError):
    """The conversation cannot be rendered (or continued) with this chat template."""


@dataclass(frozen=True)
class ParsedToolCalls:
    content: str
    """The text outside the tool-call blocks."""
    tool_calls: list[dict[str, Any]]
    """Well-formed calls in OpenAI format."""
    errors: list[str]
    """One message per block that was not a valid call."""


class ChatFormat:
    """Renders conversations to token ids with one tokenizer's chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not tokenizer.chat_template:
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.native_tools = "tools" in tokenizer.chat_template
        self.dict_arguments = bool(_DICT_ARGUMENTS.search(tokenizer.chat_template))
        """Whether a native template takes tool-call `arguments` as a dict, not a string."""
        closed = self._render([*_DUMMY[:2], {"role": "assistant", "content": _SENTINEL}])
        self.assistant_suffix = closed.split(_SENTINEL, 1)[1]
        """Template text after an assistant message's content, e.g. `<|im_end|>\\n`."""

    def prompt_ids(self, messages: list[Message], tools: Sequence[dict] | None = None) -> list[int]:
        """Tokens of a fresh conversation ending in the assistant's generation prompt."""
        text = self._render(self._with_tools(messages, tools), add_generation_prompt=True)
        return self._encode(text)

    def render_text(self, messages: list[Message], tools: Sequence[dict] | None = None) -> str:
        """The conversation as the template writes it (no generation prompt)."""
        return self._render(self._with_tools(messages, tools))

    def continuation_ids(
        self, previous_ids: list[int], new_messages: list[Message], ended_with_eos: bool
    ) -> list[int]:
        """Continue an episode whose last `previous_ids` end with a sampled assistant turn.

        Appends what the template puts after the assistant's content (less the EOS token
        the policy already sampled) and the new messages with the next generation prompt.
        """
        if any(m.get("role") == "assistant" for m in new_messages):
            raise TemplateError("a continuation may not contain assistant messages")
        closing = self.assistant_suffix
        eos_text = self.tokenizer.eos_token or ""
        if ended_with_eos and eos_text and closing.startswith(eos_text):
            closing = closing[len(eos_text) :]
        before = self._render(_DUMMY)
        after = self._render([*_DUMMY, *new_messages], add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError("the chat template rewrites earlier turns when messages follow")
        return previous_ids + self._encode(closing) + self._encode(after[len(before) :])

    def _with_tools(self, messages: list[Message], tools: Sequence[dict] | None) -> list[Message]:
        if not tools or self.native_tools:
            return messages
        return with_tool_prompt(messages, tools)

    def _render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        prepared = [self._template_message(m) for m in messages]
        try:
            return self.tokenizer.apply_chat_template(
                prepared,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as error:  # jinja raises its own types for unrenderable input
            raise TemplateError(f"chat template failed: {error}") from error

    def _template_message(self, message: Message) -> Message:
        """The message as this template can render it. Templates without tool support
        ignore `tool_calls`, which would leave an empty assistant turn: the calls go into
        the content as the Hermes blocks the policy was asked to write."""
        calls = message.get("tool_calls")
        if calls and message.get("role") == "assistant":
            if not self.native_tools:
                rest = {k: v for k, v in message.items() if k != "tool_calls"}
                return {**rest, "content": tool_call_markup(message.get("content"), calls)}
            if self.dict_arguments:
                message = {**message, "tool_calls": [_dict_arguments(c) for c in calls]}
        return _plain(message)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []


@dataclass(frozen=True)
class _Markup:
    """How one `ToolFormat` writes a call, reads one back, and is taught."""

    block: re.Pattern[str]
    """One call; its group 1 is what `read` takes and an error quotes."""
    opening: str
    """What begins a call, so that a call left open is told apart from plain text."""
    unclosed: str
    """The error for a call left open."""
    read: Callable[[str], tuple[Any, Any]]
    """(name, arguments) of one call; raises ValueError, KeyError or TypeError."""
    example: str
    """A call as the system prompt shows it."""


def _read_hermes(block: str) -> tuple[Any, Any]:
    payload = json.loads(block)
    return payload["name"], payload.get("arguments", {})


_XML_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([\w.-]+)>(.*?)</parameter>", re.DOTALL)


def _read_xml(block: str) -> tuple[Any, Any]:
    """Values stay text (less the newline after the opening tag and before the closing
    one); the tool's argument types read numbers and booleans from it."""
    function = _XML_FUNCTION.fullmatch(block)
    if function is None:
        raise ValueError("expected <function=NAME> with <parameter=ARGUMENT> blocks")
    name, body = function.groups()
    arguments: dict[str, str] = {}
    for key, value in _XML_PARAMETER.findall(body):
        if key in arguments:
            raise ValueError(f"parameter {key!r} is given twice")
        arguments[key] = value.removeprefix("\n").removesuffix("\n")
    if _XML_PARAMETER.sub("", body).strip():
        raise ValueError("text outside the <parameter=ARGUMENT>...</parameter> blocks")
    return name, arguments


_MARKUPS: dict[ToolFormat, _Markup] = {
    "hermes": _Markup(
        block=re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL),
        opening="<tool_call>",
        unclosed="a <tool_call> block was not closed with </tool_call>",
        read=_read_hermes,
        example='<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n'
        "</tool_call>",
    ),
    "xml": _Markup(
        block=re.compile(r"(<function=.*?</function>)", re.DOTALL),
        opening="<function=",
        unclosed="a <function=NAME> block was not closed with </function>",
        read=_read_xml,
        example="<function=TOOL_NAME>\n<parameter=ARGUMENT_NAME>\nvalue\n</parameter>\n"
        "</function>\nwith one parameter block per argument.",
    ),
}


def tool_system_prompt(tools: Sequence[dict], format: ToolFormat = CHAT_API_FORMAT) -> str:
    schemas = "\n".join(json.dumps(tool, separators=(",", ":")) for tool in tools)
    return (
        "You may call tools. Their JSON schemas:\n<tools>\n"
        f"{schemas}\n</tools>\n"
        f"To call one, write:\n{_MARKUPS[format].example}"
    )


def with_tool_prompt(
    messages: list[Message], tools: Sequence[dict], format: ToolFormat = CHAT_API_FORMAT
) -> list[Message]:
    """`messages` with the tools and how to call them after their system prompt, or as one."""
    block = tool_system_prompt(tools, format)
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def parse_tool_calls(text: str, format: ToolFormat = CHAT_API_FORMAT) -> ParsedToolCalls:
    """The calls written in `format` in a reply's text; a malformed one is an error the
    model is told, not a call."""
    markup = _MARKUPS[format]
    blocks = markup.block.findall(text)
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    for block in blocks:
        try:
            name, arguments = markup.read(block)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as error:
            errors.append(f"invalid tool call {block[:200]!r}: {error}")
            continue
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": _json(arguments)},
            }
        )
    if text.count(markup.opening) > len(blocks):
        errors.append(markup.unclosed)
    content = markup.block.sub("", text).strip() if calls else text
    return ParsedToolCalls(content=content, tool_calls=calls, errors=errors)


def tool_call_markup(content: str | None, tool_calls: Sequence[dict[str, Any]]) -> str:
    """An assistant turn's content with its OpenAI `tool_calls` written as Hermes blocks.

    The inverse of `parse_tool_calls` for text the policy wrote in the canonical form
    (the calls after the text, one block each, JSON as `json.dumps` writes it): such text
    renders back token for token. Content that already holds `<tool_call>` blocks (a
    reinforge reply keeps its raw text) is returned as it is.
    """
    text = content or ""
    if "<tool_call>" in text:
        return text
    blocks = [_hermes_block(call) for call in tool_calls]
    return "\n".join([text, *blocks] if text else blocks)


def _hermes_block(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    if not isinstance(arguments, str):  # some clients send the object itself
        arguments = _json(arguments)
    name = _json(function.get("name", ""))
    return f'<tool_call>\n{{"name": {name}, "arguments": {arguments}}}\n</tool_call>'


def _dict_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as error:
        raise TemplateError(f"tool call arguments are not valid JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise TemplateError("tool call arguments must be a JSON object")
    return {**call, "function": {**function, "arguments": parsed}}


def _json(value: Any) -> str:
    """JSON as Hugging Face's `tojson` writes it, the form templates teach models."""
    return json.dumps(value, ensure_ascii=False)


def _plain(message: Message) -> Message:
    """Templates expect string content; OpenAI allows None beside tool_calls."""
    if message.get("content") is None:
        return {**message, "content": ""}
    return message
