"""What a request to the policy server may hold: the OpenAI-shaped request models and the
checks on messages and tools. A request it refuses is an `APIError` naming the field
(`api_errors.py`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reinforge.policy.api_errors import bad_request
from reinforge.policy.config import Temperature, TopP
from reinforge.policy.weight_buckets import Entry
from reinforge.types import Message

_ROLES = ("system", "developer", "user", "assistant", "tool")
"""Message roles the server renders; `developer` (OpenAI's newer name) renders as system."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    """A last chunk, with no choices, carries the request's `usage`."""


class SamplingRequest(BaseModel):
    """Fields shared by both endpoints. A field the server does not take, or a value it
    cannot honour, is refused with a 400 naming it: a client that asked for something must
    not get something else without knowing. A setting left out takes the server's
    configured default (`ServerConfig`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: list[str] | None = None
    n: int = Field(1, ge=1, le=64)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    """OpenAI's range, a signed 64-bit integer; choice i draws with `seed + i`."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    """Only 0: the engines sample from the policy's own distribution."""
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    """Only 0, as `presence_penalty`."""
    logit_bias: dict[str, float] | None = None
    """Only empty, as `presence_penalty`."""
    user: str | None = None
    """Ignored: an end user's id, which OpenAI keeps for abuse monitoring; it changes no
    token."""
    prompt_logprobs: int | None = Field(None, ge=0)
    """vLLM's extension: each prompt token's log-prob, with this many alternatives."""
    prompt_token_ids: list[int] | None = None
    stop_loops: bool | None = None
    """Extension: end a choice where its tail loops, with finish reason "loop"."""

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if value is not None and not (
            isinstance(value, list)
            and len(value) <= 4
            and all(isinstance(s, str) and s for s in value)
        ):
            raise ValueError("stop takes a string or a list of at most 4 non-empty strings")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def prompt_alternatives(self) -> int | None:
        """The alternatives to score the prompt with; None: the prompt is not scored."""
        return self.prompt_logprobs

    def check_supported(self) -> None:
        """Refuse, naming the field, what the engines cannot do rather than ignore it."""
        for field in ("presence_penalty", "frequency_penalty"):
            if getattr(self, field):
                raise bad_request(
                    f"{field} is not supported: the engines sample from the policy's own "
                    "distribution (send 0 or leave it out)",
                    field,
                )
        if self.logit_bias:
            raise bad_request(
                "logit_bias is not supported: the engines sample from the policy's own "
                "distribution (send {} or leave it out)",
                "logit_bias",
            )
        if None not in (self.max_tokens, self.max_completion_tokens) and (
            self.max_tokens != self.max_completion_tokens
        ):
            raise bad_request(
                "max_tokens and max_completion_tokens differ: send one of them",
                "max_completion_tokens",
            )
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options needs stream=true", "stream_options")
        if self.prompt_logprobs is not None and self.stream:
            raise bad_request(
                "prompt_logprobs are not streamed: send stream=false", "prompt_logprobs"
            )


_TOOL_CHOICES = ("auto", "none")
"""The `tool_choice` values the server honours: it samples freely, so it cannot force a
call ("required", a named function) without changing the tokens or their log-probs."""


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    json_schema: dict[str, Any] | None = None


class ChatRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    """"auto" (the default) or "none": the tools are not offered and no call is parsed."""
    parallel_tool_calls: bool | None = None
    """Only true (the default): every well-formed call in a reply is returned."""
    response_format: ResponseFormat | None = None
    """Only {"type": "text"}: nothing constrains the sampled text."""
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)

    alternatives_field: ClassVar[str] = "top_logprobs"
    """The field asking for each token's most likely alternatives (`alternatives` of them)."""

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str | dict):
            raise ValueError("tool_choice must be a string or an object")
        return value

    @property
    def alternatives(self) -> int:
        return self.top_logprobs or 0

    @property
    def offers_tools(self) -> bool:
        """Whether the prompt shows the tools and the reply is parsed for calls."""
        return bool(self.tools) and self.tool_choice != "none"

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        if self.tool_choice is not None and self.tool_choice not in _TOOL_CHOICES:
            raise bad_request(
                f"tool_choice {self.tool_choice!r} is not supported: the server samples "
                "freely and cannot force a tool call without changing the sampled tokens or "
                "their log-probs; send 'auto' or 'none'",
                "tool_choice",
            )
        if self.parallel_tool_calls is False:
            raise bad_request(
                "parallel_tool_calls=false is not supported: the server cannot keep the "
                "policy from writing several calls; send true or leave it out",
                "parallel_tool_calls",
            )
        form = self.response_format
        if form is not None and (form.type != "text" or form.json_schema is not None):
            raise bad_request(
                'only response_format {"type": "text"} is supported (or none): the server '
                "samples freely and cannot promise JSON or any other format without "
                "changing the sampled tokens or their log-probs",
                "response_format",
            )


