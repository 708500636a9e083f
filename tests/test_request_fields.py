"""Every field of every request body the server takes does something, or is refused with a
400 naming it, or is listed in docs/server.md as ignored with its reason. The fields come
from the request models the routes declare (nested models' fields as `outer.inner`), so a
field added later fails here until a case below shows what it does."""

from __future__ import annotations

import copy
import json
import re
import time
import types
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import torch.distributed as dist
from fastapi.routing import APIRoute
from pydantic import BaseModel
from safetensors.torch import save_file

from reinforge.orchestrate.broadcast_weights import HOST
from reinforge.policy.config import EngineConfig, ServerConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.policy.server import create_app
from reinforge.policy.weight_buckets import manifest, pack
from reinforge.policy.weight_group import new_group

from .conftest import http_server
from .test_remote_engine import end_to_end

TOKEN = "fields-secret"
DOCS = Path(__file__).parent.parent / "docs" / "server.md"
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/pause": "pause",
    "/v1/weights": "weights",
    "/v1/weights/group": "join",
    "/v1/weights/broadcast": "broadcast",
}
"""Each route with a request body, by the name docs/server.md's field table gives it."""


@dataclass
class Api:
    """The server under test, its engine and a way to build each route's smallest request."""

    url: str
    """The server's root (routes start with /v1)."""
    engine: Engine
    folder: Path
    """Where a case may write files (new weights)."""

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=120)

    def body(self, route: str, **fields: Any) -> dict[str, Any]:
        prompt = {"messages": [{"role": "user", "content": "Hi"}]}
        if route == "completions":
            prompt = {"prompt": "Once upon a time"}
        return {"model": "tiny-random", "max_tokens": 2, **prompt, **fields}

    def sample(self, route: str, **fields: Any) -> dict[str, Any]:
        """A request on a completion route that must succeed; its response."""
        response = self.post(_path(route), self.body(route, **fields))
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, route: str, **fields: Any) -> list[dict[str, Any]]:
        """A streamed request's chunks."""
        body = self.body(route, stream=True, **fields)
        with httpx.stream("POST", f"{self.url}{_path(route)}", json=body, timeout=120) as reply:
            assert reply.headers["content-type"].startswith("text/event-stream")
            lines = [line.removeprefix("data: ") for line in reply.iter_lines() if line]
        assert lines[-1] == "[DONE]"
        return [json.loads(line) for line in lines[:-1]]


def _path(route: str) -> str:
    return next(path for path, name in ROUTES.items() if name == route)


def tokens(response: dict[str, Any], index: int = 0) -> list[int]:
    return response["choices"][index]["token_ids"]


Check = Callable[[Api, str], None]
"""Shows one field's effect on a route (by its docs name)."""

SHARED = "shared"
"""The key, in each table below, of the fields both completion routes take (those of
`SamplingRequest`): each is checked on both."""

USED: dict[str, dict[str, Check]] = {SHARED: {}, **{route: {} for route in ROUTES.values()}}
"""Fields that do something: a check that shows what, registered with `effect`."""


def effect(*fields: str, route: str = SHARED) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        USED[route].update(dict.fromkeys(fields, check))
        return check

    return register


@effect("model")
def _model(api: Api, route: str) -> None:
    api.sample(route)
    wrong = api.post(_path(route), api.body(route, model="gpt-9"))
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"


@effect("temperature")
def _temperature(api: Api, route: str) -> None:
    greedy = [tokens(api.sample(route, temperature=0, seed=s, max_tokens=4)) for s in (1, 2)]
    drawn = [tokens(api.sample(route, temperature=1, seed=s, max_tokens=4)) for s in (1, 2)]
    assert greedy[0] == greedy[1] and drawn[0] != drawn[1]


@effect("top_p")
def _top_p(api: Api, route: str) -> None:
    # a nucleus of one token: each is certain within it
    assert sampled_logprobs(api, route, top_p=1e-9) == [0.0, 0.0]
    assert all(lp < -1 for lp in sampled_logprobs(api, route, top_p=1.0))


