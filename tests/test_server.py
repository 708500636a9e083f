"""The real `reinforge serve` process, spoken to by the official openai client; and the
same app in process over a scripted tiny model, for what a random model never writes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
import torch

from reinforge.policy.config import EngineConfig, ServerConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model, load_tokenizer
from reinforge.policy.repetition import tail_loop
from reinforge.policy.server import create_app

from .commands import serving
from .conftest import EngineUnderTest, http_server

USER = {"role": "user", "content": "What is 2 + 2?"}
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving() as url:
        yield url


@pytest.fixture
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


class ScriptedModel(torch.nn.Module):
    """The tiny random model, made to sample a script: a random model never writes a tool
    call. While `script` holds tokens, each forward (one per sampled token of the one
    request in flight) leaves the next scripted token the only one it can sample."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner, self.config = model, model.config
        self.generation_config = model.generation_config
        self.script: list[int] = []

    @property
    def device(self) -> torch.device:  # where the engine computes, as a model says
        return self.inner.device

    @property
    def dtype(self) -> torch.dtype:  # what its KV states are held in, as a model says
        return self.inner.dtype

    def forward(self, **inputs: Any) -> Any:
        output = self.inner(**inputs)
        if self.script:
            forced = torch.full_like(output.logits[:, -1], float("-inf"))
            forced[:, self.script.pop(0)] = 0.0
            output.logits[:, -1] = forced
        return output


@pytest.fixture(scope="module")
def scripted_engine() -> Iterator[tuple[Engine, ScriptedModel]]:
    model, tokenizer = load_model("tiny-random")
    scripted = ScriptedModel(model)
    engine = Engine(scripted, tokenizer, "tiny-random", EngineConfig())  # type: ignore[arg-type]
    yield engine, scripted
    engine.close()


@pytest_asyncio.fixture
async def scripted(
    scripted_engine: tuple[Engine, ScriptedModel],
) -> AsyncIterator[tuple[ScriptedModel, openai.AsyncOpenAI]]:
    """The server's app in process (the transport PolicyClient uses), over the scripted
    model, spoken to by the official openai client."""
    engine, model = scripted_engine
    transport = httpx.ASGITransport(app=create_app(engine, ServerConfig()))
    http = httpx.AsyncClient(transport=transport, base_url="http://engine/v1")
    client = openai.AsyncOpenAI(
        base_url="http://engine/v1", api_key="none", http_client=http, max_retries=0
    )
    yield model, client
    model.script.clear()  # a failed test must not script the next one
    await client.close()


def script(text: str) -> list[int]:
    """The tokens of `text` as the template would render them, then EOS: a turn the
    policy ended itself."""
    tokenizer = load_tokenizer("tiny-random")
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def test_chat_with_n_and_logprobs_returns_token_ids(client):
    response = client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "Hello!"}],
        n=2,
        logprobs=True,
        max_tokens=5,
        seed=1,
    )
    assert len(response.choices) == 2
    extra = response.model_extra
    assert extra["policy_version"] == 0 and len(extra["prompt_token_ids"]) > 0
    for choice in response.choices:
        ids = choice.model_extra["token_ids"]
        assert len(ids) == 5 == len(choice.logprobs.content)
        assert choice.finish_reason == "length"
        assert all(lp.logprob <= 0 for lp in choice.logprobs.content)
    assert response.usage.completion_tokens == 10


def test_continuation_from_prompt_token_ids_extends_the_exact_tokens(client):
    first = client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        seed=2,
    )
    sampled = first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"]
    raw = first.choices[0].model_extra["raw_text"]
    second = client.chat.completions.create(
        model="tiny-random",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": raw},
            {"role": "user", "content": "More"},
        ],
        max_tokens=4,
        extra_body={"prompt_token_ids": sampled},
    )
    prompt = second.model_extra["prompt_token_ids"]
    assert prompt[: len(sampled)] == sampled
    tail = load_tokenizer("tiny-random").decode(prompt[len(sampled) :])
    # The sampled turn did not end with EOS, so the template closes it, then the new turn.
    assert tail == "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"


