"""Episodes spread over several engines: least-loaded, and sticky per episode.

An episode's first turn goes to the engine with the fewest requests in flight; its later
turns follow it there (`EpisodeClient` keeps the client its first turn was given), since
that engine's prefix cache holds the conversation and a continuation sent elsewhere would
be prefilled from scratch. One engine is the same code with nothing to choose.

A router over engines that a supervisor restarts (`supervised`) routes around an engine
that is down: no episode starts there, and a turn that could not reach it waits until an
engine serves and goes there instead (re-prefilled: each turn sends the exact tokens so
far). Without a supervisor such a turn fails, as the request did.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from reinforge.policy.client import EpisodeClient, PolicyClient, Traffic


class Router:
    def __init__(self, clients: list[PolicyClient], supervised: bool = False) -> None:
        self.clients = clients
        self.supervised = supervised
        self.down: set[int] = set()
        """Engines taking no requests until their supervisor says they serve again."""
        self._serving = asyncio.Condition()
        self._reported = [Traffic() for _ in clients]

    def episode(self, max_total_tokens: int | None, seed: int | None) -> EpisodeClient:
        """A client for one rollout, placed when it sends its first turn (not now: an
        episode may set up a sandbox first, and the load then is what counts)."""
        lost = self.lost if self.supervised else None
        return EpisodeClient(self.least_loaded, max_total_tokens, seed, lost)

    def least_loaded(self) -> PolicyClient:
        """Of the engines up (all, if none is: the request then fails and waits in `lost`),
        fewest requests in flight; of those, the one that has answered fewest, so that
        idle engines take turns."""
        up = [c for i, c in enumerate(self.clients) if i not in self.down] or self.clients
        return min(up, key=lambda c: (c.traffic.in_flight, c.traffic.requests))

    async def lost(self, client: PolicyClient) -> None:
        """A request could not reach `client`'s engine: it is down until its supervisor
        brings it back; returns once some engine serves."""
        self.down.add(self.clients.index(client))
        async with self._serving:
            await self._serving.wait_for(lambda: len(self.down) < len(self.clients))

    def take_down(self, index: int) -> None:
        self.down.add(index)

    async def serve_again(self, index: int) -> None:
        async with self._serving:
            self.down.discard(index)
            self._serving.notify_all()

    def take_traffic(self) -> list[Traffic]:
        """Per engine, in order: the requests answered and tokens sampled since the last
        call, and the requests in flight now."""
        taken = []
        for index, client in enumerate(self.clients):
            now, before = replace(client.traffic), self._reported[index]
            taken.append(
                Traffic(
                    in_flight=now.in_flight,
                    requests=now.requests - before.requests,
                    sampled_tokens=now.sampled_tokens - before.sampled_tokens,
                )
            )
            self._reported[index] = now
        return taken

    async def aclose(self) -> None:
        for client in self.clients:
            await client.close()