def sampled_logprobs(api: Api, route: str, **fields: Any) -> list[float]:
    asked = {"logprobs": True} if route == "chat" else {"logprobs": 0}
    logprobs = api.sample(route, **asked, **fields)["choices"][0]["logprobs"]
    if route == "chat":
        return [entry["logprob"] for entry in logprobs["content"]]
    return logprobs["token_logprobs"]


@effect("max_tokens", "max_completion_tokens")
def _max_tokens(api: Api, route: str) -> None:
    assert len(tokens(api.sample(route, max_tokens=3))) == 3
    assert len(tokens(api.sample(route, max_tokens=None, max_completion_tokens=5))) == 5


@effect("stop")
def _stop(api: Api, route: str) -> None:
    full = api.sample(route, temperature=0, max_tokens=4)["choices"][0]
    second = api.engine.tokenizer.decode(full["token_ids"][1:2])
    stopped = api.sample(route, temperature=0, max_tokens=4, stop=[second])["choices"][0]
    assert stopped["finish_reason"] == "stop" and len(stopped["token_ids"]) <= 2
    assert stopped["token_ids"] == full["token_ids"][: len(stopped["token_ids"])]
    assert stopped["raw_text"] == full["raw_text"][: full["raw_text"].find(second)]


@effect("n")
def _n(api: Api, route: str) -> None:
    assert [c["index"] for c in api.sample(route, n=3)["choices"]] == [0, 1, 2]


@effect("seed")
def _seed(api: Api, route: str) -> None:
    first, again, other = (tokens(api.sample(route, seed=s, max_tokens=4)) for s in (5, 5, 6))
    assert first == again != other


@effect("stream")
def _stream(api: Api, route: str) -> None:
    chunks = api.events(route)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@effect("stream_options", "stream_options.include_usage")
def _include_usage(api: Api, route: str) -> None:
    with_usage = api.events(route, stream_options={"include_usage": True})
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] == 2
    assert "usage" not in api.events(route)[-1]


@effect("prompt_logprobs")
def _prompt_logprobs(api: Api, route: str) -> None:
    response = api.sample(route, prompt_logprobs=1)
    # vLLM's places: on the chat response, on each completions choice
    scores = (response if route == "chat" else response["choices"][0])["prompt_logprobs"]
    assert len(scores) == len(response["prompt_token_ids"]) and scores[0] is None
    for token, entry in zip(response["prompt_token_ids"][1:], scores[1:], strict=True):
        assert str(token) in entry and 1 <= len(entry) <= 2


@effect("prompt_token_ids")
def _prompt_token_ids(api: Api, route: str) -> None:
    ids = [1, 40, 41, 42]
    body = api.body(route, prompt_token_ids=ids)
    if route == "completions":
        del body["prompt"]
    response = api.post(_path(route), body).json()
    assert response["prompt_token_ids"] == ids


@effect("stop_loops")
def _stop_loops(api: Api, route: str) -> None:
    # Greedy, the tiny random model soon repeats a token: a loop by its 32nd copy.
    greedy = {"temperature": 0, "max_tokens": 96}
    assert api.sample(route, **greedy)["choices"][0]["finish_reason"] == "length"
    looped = api.sample(route, stop_loops=True, **greedy)["choices"][0]
    assert looped["finish_reason"] == "loop" and len(looped["token_ids"]) < 96


@effect("messages", route="chat")
def _messages(api: Api, route: str) -> None:
    prompt = api.sample(route, messages=[{"role": "user", "content": "Zebras"}])
    assert "Zebras" in api.engine.tokenizer.decode(prompt["prompt_token_ids"])


TOOL = {"type": "function", "function": {"name": "look_up_zebras", "parameters": {}}}