def test_text_completions(client):
    response = client.completions.create(
        model="tiny-random", prompt="Once upon a time", max_tokens=3, logprobs=0, seed=0
    )
    choice = response.choices[0]
    assert len(choice.model_extra["token_ids"]) == 3 == len(choice.logprobs.token_logprobs)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list()] == ["tiny-random"]
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": -5}, "max_tokens"),
        ({"temperature": 3.5}, "temperature"),
        ({"n": 0}, "n"),
        ({"top_p": 0}, "top_p"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0].role"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
        ({"max_tokens": 100_000}, "messages"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop_loops": "sometimes"}, "stop_loops"),
        ({"seed": 2**63}, "seed"),  # past 64 bits, signed as OpenAI's
        ({"seed": -(2**63) - 1}, "seed"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": 3}, "tool_choice"),
        ({"stop": 5}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
        ({"top_k": 40}, "top_k"),
        ({"messages": [{"role": "user", "content": [1]}]}, "messages[0].content[0].type"),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]},
            "messages[0].tool_calls[0].function",
        ),
    ],
)
def test_bad_requests_get_openai_errors_with_4xx(server, body, param):
    request = {"model": "tiny-random", "messages": [{"role": "user", "content": "x"}], **body}
    response = httpx.post(f"{server}/v1/chat/completions", json=request)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "Traceback" not in response.text


def test_seeds_at_either_end_of_64_bits_sample(client):
    for seed in (2**63 - 1, -(2**63)):  # choice i draws with seed + i
        response = client.chat.completions.create(
            model="tiny-random", messages=[USER], n=2, max_tokens=2, seed=seed
        )
        assert [len(c.model_extra["token_ids"]) for c in response.choices] == [2, 2]


BIG = 8 * 2**20
"""A request body past `server.max_request_bytes` (4 MiB)."""


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v1/no-such-route", None, 404),
        ("GET", "/v1/chat/completions", None, 405),
        ("DELETE", "/health", None, 405),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400),
        ("POST", "/v1/chat/completions", b'{"messages": []}', 400),  # no model
        ("POST", "/v1/completions", b'{"model": "tiny-random", "n": "many"}', 400),
        ("POST", "/v1/weights", b'{"path": "w.safetensors", "version": 1}', 403),
        ("POST", "/v1/chat/completions", b"x" * BIG, 413),
    ],
)
def test_every_error_is_openai_error_json(server, method, path, body, status):
    headers = {"content-type": "application/json"}
    response = httpx.request(method, f"{server}{path}", content=body, headers=headers, timeout=60)
    assert response.status_code == status
    assert list(response.json()) == ["error"]
    error = response.json()["error"]
    assert sorted(error) == ["code", "message", "param", "type"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_body_past_the_limit_is_refused_before_it_is_read(server):
    def chunks() -> Iterator[bytes]:  # no Content-Length: refused once the limit is passed
        yield b'{"model": "tiny-random", "messages": [{"role": "user", "content": "'
        yield from [b"x" * 2**16] * (BIG // 2**16)
        yield b'"}]}'

    for content in (b"x" * BIG, chunks()):
        response = httpx.post(f"{server}/v1/chat/completions", content=content, timeout=60)
        assert response.status_code == 413
        error = response.json()["error"]
        assert error["code"] == "request_entity_too_large"
        assert "at most 4194304 bytes (server.max_request_bytes)" in error["message"]


def test_health_answers_within_a_second_while_a_long_prompt_is_tokenised(server):
    """A 3.5 MB message, under the body limit, takes seconds to tokenise (3 million
    tokens); it happens off the event loop, so /health keeps answering. The slowest probe of
    each try must be under a second; a loaded machine may delay one, so the best of three
    tries counts."""
    content = " ".join(f"{i * 2654435761 % 2**32:x}" for i in range(400_000))[:3_500_000]
    request = {"model": "tiny-random", "messages": [{"role": "user", "content": content}]}
    slowest_per_try = []
    for _ in range(3):
        with ThreadPoolExecutor(1) as pool:
            url = f"{server}/v1/chat/completions"
            refused = pool.submit(httpx.post, url, json=request, timeout=120)
            probes = []
            while not refused.done():
                started = time.monotonic()
                httpx.get(f"{server}/health", timeout=60)
                probes.append(time.monotonic() - started)
        assert refused.result().json()["error"]["code"] == "context_length_exceeded"
        slowest_per_try.append(max(probes))
        if slowest_per_try[-1] < 1.0:
            break
    assert min(slowest_per_try) < 1.0, slowest_per_try


async def test_an_unexpected_error_is_a_500_in_openai_json_also_in_process(tiny_engine):
    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(tiny_engine, name)

        async def generate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("engine bug")

    transport = httpx.ASGITransport(app=create_app(Broken(), ServerConfig()))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        request = {"model": "tiny-random", "messages": [USER], "max_tokens": 1}
        response = await http.post("/v1/chat/completions", json=request)
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "internal error: RuntimeError: engine bug",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def test_max_tokens_negative_via_the_openai_client(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "x"}], max_tokens=-5
        )
    assert caught.value.status_code == 400


