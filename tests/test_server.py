"""The real `reinforge serve` process, spoken to by the official openai client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from reinforge.policy.models import load_tokenizer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "reinforge", "serve", "--model", "tiny-random", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


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
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"max_tokens": 100_000}, "messages"),
        ({"stream": True}, "stream"),
    ],
)
def test_bad_requests_get_openai_errors_with_4xx(server, body, param):
    request = {"model": "tiny-random", "messages": [{"role": "user", "content": "x"}], **body}
    response = httpx.post(f"{server}/v1/chat/completions", json=request)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "Traceback" not in response.text


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


def test_malformed_json_is_400(server):
    response = httpx.post(
        f"{server}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and "error" in response.json()


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