@effect("tools", route="chat")
def _tools(api: Api, route: str) -> None:
    prompt = api.sample(route, tools=[TOOL])["prompt_token_ids"]
    assert "look_up_zebras" in api.engine.tokenizer.decode(prompt)


@effect("tool_choice", route="chat")
def _tool_choice(api: Api, route: str) -> None:
    plain = api.sample(route)["prompt_token_ids"]
    offered = api.sample(route, tools=[TOOL], tool_choice="auto")["prompt_token_ids"]
    assert api.sample(route, tools=[TOOL], tool_choice="none")["prompt_token_ids"] == plain
    assert offered != plain


@effect("logprobs", route="chat")
def _chat_logprobs(api: Api, route: str) -> None:
    assert api.sample(route)["choices"][0]["logprobs"] is None
    entries = api.sample(route, logprobs=True)["choices"][0]["logprobs"]["content"]
    assert len(entries) == 2 and all(e["logprob"] < 0 for e in entries)


@effect("top_logprobs", route="chat")
def _top_logprobs(api: Api, route: str) -> None:
    entries = api.sample(route, logprobs=True, top_logprobs=3)["choices"][0]["logprobs"]
    assert [len(e["top_logprobs"]) for e in entries["content"]] == [3, 3]


@effect("prompt", route="completions")
def _prompt(api: Api, route: str) -> None:
    response = api.sample(route, prompt="Zebras")
    assert response["prompt_token_ids"] == api.engine.tokenizer.encode(
        "Zebras", add_special_tokens=False
    )
    assert api.sample(route, prompt=[40, 41])["prompt_token_ids"] == [40, 41]