def test_context_too_long_is_named(server):
    request = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 100_000,
    }
    error = httpx.post(f"{server}/v1/chat/completions", json=request).json()["error"]
    assert error["code"] == "context_length_exceeded"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


def test_malformed_json_is_400_saying_so_without_a_param(server):
    response = httpx.post(
        f"{server}/v1/chat/completions",
        content=b'{"model": "tiny-random", "messages": [}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("request body is not valid JSON: ")
    assert error["param"] is None and error["type"] == "invalid_request_error"


def test_non_text_content_parts_are_refused_naming_the_part(client):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    content = [{"type": "text", "text": "What is this?"}, image]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": content}], max_tokens=1
        )
    assert caught.value.param == "messages[0].content[1].type"
    assert "image_url" in caught.value.message and "text" in caught.value.message


def test_text_content_parts_are_joined_with_newlines(client):
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    prompts = [
        client.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": content}], max_tokens=1
        ).model_extra["prompt_token_ids"]
        for content in (parts, "Hello\nthere")
    ]
    assert prompts[0] == prompts[1]


@pytest.fixture(scope="module")
def any_client(any_engine: EngineUnderTest) -> Iterator[openai.OpenAI]:
    """The official client of the server over each engine in turn."""
    with http_server(any_engine.engine) as url:
        yield openai.OpenAI(base_url=url, api_key="none", max_retries=0)


def test_top_logprobs_with_the_openai_client(any_client):
    # Greedy, so the sampled token is the most likely: its own entry comes first.
    response = any_client.chat.completions.create(
        model="tiny-random",
        messages=[USER],
        logprobs=True,
        top_logprobs=3,
        max_tokens=4,
        temperature=0,
    )
    entries = response.choices[0].logprobs.content
    tokenizer = load_tokenizer("tiny-random")
    token_ids = response.choices[0].model_extra["token_ids"]
    assert [e.token for e in entries] == [tokenizer.decode([t]) for t in token_ids]
    for entry in entries:
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        first = entry.top_logprobs[0]
        assert (first.token, first.logprob, first.bytes) == (
            entry.token,
            entry.logprob,
            entry.bytes,
        )

    text = any_client.completions.create(
        model="tiny-random", prompt="Once upon a time", logprobs=2, max_tokens=3, temperature=0
    )
    logprobs = text.choices[0].logprobs
    assert len(logprobs.top_logprobs) == 3 == len(logprobs.tokens)
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        # OpenAI's legacy shape: the k most likely tokens and the sampled one, by text.
        assert top[token] == logprob == max(top.values()) and len(top) == 2


