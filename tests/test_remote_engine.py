"""The engine as its own process: `reinforge serve` (the built-in engine or vLLM) taking
weights from a trainer, and a training run that samples from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from reinforge.orchestrate.weight_sync import HeldFolder, remove_abandoned
from reinforge.policy.config import EngineConfig, ServerConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model
from reinforge.policy.server import create_app
from reinforge.policy.weight_buckets import Bucket, manifest, pack

from .commands import run_here, serving, tiny_train
from .conftest import ENGINES, require_vllm

TOKEN = "test-secret"


@pytest.fixture(scope="module", params=ENGINES)
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """`reinforge serve` taking weights, on each engine in turn."""
    if request.param == "vllm":
        require_vllm()
    with serving("--engine", request.param, f"server.weights_token={TOKEN}") as url:
        yield url


def end_to_end(buckets: list[Bucket]) -> bytes:
    """The buckets' bytes one after another: a file of them is what an engine reads with
    their manifest."""
    return b"".join(bucket.data.tobytes() for bucket in buckets)


def _perturbed_weights(path: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model("tiny-random")
    generator = torch.Generator().manual_seed(0)
    state = {
        name: (p.detach() + 0.05 * torch.randn(p.shape, generator=generator)).contiguous()
        for name, p in model.named_parameters()
    }
    save_file(state, path)
    return state


def test_weights_need_this_machine_and_the_token(server, tmp_path):
    path = tmp_path / "w.safetensors"
    _perturbed_weights(path)
    update = {"path": str(path), "version": 3}
    assert httpx.post(f"{server}/v1/weights", json=update).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{server}/v1/weights", json=update, headers=wrong).status_code == 401
    missing = {"path": str(tmp_path / "none.safetensors"), "version": 3}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = httpx.post(f"{server}/v1/weights", json=missing, headers=headers)
    assert response.status_code == 400 and "cannot read weights" in response.text


def test_buckets_that_do_not_fit_their_file_or_manifest_are_refused(server, tmp_path):
    buckets = pack(_perturbed_weights(tmp_path / "w.safetensors"))
    path = tmp_path / "w.buckets"
    path.write_bytes(end_to_end(buckets))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    version = httpx.get(f"{server}/health").json()["policy_version"]
    entry = {"name": "x", "dtype": "float99", "shape": [1], "offset": 0, "nbytes": 4}
    for given in ([[{"name": "x"}]], [[entry]]):  # a field missing; not a dtype
        bad = {"path": str(path), "buckets": given, "version": 9}
        response = httpx.post(f"{server}/v1/weights", json=bad, headers=headers)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "buckets[0][0].dtype"
    short = {"path": str(path), "buckets": manifest(buckets + buckets), "version": 9}
    response = httpx.post(f"{server}/v1/weights", json=short, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["param"] == "path"
    assert "bytes, where the buckets hold" in response.json()["error"]["message"]
    assert httpx.get(f"{server}/health").json()["policy_version"] == version  # untouched


async def test_a_server_without_a_token_takes_no_weights(tmp_path):
    model, tokenizer = load_model("tiny-random")
    engine = Engine(model, tokenizer, "tiny-random", EngineConfig())
    try:
        transport = httpx.ASGITransport(app=create_app(engine, ServerConfig()))
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            update = {"path": str(tmp_path / "w.safetensors"), "version": 1}
            response = await client.post("/v1/weights", json=update)
        assert response.status_code == 403 and "weights_token" in response.text
    finally:
        engine.close()


@pytest.mark.parametrize("layout", ["safetensors", "buckets"])
def test_pushed_weights_are_the_policy_that_samples_next(server, tmp_path, layout):
    path = tmp_path / "w.safetensors"
    state = _perturbed_weights(path)
    update = {"path": str(path), "version": 7}
    if layout == "buckets":  # as a Ray engine's actor hands them over
        buckets = pack(state, bucket_bytes=2**16)
        assert len(buckets) > 1
        path = tmp_path / "w.buckets"
        path.write_bytes(end_to_end(buckets))
        update = {"path": str(path), "buckets": manifest(buckets), "version": 7}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = httpx.post(f"{server}/v1/weights", json=update, headers=headers, timeout=60)
    assert response.json() == {"policy_version": 7}
    assert httpx.get(f"{server}/health").json()["policy_version"] == 7

    model, _ = load_model("tiny-random")
    model.load_state_dict(state, strict=False)
    assert_samples_with(f"{server}/v1", model, 7)


def assert_samples_with(url: str, model: torch.nn.Module, version: int) -> None:
    """The server at `url` (its /v1) samples as `version`, and the log-probs it records are
    a plain forward of `model`: the pushed weights are the policy."""
    body = {"model": "tiny-random", "prompt": [5, 6, 7, 8], "max_tokens": 6, "logprobs": 0}
    choice = httpx.post(f"{url}/completions", json=body, timeout=60).json()["choices"][0]
    assert choice["policy_versions"] == [version] * len(choice["token_ids"])
    ids = torch.tensor([[5, 6, 7, 8, *choice["token_ids"]]])  # (1, L)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, 3:-1].float(), dim=-1)
    expected = logp.gather(1, torch.tensor(choice["token_ids"]).unsqueeze(1)).squeeze(1)
    recorded = torch.tensor(choice["logprobs"]["token_logprobs"])
    assert torch.allclose(recorded, expected, atol=1e-4)


def test_weights_sent_during_a_pause_are_what_a_waiting_request_samples(server, tmp_path):
    """A request that arrives while decoding is paused has not sampled a token when the
    weights come, so every token it returns carries their version; resume lets it go."""
    path = tmp_path / "w.safetensors"
    _perturbed_weights(path)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{server}/v1/pause", json={"lease_s": 300}).status_code == 401
    paused = httpx.post(f"{server}/v1/pause", json={"lease_s": 300}, headers=headers)
    assert paused.status_code == 200 and httpx.get(f"{server}/health").json()["paused"]
    again = httpx.post(f"{server}/v1/pause", json={"lease_s": 300}, headers=headers)
    assert again.status_code == 409
    body = {"model": "tiny-random", "prompt": [5, 6, 7], "max_tokens": 6, "logprobs": 0}
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(httpx.post, f"{server}/v1/completions", json=body, timeout=120)
        time.sleep(0.5)  # orders the request before the weights; asserts nothing
        assert not waiting.done()
        update = {"path": str(path), "version": 11}
        sent = httpx.post(f"{server}/v1/weights", json=update, headers=headers, timeout=60)
        assert sent.json() == {"policy_version": 11}
        assert not waiting.done()
        resumed = httpx.post(f"{server}/v1/resume", headers=headers, timeout=60)
        assert resumed.json() == {"resumed": True}
        choice = waiting.result().json()["choices"][0]
    assert choice["policy_versions"] == [11] * len(choice["token_ids"])
    assert not httpx.get(f"{server}/health").json()["paused"]
    assert httpx.post(f"{server}/v1/resume", headers=headers).json() == {"resumed": False}


def test_a_pause_ends_with_its_lease(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    httpx.post(f"{server}/v1/pause", json={"lease_s": 0.2}, headers=headers)
    body = {"model": "tiny-random", "prompt": [5, 6, 7], "max_tokens": 2}
    reply = httpx.post(f"{server}/v1/completions", json=body, timeout=120)  # no resume sent
    assert reply.status_code == 200 and not httpx.get(f"{server}/health").json()["paused"]


@pytest.mark.parametrize("mode", ["async", "partial"])
def test_a_run_trains_against_reinforge_serve(server, tmp_path, mode):
    argv = tiny_train(
        tmp_path,
        "run.steps=3",
        f"loop.mode={mode}",
        "loop.max_staleness=1",
        "engines.kind=served",
        f"engines.url={server}/v1",
        f"engines.token={TOKEN}",
    )
    process = run_here(argv)
    assert process.returncode == 0, process.stderr
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    # The trainer names the versions: the server's earlier ones (other tests) do not leak in.
    assert [r["policy_version"] for r in rows] == [1, 2, 3]
    assert all(r["staleness_max"] <= 1 and r["time"]["sync_s"] > 0 for r in rows)
    health = httpx.get(f"{server}/health").json()
    assert health["policy_version"] == 3 and not health["paused"]


def test_a_wrong_token_is_one_clear_line(server, tmp_path):
    served = ["engines.kind=served", f"engines.url={server}/v1", "engines.token=nope"]
    argv = tiny_train(tmp_path, "loop.mode=async", *served)
    # The run is this process (`run_here`): its folder holds this pid, other workers' not.
    ours = f"reinforge-weights-{os.getpid()}-*"
    before = set(Path("/dev/shm").glob(ours))
    process = run_here(argv)
    assert process.returncode == 2
    assert "refused to take the weights: wrong or missing weights token" in process.stderr
    assert "Traceback" not in process.stderr
    assert set(Path("/dev/shm").glob(ours)) <= before  # the handoff folder is gone


HOLDS_A_FOLDER = """
import time
from reinforge.orchestrate.weight_sync import HeldFolder
folder = HeldFolder()
(folder.path / "weights.safetensors").write_bytes(b"w" * 4096)
print(folder.path, flush=True)
time.sleep(600)
"""


def test_a_killed_runs_weights_folder_is_removed_by_the_next_and_a_live_ones_kept():
    # Two real owners: one SIGKILLed (nothing of it can clean up), one alive.
    owners = [
        subprocess.Popen([sys.executable, "-c", HOLDS_A_FOLDER], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        killed, alive = (Path(owner.stdout.readline().strip()) for owner in owners)
        assert killed.name.startswith(f"reinforge-weights-{owners[0].pid}-")
        owners[0].kill()
        owners[0].wait()
        assert (killed / "weights.safetensors").exists()  # abandoned, in RAM
        ours = HeldFolder()
        assert not killed.exists()
        assert (alive / "weights.safetensors").exists()
        ours.remove()
        assert not ours.path.exists()
    finally:
        for owner in owners:
            owner.kill()
            owner.wait()
        remove_abandoned(Path("/dev/shm"))


def test_an_untied_lm_head_takes_its_new_weights_in_vllm(tmp_path):
    # The tied head is covered by the engine tests; here the head has weights of its own,
    # which vLLM reloads (and its CPU kernels repack) as a layer of their own.
    require_vllm()
    model, tokenizer = load_model("tiny-random")
    untied = type(model)(
        model.config.__class__(**{**model.config.to_dict(), "tie_word_embeddings": False})
    )
    folder = tmp_path / "untied"
    untied.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    generator = torch.Generator().manual_seed(3)
    state = {
        name: (p.detach() + 0.2 * torch.randn(p.shape, generator=generator)).contiguous()
        for name, p in untied.named_parameters()
    }
    assert "lm_head.weight" in state
    path = tmp_path / "w.safetensors"
    save_file(state, path)
    untied.load_state_dict(state)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    args = ("--engine", "vllm", "--model", str(folder), f"server.weights_token={TOKEN}")
    with serving(*args) as url:
        update = {"path": str(path), "version": 2}
        assert httpx.post(f"{url}/v1/weights", json=update, headers=headers, timeout=120).is_success
        reply = httpx.post(
            f"{url}/v1/completions",
            json={"model": str(folder), "prompt": [5, 6, 7, 8], "max_tokens": 6, "logprobs": 0},
            timeout=120,
        ).json()
    choice = reply["choices"][0]
    ids = torch.tensor([[5, 6, 7, 8, *choice["token_ids"]]])  # (1, L)
    with torch.no_grad():
        logp = torch.log_softmax(untied(input_ids=ids).logits[0, 3:-1].float(), dim=-1)
    expected = logp.gather(1, torch.tensor(choice["token_ids"]).unsqueeze(1)).squeeze(1)
    recorded = torch.tensor(choice["logprobs"]["token_logprobs"])
    assert choice["policy_versions"] == [2] * len(choice["token_ids"])
    assert torch.allclose(recorded, expected, atol=1e-4)