@effect("logprobs", route="completions")
def _text_logprobs(api: Api, route: str) -> None:
    assert api.sample(route)["choices"][0]["logprobs"] is None
    logprobs = api.sample(route, logprobs=2)["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == 2 and len(logprobs["top_logprobs"][0]) in (2, 3)


@effect("echo", route="completions")
def _echo(api: Api, route: str) -> None:
    choice = api.sample(route, prompt=[40, 41], echo=True, logprobs=0)["choices"][0]
    assert choice["text"] == api.engine.tokenizer.decode([40, 41]) + choice["raw_text"]
    assert len(choice["logprobs"]["token_logprobs"]) == 4


@effect("lease_s", route="pause")
def _lease(api: Api, route: str) -> None:
    health = f"{api.url}/health"
    assert api.post("/v1/pause", {"lease_s": 0.3}).json()["paused"] is True
    assert httpx.get(health).json()["paused"] is True
    deadline = time.monotonic() + 30
    while httpx.get(health).json()["paused"]:  # the lease ends it without a resume
        assert time.monotonic() < deadline
        time.sleep(0.05)


@effect("path", "version", route="weights")
def _weights(api: Api, route: str) -> None:
    missing = api.post("/v1/weights", {"path": str(api.folder / "none.safetensors"), "version": 3})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "path"
    path = api.folder / "weights.safetensors"
    save_file({n: p.detach() for n, p in api.engine.model.named_parameters()}, path)
    assert api.post("/v1/weights", {"path": str(path), "version": 3}).json() == {
        "policy_version": 3
    }
    assert api.sample("completions")["choices"][0]["policy_versions"] == [3, 3]


ENTRY = ("buckets.name", "buckets.dtype", "buckets.shape", "buckets.offset", "buckets.nbytes")


@effect("buckets", *ENTRY, route="weights")
def _weights_in_buckets(api: Api, route: str) -> None:
    """The weights as buckets' bytes in a file, with their manifest: each field of an entry
    places its tensor, so one changed is a 400, or another tensor's bytes taken."""
    weights = {n: p.detach().clone() for n, p in api.engine.model.named_parameters()}
    buckets = pack(weights, bucket_bytes=2**16)
    path = api.folder / "weights.buckets"
    path.write_bytes(end_to_end(buckets))
    good = {"path": str(path), "buckets": manifest(buckets), "version": 4}
    assert api.post("/v1/weights", good).json() == {"policy_version": 4}
    assert api.sample("completions")["choices"][0]["policy_versions"] == [4, 4]
    first = good["buckets"][0][0]
    param = dict(api.engine.model.named_parameters())[first["name"]]
    changes = {"name": "nope", "dtype": "float16", "shape": [1],
               "offset": first["offset"] + 16, "nbytes": first["nbytes"] // 2}  # fmt: skip
    for field, value in changes.items():
        changed = copy.deepcopy(good)
        changed["buckets"][0][0][field] = value
        response = api.post("/v1/weights", changed)
        assert response.status_code == 400 or not torch.equal(param, weights[first["name"]]), field
        assert api.post("/v1/weights", good).status_code == 200


@effect("host", "port", "group", "rank", "size", "timeout_s", route="join")
@effect("group", "version", "buckets", *ENTRY, route="broadcast")
def _weights_broadcast(api: Api, route: str) -> None:
    """A thread here is the trainer: rank 0 of a group the engine joins, broadcasting the
    engine's own weights in small buckets as version 8. The buckets' entries are read as
    the weights route reads them (`_weights_in_buckets`)."""
    store = dist.TCPStore(HOST, 0, None, True, wait_for_workers=False)
    join = {"host": HOST, "port": store.port, "group": "g", "rank": 1, "size": 2,
            "timeout_s": 30}  # fmt: skip
    unsigned = httpx.post(f"{api.url}/v1/weights/group", json=join, timeout=30)
    assert unsigned.status_code == 401  # as /v1/weights: the token, from this machine
    weights = {n: p.detach().clone() for n, p in api.engine.model.named_parameters()}
    buckets = pack(weights, bucket_bytes=2**16)
    body = {"group": "g", "version": 8, "buckets": manifest(buckets)}
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(api.post, "/v1/weights/group", join)
        trainer = new_group(store, "g", HOST, 0, 2, 30.0)
        assert joined.result().json() == {"group": "g"}
        served = pool.submit(api.post, "/v1/weights/broadcast", body)
        for bucket in buckets:
            trainer.broadcast([torch.from_numpy(bucket.data)]).wait()
        assert served.result().json() == {"policy_version": 8}
    assert api.sample("completions")["choices"][0]["policy_versions"] == [8, 8]
    elsewhere = api.post("/v1/weights/broadcast", {**body, "group": "h"})
    assert elsewhere.status_code == 409, elsewhere.text
    assert elsewhere.json()["error"]["code"] == "broadcast_aborted"


REFUSED: dict[str, dict[str, tuple[dict[str, Any], str]]] = {
    SHARED: {
        "presence_penalty": ({"presence_penalty": 0.5}, "presence_penalty"),
        "frequency_penalty": ({"frequency_penalty": -1}, "frequency_penalty"),
        "logit_bias": ({"logit_bias": {"40": 5}}, "logit_bias"),
    },
    "chat": {
        "parallel_tool_calls": ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        "response_format": ({"response_format": {"type": "json_object"}}, "response_format"),
        "response_format.type": (
            {"response_format": {"type": "json_object"}},
            "response_format",
        ),
        "response_format.json_schema": (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
    },
    "completions": {},
    "pause": {},
    "weights": {},
    "join": {},
    "broadcast": {},
}
"""Fields the server takes only with a value that changes nothing (0, empty, true, "text"),
and refuses with any other: (the request's fields, the `param` its 400 names)."""

IGNORED: dict[str, dict[str, None]] = {SHARED: {"user": None}}
"""Fields the server takes and does nothing with; docs/server.md says why."""


def placed(table: dict[str, dict[str, Any]], route: str) -> dict[str, Any]:
    """A table's fields of one route, the shared ones included."""
    shared = table.get(SHARED, {}) if route in ("chat", "completions") else {}
    return {**shared, **table.get(route, {})}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """A server of its own: the weights case changes its engine's version."""
    model, tokenizer = load_model("tiny-random")
    engine = Engine(model, tokenizer, "tiny-random", EngineConfig())
    try:
        with http_server(engine, ServerConfig(weights_token=TOKEN)) as url:
            yield Api(url.removesuffix("/v1"), engine, tmp_path_factory.mktemp("fields"))
    finally:
        engine.close()


def request_fields() -> dict[str, set[str]]:
    """Each route's request fields, from the models its handler declares."""
    app = create_app(_FakeEngine(), ServerConfig())
    fields: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, APIRoute) and route.dependant.body_params:
            (body,) = route.dependant.body_params
            fields[ROUTES[route.path]] = _fields(body.field_info.annotation)
    return fields


def _fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(prefix + name)
        for inner in _models(info.annotation):
            names |= _fields(inner, f"{prefix}{name}.")
    return names


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


class _FakeEngine:
    """Enough of an engine to build the app and read its routes."""

    name, eos_ids, version, max_context = "tiny-random", set(), 0, 1

    def __init__(self) -> None:
        from reinforge.policy.models import load_tokenizer

        self.tokenizer = load_tokenizer("tiny-random")


def test_every_request_field_is_used_refused_or_ignored():
    fields = request_fields()
    assert set(fields) == set(ROUTES.values())
    for route, names in fields.items():
        kinds = [set(placed(table, route)) for table in (USED, REFUSED, IGNORED)]
        everywhere = set().union(*kinds)
        assert sum(map(len, kinds)) == len(everywhere), f"{route}: a field is in two tables"
        assert everywhere - names == set(), f"{route}: the tables name fields it does not take"
        assert names - everywhere == set(), f"{route}: neither used, refused nor ignored"


def _every(table: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    return [(route, field) for route in ROUTES.values() for field in placed(table, route)]


@pytest.mark.parametrize(("route", "field"), _every(USED))
def test_a_used_field_has_its_effect(api, route, field):
    placed(USED, route)[field](api, route)


@pytest.mark.parametrize(("route", "field"), _every(REFUSED))
def test_a_refused_field_is_a_400_naming_it(api, route, field):
    fields, param = placed(REFUSED, route)[field]
    response = api.post(_path(route), api.body(route, **fields))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_refused_fields_are_taken_with_values_that_change_nothing(api, route):
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u"}
    if route == "chat":
        neutral |= {"parallel_tool_calls": True, "response_format": {"type": "text"}}
    seeded = {"seed": 9, "max_tokens": 4}
    assert tokens(api.sample(route, **neutral, **seeded)) == tokens(api.sample(route, **seeded))


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_field_the_server_does_not_take_is_a_400_naming_it(api, route):
    for fields, param in [
        ({"best_of": 2}, "best_of"),
        ({"top_k": 5}, "top_k"),
        ({"stream": True, "stream_options": {"chunk_usage": True}}, "stream_options.chunk_usage"),
    ]:
        response = api.post(_path(route), api.body(route, **fields))
        assert response.status_code == 400 and response.json()["error"]["param"] == param
        assert "not a field this server takes" in response.json()["error"]["message"]


def test_the_docs_table_lists_every_field_as_the_server_treats_it():
    """docs/server.md's request table: one row per field, its routes and its status."""
    rows: dict[tuple[str, str], str] = {}
    for field, where, status in re.findall(
        r"^\| `([\w.]+)` \| ([\w, ]+) \| ([^|]+) \|", DOCS.read_text(), re.M
    ):
        for route in where.split(", "):
            rows[(route, field)] = status
    for route, names in request_fields().items():
        for field in names:
            status = rows.get((route, field))
            assert status is not None, f"docs/server.md has no row for {field} on {route}"
            if field in placed(USED, route):
                assert "honoured" in status, (route, field, status)
            if field in placed(REFUSED, route):
                assert "refused" in status, (route, field, status)
            if field in placed(IGNORED, route):
                assert status.strip() == "ignored", (route, field, status)