class PauseRequest(BaseModel):
    """A trainer holding decoding while it trains (partial mode)."""

    model_config = ConfigDict(extra="forbid")

    lease_s: float = Field(gt=0)
    """Decoding resumes on its own after this many seconds without a resume."""


class BucketEntry(BaseModel):
    """Where one tensor lies in its bucket (`weight_buckets.Entry`), as a manifest gives it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    dtype: str
    """torch's name of it: float32, bfloat16, ..."""
    shape: list[Annotated[int, Field(ge=0)]]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)

    @field_validator("dtype")
    @classmethod
    def _a_torch_dtype(cls, name: str) -> str:
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"{name!r} is not a torch dtype")
        return name


Manifest = list[Annotated[list[BucketEntry], Field(min_length=1)]]
"""Each bucket's entries, in order (`weight_buckets.manifest`)."""


def entries_of(manifest: Manifest) -> list[tuple[Entry, ...]]:
    return [
        tuple(Entry(e.name, e.dtype, tuple(e.shape), e.offset, e.nbytes) for e in bucket)
        for bucket in manifest
    ]


class WeightsUpdate(BaseModel):
    """A trainer's new weights, handed over as a file on this machine (in memory under
    /dev/shm where there is one): no tensor data crosses HTTP."""

    model_config = ConfigDict(extra="forbid")

    path: str
    """A safetensors file of the model's parameters, under their plain names; with
    `buckets`, those buckets' bytes one after another instead."""
    version: int = Field(ge=0)
    """The policy version the trainer gives these weights; tokens sampled after the update
    carry it."""
    buckets: Manifest | None = Field(None, min_length=1)
    """The manifest of the buckets `path` holds (`weight_buckets.manifest`): how a Ray
    engine's actor hands over what it took from the object store, written in place
    without a file format's copies."""


class GroupJoin(BaseModel):
    """Join the trainer's weights group (`weight_group.py`): the weights then come as
    broadcasts over it, announced by `WeightsBroadcast`."""

    model_config = ConfigDict(extra="forbid")

    host: str
    """Where the trainer's rendezvous store listens, and the address the group's
    connections use."""
    port: int = Field(ge=1, le=65535)
    group: str
    """The group's name: a new one each time the trainer forms it."""
    rank: int = Field(ge=1)
    size: int = Field(ge=2)
    timeout_s: float = Field(gt=0)
    """Joining, and each broadcast, fails past it."""


