"""Where a run's processes go (`cluster.backend`): its trainer ranks and spawned engines, as
processes of this machine, or as Ray actors placed on a cluster (`orchestrate/ray_cluster`).

The loop sees only what either gives it: a `PolicyTrainer` (one in this process when
`trainer.world_size` is 1, else `TrainerRanks` over the ranks) and an engine launcher
(URLs, a weights token, restart and stop), so a config runs on one machine or a cluster
unchanged but for the `cluster` keys and `engines.resources`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from reinforge.config import Config
from reinforge.orchestrate.config import SpawnedEngines
from reinforge.orchestrate.engine_processes import EngineLauncher, EngineProcesses
from reinforge.train.config import TrainerConfig
from reinforge.train.ranks import LocalRanks, Ranks
from reinforge.train.sharded import RankTrainer, TrainerRanks
from reinforge.train.trainer import PolicyTrainer, Trainer, TrainerSpec, build_trainer


class Cluster(Protocol):
    def ranks(self, config: TrainerConfig, factory: Any, *args: Any) -> Ranks:
        """`config.world_size` ranks, each holding `factory(rank, *args)`."""
        ...

    async def engines(self, config: Config, spawned: SpawnedEngines) -> EngineLauncher:
        """The run's `spawned` engines, started and answering."""
        ...


class LocalCluster:
    """This machine: ranks are spawned processes, engines `reinforge serve` processes."""

    def ranks(self, config: TrainerConfig, factory: Any, *args: Any) -> Ranks:
        return LocalRanks(config, factory, *args)

    async def engines(self, config: Config, spawned: SpawnedEngines) -> EngineLauncher:
        return await EngineProcesses.start(config, spawned)


@contextmanager
def open_cluster(config: Config) -> Iterator[Cluster]:
    """The cluster `config.cluster` names, for the run's length."""
    if config.cluster.backend == "local":
        yield LocalCluster()
        return
    from reinforge.orchestrate.ray_cluster import RayCluster  # Ray is an optional extra

    ray = RayCluster(config)
    try:
        yield ray
    finally:
        ray.close()


def open_trainer(
    config: Config, trainer: TrainerConfig, cluster: Cluster, checkpoint: Path | None
) -> PolicyTrainer:
    """The run's trainer with `trainer`'s settings, resumed from `checkpoint` when given:
    in this process, or sharded over `trainer.world_size` ranks of `cluster`."""
    spec = TrainerSpec(
        config.model.name, trainer, config.optim, config.run.steps, checkpoint, config.model.device
    )
    if trainer.world_size == 1:
        return build_trainer(Trainer, spec)
    # resumed once the ranks are up, which says whether they see the run directory
    ranks = TrainerRanks(cluster.ranks(trainer, RankTrainer, replace(spec, checkpoint=None)))
    if checkpoint is not None:
        try:
            ranks.resume(checkpoint)
        except BaseException:
            ranks.close()
            raise
    return ranks