def test_echo_scores_the_prompt_as_a_plain_forward_does(any_client, any_engine):
    # OpenAI's legacy scoring call, which a teacher answers: prompt log-probs, none sampled.
    prompt = list(range(40, 60))
    response = any_client.completions.create(
        model="tiny-random", prompt=prompt, max_tokens=0, echo=True, logprobs=2
    )
    (choice,) = response.choices
    logprobs = choice.logprobs
    tokenizer = load_tokenizer("tiny-random")
    assert choice.text == tokenizer.decode(prompt) and choice.model_extra["token_ids"] == []
    assert response.usage.completion_tokens == 0 and response.usage.prompt_tokens == len(prompt)
    assert logprobs.tokens == [tokenizer.decode([t]) for t in prompt]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = any_engine.forced_logprobs(prompt[:1], prompt[1:])
    given = torch.tensor(logprobs.token_logprobs[1:])
    torch.testing.assert_close(given, expected, rtol=1e-4, atol=1e-5)
    for token, logprob, top in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert top[token] == logprob and len(top) in (2, 3)  # the 2 likeliest and its own
    lengths = [len(t) for t in logprobs.tokens]
    assert logprobs.text_offset == [sum(lengths[:i]) for i in range(len(prompt))]


def test_stop_loops_ends_a_looping_choice_with_finish_reason_loop(any_client, any_engine):
    # Greedy, the tiny random model soon repeats one token over and over: a 1-token unit
    # becomes a loop at its 32nd copy (the tail rule's 32-token span), well before 96.
    greedy = {"model": "tiny-random", "max_tokens": 96, "temperature": 0}
    full = any_client.chat.completions.create(messages=[USER], logprobs=True, **greedy)
    stopped = any_client.chat.completions.create(
        messages=[USER], logprobs=True, extra_body={"stop_loops": True}, **greedy
    )
    _, sampled = any_engine.engine.log[-1]
    (choice,) = stopped.choices
    token_ids = choice.model_extra["token_ids"]
    assert full.choices[0].finish_reason == "length" and choice.finish_reason == "loop"
    # exactly what the engine sampled, up to the first token whose tail loops
    assert token_ids == sampled.token_ids and len(token_ids) < 96
    assert [entry.logprob for entry in choice.logprobs.content] == sampled.logprobs
    assert tail_loop(token_ids) is not None and tail_loop(token_ids[:-1]) is None
    # ... and a prefix of what the same request samples without stopping
    assert full.choices[0].model_extra["token_ids"][: len(token_ids)] == token_ids

    # The completions API takes it too, and a stream ends on the same reason.
    streamed = any_client.completions.create(
        prompt="Once upon a time", stream=True, extra_body={"stop_loops": True}, **greedy
    )
    (last,) = [c.choices[0] for c in streamed if c.choices and c.choices[0].finish_reason]
    assert last.finish_reason == "loop" and len(last.model_extra["token_ids"]) < 96
    assert last.model_extra["token_ids"] == any_engine.engine.log[-1][1].token_ids


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"echo": True, "max_tokens": 0, "stream": True}, "stream"),
        ({"echo": True, "max_tokens": 3, "stream": True}, "stream"),
        ({"echo": True, "max_tokens": 0, "logprobs": 21}, "logprobs"),
        ({"echo": True, "max_tokens": 0, "prompt": [1, 10**6]}, "prompt_token_ids"),
        ({"prompt": "x", "prompt_token_ids": [1, 2]}, "prompt_token_ids"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ],
)
def test_echo_requests_it_cannot_serve_are_refused_naming_the_field(server, body, param):
    request = {"model": "tiny-random", "prompt": [1, 2, 3], "logprobs": 0, **body}
    response = httpx.post(f"{server}/v1/completions", json=request)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_tool_choice_none_offers_no_tools_and_auto_offers_them(client):
    def prompt(**fields: Any) -> list[int]:
        reply = client.chat.completions.create(
            model="tiny-random", messages=[USER], max_tokens=1, **fields
        )
        return reply.model_extra["prompt_token_ids"]

    plain, offered = prompt(), prompt(tools=TOOLS)
    assert offered != plain and prompt(tools=TOOLS, tool_choice="auto") == offered
    assert prompt(tools=TOOLS, tool_choice="none") == plain
    assert prompt(tool_choice="none") == plain == prompt(tool_choice="auto")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calc"}}])