class WeightsBroadcast(BaseModel):
    """The trainer broadcasts its weights over group `group` now, in buckets laid out as
    `buckets` says (`weight_buckets.manifest`)."""

    model_config = ConfigDict(extra="forbid")

    group: str
    version: int = Field(ge=0)
    buckets: Manifest = Field(min_length=1)


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] = ""
    logprobs: int | None = Field(None, ge=0)
    """The sampled tokens' log-probs (with `echo`, the prompt's before them), with this
    many alternatives each."""
    echo: bool = False
    """The prompt before the completion in `text`, and with `logprobs` its tokens' log-probs
    before the completion's. With `max_tokens: 0`, the prompt scored and nothing sampled."""
    max_tokens: int | None = Field(None, ge=0)
    """0 only with `echo`."""

    alternatives_field: ClassVar[str] = "logprobs"

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        ids = isinstance(value, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value
        )
        if not (isinstance(value, str) or ids):
            raise ValueError("prompt must be a string or a list of token ids")
        return value

    @property
    def alternatives(self) -> int:
        return self.logprobs or 0

    @property
    def prompt_alternatives(self) -> int | None:
        """An echo with `logprobs` scores the prompt too; one forward serves both fields."""
        if not self.echo or self.logprobs is None:
            return self.prompt_logprobs
        return max(self.logprobs, self.prompt_logprobs or 0)

    def check_supported(self) -> None:
        super().check_supported()
        if self.max_tokens == 0 and not self.echo:
            raise bad_request(
                "max_tokens=0 samples nothing: send echo=true to score the prompt", "max_tokens"
            )
        if self.echo and self.stream:
            raise bad_request("echo is not streamed: send stream=false", "stream")
        if self.prompt_token_ids is not None and self.prompt:
            raise bad_request(
                "send the prompt as prompt or as prompt_token_ids, not both", "prompt_token_ids"
            )


def chat_messages(raw: list[dict[str, Any]]) -> list[Message]:
    """The messages as the chat template takes them: a known role and text content.

    What the template cannot render is refused here with the field named, not left to
    fail inside the template as "chat template failed".
    """
    return [_chat_message(f"messages[{i}]", message) for i, message in enumerate(raw)]


def _chat_message(where: str, message: dict[str, Any]) -> Message:
    role = message.get("role")
    if role not in _ROLES:
        known = ", ".join(repr(r) for r in _ROLES)
        got = "none" if role is None else repr(role)
        raise bad_request(f"{where}.role must be one of {known}; got {got}", f"{where}.role")
    # OpenAI lets an assistant message leave out its content (beside tool_calls).
    content = _text_content(message.get("content"), f"{where}.content", role == "assistant")
    given = {key: value for key, value in message.items() if value is not None}  # null: absent
    normal = {**given, "role": "system" if role == "developer" else role, "content": content}
    if role == "assistant" and message.get("tool_calls") is not None:
        _check_tool_calls(message["tool_calls"], f"{where}.tool_calls")
    return normal


def _text_content(content: Any, where: str, optional: bool) -> str | None:
    """String content as it is; OpenAI's list of parts as its text parts joined with a
    newline (as vLLM joins them). Other parts (images, audio) have no tokens here."""
    if isinstance(content, str) or (content is None and optional):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text parts", where)
    texts: list[str] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise bad_request(
                f"{where}[{index}].type is {kind!r}: only text content parts "
                '({"type": "text", "text": ...}) are supported',
                f"{where}[{index}].type",
            )
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{index}].text must be a string", f"{where}[{index}].text")
        texts.append(part["text"])
    return "\n".join(texts)


def _check_tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list of tool calls", where)
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        field = f"{where}[{index}].function"
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"{field} must be an object with a string name", field)
        if not isinstance(function.get("arguments", ""), str | dict):
            raise bad_request(f"{field}.arguments must be a JSON string", f"{field}.arguments")


def checked_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools in OpenAI's schema; one without a named function would reach the prompt as a
    schema the policy cannot call."""
    for index, tool in enumerate(tools or []):
        where = f"tools[{index}]"
        if tool.get("type", "function") != "function":
            raise bad_request(f"{where}.type must be 'function'", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict) or not function.get("name"):
            raise bad_request(
                f'{where}.function must be an object with a name: {{"type": "function", '
                '"function": {"name": ..., "parameters": {...}}}',
                f"{where}.function",
            )
    return tools
