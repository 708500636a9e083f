"""Routing episodes over engines: least-loaded at an episode's first turn, then sticky.

Two real in-process engines of the tiny model, each behind its own client; the router only
reads the clients' traffic counts, which the tests read back."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import openai
import pytest
import torch

from reinforge.policy.client import PolicyClient, Traffic
from reinforge.policy.config import EngineConfig, SamplingConfig
from reinforge.policy.engine import Engine
from reinforge.policy.router import Router


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    pair = [Engine.from_spec("tiny-random", EngineConfig(), torch.device("cpu")) for _ in range(2)]
    yield pair
    for engine in pair:
        engine.close()


def _router(engines: list[Engine]) -> Router:
    return Router([PolicyClient.for_engine(e, SamplingConfig()) for e in engines])


SAY = [{"role": "user", "content": "Say something."}]


async def test_first_turns_go_to_the_engine_with_fewest_requests_in_flight(engines):
    router = _router(engines)
    first, second = router.clients
    second.traffic.in_flight = 3  # as if three requests were being sampled there
    await router.episode(None, seed=1).chat(SAY, max_tokens=2)
    assert (first.traffic.requests, second.traffic.requests) == (1, 0)

    second.traffic.in_flight = 0
    # Four first turns at once: each is placed before it is sent, so they split evenly.
    episodes = [router.episode(None, seed=s) for s in range(4)]
    await asyncio.gather(*(e.chat(SAY, max_tokens=2) for e in episodes))
    assert (first.traffic.requests, second.traffic.requests) == (3, 2)
    assert [e.policy is first for e in episodes].count(True) == 2
    await router.aclose()


async def test_an_episodes_later_turns_stay_on_its_first_engine(engines):
    router = _router(engines)
    first, second = router.clients
    episode = router.episode(None, seed=7)
    reply = await episode.chat(SAY, max_tokens=2)
    assert episode.policy is first
    first.traffic.in_flight = 5  # now the busier one: new episodes go elsewhere...
    await router.episode(None, seed=8).chat(SAY, max_tokens=2)
    assert second.traffic.requests == 1
    messages = [*SAY, reply.message, {"role": "user", "content": "Again."}]
    await episode.chat(messages, max_tokens=2)  # ...but this one's second turn does not
    assert (first.traffic.requests, second.traffic.requests) == (2, 1)
    first.traffic.in_flight = 0
    await router.aclose()


async def test_traffic_is_taken_per_step(engines):
    router = _router(engines)
    await asyncio.gather(*(router.episode(None, s).chat(SAY, max_tokens=3) for s in range(2)))
    taken = router.take_traffic()
    assert [(t.requests, t.in_flight) for t in taken] == [(1, 0), (1, 0)]
    assert all(0 < t.sampled_tokens <= 3 for t in taken)
    assert [t.requests for t in router.take_traffic()] == [0, 0]  # nothing since
    await router.aclose()


def _unreachable() -> PolicyClient:
    """A client of a port nothing listens on: an engine that died."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    return PolicyClient(http, "tiny-random", SamplingConfig())


async def test_a_turn_that_cannot_reach_its_engine_goes_to_one_that_serves(engines):
    dead, live = _unreachable(), PolicyClient.for_engine(engines[0], SamplingConfig())
    router = Router([dead, live], supervised=True)
    episode = router.episode(None, seed=1)
    reply = await episode.chat(SAY, max_tokens=2)  # sent to `dead` first: it is idle too
    assert episode.policy is live and reply.token_ids
    assert reply.policy_versions == [0] * len(reply.token_ids)
    assert router.down == {0} and dead.traffic == Traffic()  # nothing counted as load
    await router.episode(None, seed=2).chat(SAY, max_tokens=2)  # no episode starts there
    assert live.traffic.requests == 2
    await router.serve_again(0)  # its supervisor brought it back
    assert router.least_loaded() is dead
    await router.aclose()


async def test_without_a_supervisor_a_turn_that_cannot_reach_its_engine_fails(engines):
    router = Router([_unreachable(), PolicyClient.for_engine(engines[0], SamplingConfig())])
    with pytest.raises(openai.APIConnectionError):
        await router.episode(None, seed=1).chat(SAY, max_tokens=2)
    assert router.down == set()
    await router.aclose()
