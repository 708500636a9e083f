"""A sharded trainer's ranks as Ray actors (`cluster.backend = "ray"`): each joins the
process group, its rendezvous at rank 0's node, and holds its `RankTrainer`; a call goes to
every actor and the first failure ends them all, as with `LocalRanks`. Ranks go wherever
`cluster.rank` places them; `sees` tells `TrainerRanks` whether they may use the driver's
files in a folder by their paths."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reinforge.orchestrate.engine_host import free_ports
from reinforge.orchestrate.ray_actors import ask, death, ray, release
from reinforge.train.config import TrainerConfig
from reinforge.train.ranks import RankFailed, failure_line, join_group

if TYPE_CHECKING:
    from reinforge.orchestrate.ray_cluster import RayCluster

if ray is not None:
    from ray.exceptions import RayActorError, RayTaskError


class RankActor:
    """One trainer rank in a Ray actor: joins the group, holds the factory's object."""

    def rendezvous(self) -> str:
        """A TCP rendezvous at this actor's node: rank 0's."""
        return f"tcp://{ray.util.get_node_ip_address()}:{free_ports(1)[0]}"

    def setup(
        self, rank: int, config: TrainerConfig, init_method: str, factory: Any, args: tuple
    ) -> None:
        join_group(rank, config, init_method)
        self.target = factory(rank, *args)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.target, method)(*args)

    def read(self, path: str) -> str | None:
        """The text of the file at `path` on this rank's node; None where there is none."""
        try:
            return Path(path).read_text()
        except OSError:
            return None


class RayRanks:
    """`trainer.world_size` rank actors; the `Ranks` of a Ray run."""

    def __init__(
        self, cluster: RayCluster, config: TrainerConfig, factory: Any, args: tuple
    ) -> None:
        resources = cluster.config.cluster.rank
        self._group, options = cluster.place(resources, config.world_size, "trainer ranks")
        actor = ray.remote(RankActor)
        self._actors = [actor.options(**option).remote() for option in options]
        self._seen: dict[Path, bool] = {}
        try:
            init_method = ask(self._actors[0].rendezvous, "trainer rank 0")
            self._wait(
                [
                    a.setup.remote(rank, config, init_method, factory, args)
                    for rank, a in enumerate(self._actors)
                ]
            )
        except BaseException:
            self.stop()
            raise

    def sees(self, folder: Path) -> bool:
        """Whether every rank reads back a file this process writes in `folder`, holding a
        fresh nonce: the driver's node, or storage they all mount at that path. A file of
        the same name on another machine does not pass for it. Asked once per folder."""
        if folder not in self._seen:
            nonce = secrets.token_hex(16)
            probe = folder / f".reinforge-probe-{nonce}"
            probe.write_text(nonce)
            try:
                read = self._answers([actor.read.remote(str(probe)) for actor in self._actors])
            finally:
                probe.unlink(missing_ok=True)
            self._seen[folder] = read == [nonce] * len(read)
        return self._seen[folder]

    def call(self, method: str, *args: Any) -> list[Any]:
        shared = [ray.put(arg) for arg in args]  # once, not once per rank (a batch)
        return self._answers([actor.call.remote(method, *shared) for actor in self._actors])

    def _answers(self, refs: list[Any]) -> list[Any]:
        """`_wait`, the ranks stopped should one fail."""
        try:
            return self._wait(refs)
        except BaseException:
            self.stop()
            raise

    def _wait(self, refs: list[Any]) -> list[Any]:
        """Every rank's answer; the first to fail or die raises at once."""
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except RayTaskError as error:
                cause = error.cause if isinstance(error.cause, BaseException) else error
                rank = rank_of[done[0]]
                raise RankFailed(f"trainer rank {rank}: {failure_line(cause)}") from None
            except RayActorError as error:
                rank = rank_of[done[0]]
                raise RankFailed(f"trainer rank {rank} died {death(error)}") from None
        return ray.get(refs)

    def stop(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        release(self._group)
        self._group = None