def test_a_tool_choice_that_forces_a_call_is_refused_naming_it(client, choice):
    # Forcing a call means writing tokens the policy did not sample, or masking logits,
    # which makes every reported log-prob something other than the policy's.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny-random", messages=[USER], tools=TOOLS, tool_choice=choice, max_tokens=1
        )
    assert caught.value.param == "tool_choice" and "'auto' or 'none'" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny-random", messages=[USER], tools=TOOLS, parallel_tool_calls=False
        )
    assert caught.value.param == "parallel_tool_calls"


async def test_with_tool_choice_none_a_call_the_policy_writes_stays_its_text(scripted):
    model, client = scripted
    model.script = script(CALL)
    reply = await client.chat.completions.create(
        model="tiny-random", messages=[USER], tools=TOOLS, tool_choice="none", max_tokens=64
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == CALL == choice.model_extra["raw_text"]


def test_response_format_text_is_taken_and_json_formats_are_refused(client):
    text = client.chat.completions.create(
        model="tiny-random",
        messages=[USER],
        response_format={"type": "text"},
        max_tokens=2,
        seed=4,
    )
    plain = client.chat.completions.create(
        model="tiny-random", messages=[USER], max_tokens=2, seed=4
    )
    assert text.choices[0].model_extra["token_ids"] == plain.choices[0].model_extra["token_ids"]
    schema = {"name": "answer", "schema": {"type": "object"}}
    for form in ({"type": "json_object"}, {"type": "json_schema", "json_schema": schema}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="tiny-random", messages=[USER], response_format=form, max_tokens=2
            )
        assert caught.value.param == "response_format"
        assert '{"type": "text"}' in caught.value.message


def test_a_field_the_server_does_not_take_is_refused_naming_it(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny-random", messages=[USER], max_tokens=1, extra_body={"top_k": 5}
        )
    assert caught.value.param == "top_k" and "not a field" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny-random", prompt="x", max_tokens=1, best_of=2)
    assert caught.value.param == "best_of"


def reference_logprobs(any_engine: EngineUnderTest, token_ids: list[int]) -> torch.Tensor:
    """log p(every token | the ids before position i) for i = 1 .. n-1: (n-1, V), a plain
    forward of the weights the engine serves."""
    with torch.no_grad():
        logits = any_engine.reference(input_ids=torch.tensor([token_ids])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


def check_prompt_logprobs(
    any_engine: EngineUnderTest, prompt: list[int], scores: list[Any], k: int
) -> None:
    """vLLM's shape: None, then per token {id: {logprob, rank, decoded_token}} holding the
    prompt's token (its rank among all) and the k most likely (ranks 1 to k)."""
    assert len(scores) == len(prompt) and scores[0] is None
    tokenizer = load_tokenizer("tiny-random")
    reference = reference_logprobs(any_engine, prompt)
    own = torch.tensor([scores[i][str(t)]["logprob"] for i, t in enumerate(prompt) if i])
    expected = reference.gather(1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(own, expected, rtol=1e-4, atol=1e-5)
    for token, entry, row in zip(prompt[1:], scores[1:], reference, strict=True):
        mine = entry[str(token)]
        assert mine["decoded_token"] == tokenizer.decode([token])
        # ties within float rounding may fall either way between two engines
        at_least, at_most = (
            (row > mine["logprob"] + 1e-4).sum(),
            (row >= mine["logprob"] - 1e-4).sum(),
        )
        assert at_least + 1 <= mine["rank"] <= at_most
        others = sorted((e for t, e in entry.items() if t != str(token)), key=lambda e: e["rank"])
        ranks = sorted({e["rank"] for e in entry.values() if e["rank"] <= k})
        assert ranks == list(range(1, k + 1)) and len(entry) in (k, k + 1)
        assert [e["logprob"] for e in others] == sorted(
            (e["logprob"] for e in others), reverse=True
        )
        if k:  # the most likely token there
            best = max(e["logprob"] for e in entry.values())
            torch.testing.assert_close(torch.tensor(best), row.max(), rtol=1e-4, atol=1e-5)


def test_prompt_logprobs_on_both_routes_with_ranks_and_alternatives(any_client, any_engine):
    chat = any_client.chat.completions.create(
        model="tiny-random", messages=[USER], max_tokens=2, extra_body={"prompt_logprobs": 2}
    )
    prompt = chat.model_extra["prompt_token_ids"]
    check_prompt_logprobs(any_engine, prompt, chat.model_extra["prompt_logprobs"], 2)

    text = any_client.completions.create(
        model="tiny-random",
        prompt=list(range(40, 52)),
        max_tokens=2,
        n=2,
        extra_body={"prompt_logprobs": 0},
    )
    for choice in text.choices:  # on each choice, as vLLM's completions have them
        check_prompt_logprobs(
            any_engine, list(range(40, 52)), choice.model_extra["prompt_logprobs"], 0
        )
    assert (
        "prompt_logprobs"
        not in any_client.completions.create(model="tiny-random", prompt="x", max_tokens=1)
        .choices[0]
        .model_extra
    )


def test_echo_with_sampling_returns_prompt_and_completion_log_probs(any_client, any_engine):
    # OpenAI's legacy echo: text = prompt + completion; log-probs cover both, the first
    # prompt token's null; the completion is what the same seed samples without echo.
    prompt = list(range(40, 52))
    request = {"model": "tiny-random", "prompt": prompt, "max_tokens": 3, "logprobs": 2, "seed": 7}
    echoed = any_client.completions.create(echo=True, **request)
    plain = any_client.completions.create(**request).choices[0]
    (choice,) = echoed.choices
    sampled = choice.model_extra["token_ids"]
    assert sampled == plain.model_extra["token_ids"] and len(sampled) == 3
    tokenizer = load_tokenizer("tiny-random")
    assert choice.text == tokenizer.decode(prompt) + plain.text
    assert choice.model_extra["raw_text"] == plain.model_extra["raw_text"]
    assert echoed.usage.completion_tokens == 3 and echoed.usage.prompt_tokens == len(prompt)
    logprobs = choice.logprobs
    assert logprobs.tokens == [tokenizer.decode([t]) for t in prompt + sampled]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    scored = torch.tensor(logprobs.token_logprobs[1 : len(prompt)])
    expected = any_engine.forced_logprobs(prompt[:1], prompt[1:])
    torch.testing.assert_close(scored, expected, rtol=1e-4, atol=1e-5)
    # the completion's log-probs as without echo, within rounding: scoring the prompt runs
    # its prefill in another shape, which gives the same bits at some thread counts only
    completion = logprobs.token_logprobs[len(prompt) :]
    torch.testing.assert_close(completion, plain.logprobs.token_logprobs, rtol=1e-4, atol=1e-5)
    for echoed_top, plain_top in zip(
        logprobs.top_logprobs[len(prompt) :], plain.logprobs.top_logprobs, strict=True
    ):
        assert echoed_top.keys() == plain_top.keys()
        torch.testing.assert_close(echoed_top, plain_top, rtol=1e-4, atol=1e-5)
    for token, logprob, top in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert top[token] == logprob and len(top) in (2, 3)
    lengths = [len(t) for t in logprobs.tokens]
    assert logprobs.text_offset == [sum(lengths[:i]) for i in range(len(lengths))]
    # without logprobs, the text alone
    bare = any_client.completions.create(echo=True, **{**request, "logprobs": None})
    assert bare.choices[0].text == choice.text and bare.choices[0].logprobs is None


def test_top_logprobs_past_the_limit_are_refused_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny-random", messages=[USER], logprobs=True, top_logprobs=21, max_tokens=1
        )
    assert caught.value.param == "top_logprobs" and "at most 20" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny-random", prompt="x", logprobs=21, max_tokens=1)
    assert caught.value.param == "logprobs"
    response = client.chat.completions.create(
        model="tiny-random", messages=[USER], logprobs=True, top_logprobs=0, max_tokens=2
    )
    assert [entry.top_logprobs for entry in response.choices[0].logprobs.content] == [[], []]


def test_streaming_with_the_openai_client_n_2(client):
    stream = client.chat.completions.create(
        model="tiny-random",
        messages=[USER],
        n=2,
        max_tokens=6,
        logprobs=True,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts, entries, last = {0: "", 1: ""}, {0: [], 1: []}, {}
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk"
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            entries[choice.index] += choice.logprobs.content if choice.logprobs else []
            if choice.finish_reason is not None:
                last[choice.index] = (chunk, choice)
    assert sorted(last) == [0, 1]
    tokenizer = load_tokenizer("tiny-random")
    for index, (chunk, choice) in last.items():
        extra = choice.model_extra
        assert texts[index] == extra["raw_text"] == tokenizer.decode(extra["token_ids"])
        assert len(extra["token_ids"]) == len(entries[index]) == 6 == len(extra["policy_versions"])
        assert all(entry.logprob <= 0 for entry in entries[index])
        assert chunk.model_extra["prompt_token_ids"] and chunk.model_extra["policy_version"] == 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_a_stream_is_server_sent_events_ending_with_done(server):
    request = {"model": "tiny-random", "prompt": "Once", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    final = chunks[-1]["choices"][0]
    assert final["finish_reason"] == "length" and len(final["token_ids"]) == 3
    assert "".join(c["choices"][0]["text"] for c in chunks) == final["raw_text"]


async def test_a_tool_call_sent_back_as_history_renders_to_the_sampled_tokens(scripted):
    # An OpenAI client sends a call back as the parsed message (content None beside
    # tool_calls), not as the text that was sampled; the history must still be exactly the
    # tokens the policy sampled, or the call vanishes and the episode's tokens shift.
    model, client = scripted
    model.script = script(CALL)
    first = await client.chat.completions.create(
        model="tiny-random", messages=[USER], tools=TOOLS, max_tokens=64
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert json.loads(call.function.arguments) == {"expression": "2 + 2"}
    sampled = first.model_extra["prompt_token_ids"] + choice.model_extra["token_ids"]
    assert choice.model_extra["token_ids"] == script(CALL)
    result = {"role": "tool", "tool_call_id": call.id, "content": "4"}
    second = await client.chat.completions.create(
        model="tiny-random", messages=[USER, choice.message, result], tools=TOOLS, max_tokens=1
    )
    prompt = second.model_extra["prompt_token_ids"]
    assert prompt[: len(sampled)] == sampled
    tail = load_tokenizer("tiny-random").decode(prompt[len(sampled) :])
    assert tail == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"


async def test_a_streamed_tool_call_arrives_whole_in_one_delta(scripted):
    model, client = scripted
    model.script = script(f"Let me compute.\n{CALL}")
    stream = await client.chat.completions.create(
        model="tiny-random", messages=[USER], tools=TOOLS, max_tokens=64, logprobs=True, stream=True
    )
    chunks = [chunk async for chunk in stream]
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me compute."
    (call,) = [c for d in deltas for c in d.tool_calls or []]
    assert call.index == 0 and call.function.name == "calc" and call.id
    final = chunks[-1].choices[0]
    assert final.finish_reason == "tool_calls"
    assert final.model_extra["token_ids"] == script(f"Let me compute.\n{CALL}")
    entries = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert len(entries) == len(final.model_extra["token_ids"])


def test_eval_against_the_server_url_keeps_token_records(server, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "reinforge",
            "eval",
            "arithmetic",
            "--model",
            f"{server}/v1",
            "--tasks",
            "2",
            "--rollouts",
            "2",
            "--max-tokens",
            "4",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert sum(row["loss_mask"]) == len(row["logprobs"]) == 4
        assert row["policy_versions"] == [0] * 4
