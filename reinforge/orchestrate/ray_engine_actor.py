"""The Ray actor that hosts one engine on its node (`EngineActor`), and what it takes a
push with (`Push`, `HeldBuckets`). Ray imports this module in each such actor's process,
so it imports no model stack: the actor starts `reinforge serve`, whose process loads the
model, and moves weight bytes, which needs torch alone."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from reinforge.errors import UsageError
from reinforge.orchestrate.engine_host import (
    START_S,
    STOP_S,
    answers_now,
    base_url,
    exited_early,
    free_ports,
    loopback,
    post_to_engine,
    silent,
    spawn,
)
from reinforge.orchestrate.ray_actors import node_id, ray
from reinforge.policy.weight_buckets import Bucket, MemoryFile, manifest
from reinforge.policy.weight_delta import Delta, apply

FETCHERS = 8
"""Whole buckets an engine's actor fetches at once, each laid as soon as it is here: enough
that one is laid while the next travel, few enough that a model of hundreds of buckets
does not start a thread for each."""


@dataclass(frozen=True)
class Push:
    """One push as the engines' actors take it. Its refs travel inside it, so Ray fetches
    none of them to an actor's node until the actor asks for it."""

    version: int
    base: int
    """The version the deltas apply to: the push before."""
    deltas: list[Any]
    """Per bucket, the ref of its `Delta`, or None where it goes whole."""
    full: list[Any]
    """Every bucket whole (refs)."""
    sizes: list[int]
    """Every bucket's bytes: where each lies in the file its engine reads, known before
    any arrives."""
    keep: bool
    """Whether an actor keeps the buckets for the next push's deltas (`delta`): else it
    drops them once its engine has them, and the store may free them."""

    @classmethod
    def whole(cls, version: int, full: list[Any], sizes: list[int], keep: bool) -> Push:
        """Every bucket whole: what a rejoining engine takes."""
        return cls(version, version, [None] * len(full), full, sizes, keep)


class EngineActor:
    """One engine in a Ray actor: `reinforge serve` listening on the address of the
    actor's node, at a port that stays its own across restarts, logging to the node's own
    temp folder (`log_since` hands the log out; `orchestrate/ray_logs.py` copies it to the
    run's node, then has `drop_log` delete it)."""

    def __init__(self, settings: str, index: int, copy: str, port: int | None = None) -> None:
        self.settings = settings
        self.index = index
        self.copy = Path(copy)
        """The log's copy on the run's node: what error lines name."""
        self.log = Path(tempfile.mkdtemp(prefix="reinforge-engine-")) / f"engine-{index}.log"
        self.log.touch()
        self.host = ray.util.get_node_ip_address()
        self.port = port or free_ports(1, self.host)[0]
        self.url = base_url(self.host, self.port)
        self.process: subprocess.Popen[bytes] | None = None
        self.held = HeldBuckets()
        self.memory: MemoryFile | None = None
        """Made at the first push of the object store."""

    def node(self) -> str:
        return node_id()

    def start(self) -> str:
        """The engine, answering; its /v1 URL."""
        self.stop()
        folder = Path(tempfile.mkdtemp(prefix="reinforge-engines-"))
        try:  # the settings hold the token: private, and gone once the engine has read them
            (folder / "serve.toml").write_text(self.settings)
            self.process = spawn(folder / "serve.toml", self.port, self.log, self.host)
            deadline = time.monotonic() + START_S
            while not answers_now(self.url):
                code = self.process.poll()
                if code is not None:
                    raise UsageError(exited_early(self.index, code, self.log, self.copy))
                if time.monotonic() > deadline:
                    raise UsageError(silent(self.index, self.copy))
                time.sleep(0.25)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return self.url

    def log_since(self, offset: int, most: int) -> bytes:
        """At most `most` bytes of the engine's log from byte `offset` on. Asked in a
        concurrency group of its own, so that the log comes while the engine starts."""
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read(most)

    def drop_log(self, copied: int) -> bool:
        """Whether the log's folder was deleted: only once the engine has stopped and the
        run's node holds every byte of it (`copied`), so that nothing of it is lost. Asked
        in the log's concurrency group."""
        if self.process is None or self.process.poll() is None:
            return False
        if self.log.stat().st_size != copied:
            return False
        shutil.rmtree(self.log.parent)
        return True

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def post(self, token: str, route: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        """`route` posted to this node's engine from the node's loopback address, the only
        source its control routes (pause, resume, weights) take: how the run reaches an
        engine on another machine."""
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(
            base_url=self.url, headers=headers, timeout=600.0, transport=loopback(self.url)
        ) as http:
            return post_to_engine(http, route, body, what)

    def take_weights(self, token: str, push: Push) -> tuple[int, int]:
        """The weights of `push` to this node's engine: built from the deltas on the
        buckets this actor holds, or pulled whole from the store where they do not apply
        (`HeldBuckets`), each laid in a file of the actor's memory as soon as it is here;
        then the file's path and the buckets' manifest, posted as any control is (`post`).
        The version the engine then serves, and the bytes the actor took from the store."""
        if self.memory is None:
            self.memory = MemoryFile()
        with self.memory.holding(push.sizes) as lay:
            buckets, moved = self.held.take(push, lay)
            body = {
                "path": self.memory.path,
                "buckets": manifest(buckets),
                "version": push.version,
            }
            answer = self.post(token, "/weights", body, "take the weights")
        return answer["policy_version"], moved

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class HeldBuckets:
    """The buckets an engine's actor last took, with `delta`: what the next push's deltas
    apply to. One taken whole stays a view of its node's copy in the store (one for all
    the node's actors, kept there until the next push replaces it); one built from a delta
    is the actor's own."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.buckets: list[Bucket] = []

    def take(self, push: Push, lay: Callable[[int, Bucket], None]) -> tuple[list[Bucket], int]:
        """`push`'s buckets, built from its deltas where they apply and fetched whole where
        not, each given to `lay` with its index as soon as it is here (from another thread
        for one fetched); and the bytes fetched for them. Whole buckets are fetched
        `FETCHERS` at a time, so that one is laid while the next still travel."""
        based = self.version == push.base and len(self.buckets) == len(push.full)
        wanted = [i for i, ref in enumerate(push.deltas) if based and ref is not None]
        deltas: list[Delta] = ray.get([push.deltas[i] for i in wanted])
        moved = sum(delta.nbytes for delta in deltas)
        built: dict[int, Bucket] = {}
        for i, delta in zip(wanted, deltas, strict=True):
            bucket = apply(self.buckets[i], self.version, delta)
            if bucket is not None:
                built[i] = bucket
        whole = [i for i in range(len(push.full)) if i not in built]

        def fetch(index: int) -> Bucket:
            bucket = ray.get(push.full[index])
            lay(index, bucket)
            return bucket

        with ThreadPoolExecutor(min(max(len(whole), 1), FETCHERS)) as pool:
            fetching = [pool.submit(fetch, i) for i in whole]
            for i, bucket in built.items():
                lay(i, bucket)
            for i, future in zip(whole, fetching, strict=True):
                built[i] = future.result()
                moved += built[i].data.nbytes
        buckets = [built[i] for i in range(len(push.full))]
        self.buckets, self.version = (buckets, push.version) if push.keep else ([], None)
        return buckets, moved
