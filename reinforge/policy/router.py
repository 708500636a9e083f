"""Episodes spread over several engines: least-loaded, and sticky per episode.

An episode's first turn goes to the engine with the fewest requests in flight; its later
turns follow it there (`EpisodeClient` keeps the client its first turn was given), since
that engine's prefix cache holds the conversation and a continuation sent elsewhere would
be prefilled from scratch. One engine is the same code with nothing to choose.
"""

from __future__ import annotations

from dataclasses import replace

from reinforge.policy.client import EpisodeClient, PolicyClient, Traffic


class Router:
    def __init__(self, clients: list[PolicyClient]) -> None:
        self.clients = clients
        self._reported = [Traffic() for _ in clients]

    def episode(self, max_total_tokens: int | None, seed: int | None) -> EpisodeClient:
        """A client for one rollout, placed when it sends its first turn (not now: an
        episode may set up a sandbox first, and the load then is what counts)."""
        return EpisodeClient(self.least_loaded, max_total_tokens, seed)

    def least_loaded(self) -> PolicyClient:
        """Fewest requests in flight; of those, the one that has answered fewest, so that
        idle engines take turns."""
        return min(self.clients, key=lambda c: (c.traffic.in_flight, c.traffic.requests))

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
