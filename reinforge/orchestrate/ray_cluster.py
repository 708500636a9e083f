"""The Ray backend (`cluster.backend = "ray"`): the run's trainer ranks and spawned engines
as Ray actors, each with its `cluster.rank` or `engines.resources`, one placement group per
kind (packed: a rank's collectives and an engine's weight loads stay on few nodes).

- **Ranks** (`orchestrate/ray_ranks.py`). Each actor joins the process group (rendezvous
  at rank 0's node) and holds its `ShardedTrainer`; a call goes to every actor and the
  first failure ends them all, as with `LocalRanks`.
- **Engines** (`orchestrate/ray_engines.py`). Each actor (`ray_engine_actor.py`, which
  imports no model stack) starts `reinforge serve` listening on its node's address, which
  the run reaches it at, and relays the run's control posts to it over the node's loopback.
- **Whose node.** `POST /v1/weights` takes weights from the engine's own machine only: by
  the default transport (`file`) the engines load a file of the run's node, so they must
  run there; with `object_store` each actor posts to its engine from its own node, so
  engines go wherever they are placed (`engines.resources.custom` pins them); a placement
  that breaks this is refused in one line. Trainer ranks go anywhere: a rank 0 off the
  driver's node sends the weights and checkpoints it writes by value (`TrainerRanks`).

A run that names no `cluster.address` starts a cluster of this machine for itself and
stops it at the end, so nothing of Ray stays behind; one that joins a cluster leaves it
running and takes its actors away.
"""

from __future__ import annotations

import os
from typing import Any

from reinforge.config import Config
from reinforge.errors import UsageError
from reinforge.orchestrate.config import Resources, SpawnedEngines
from reinforge.orchestrate.ray_actors import node_id, ray
from reinforge.orchestrate.ray_engines import RayEngines
from reinforge.orchestrate.ray_ranks import RayRanks
from reinforge.train.config import TrainerConfig

if ray is not None:
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLACE_S = 120.0
"""How long a placement group may wait for the cluster's resources before the run says
what was missing (Ray itself would wait for ever)."""


class RayCluster:
    def __init__(self, config: Config) -> None:
        if ray is None:
            raise UsageError("cluster.backend = ray needs Ray: pip install 'reinforge[ray]'")
        self.config = config
        address = config.cluster.address or None
        options: dict[str, Any] = {}
        if address is None:  # this machine alone: as many CPUs as the run's processes ask
            options["num_cpus"] = max(os.cpu_count() or 1, _asked(config, "cpus"))
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **options,
            )
        except ConnectionError as error:
            raise UsageError(f"cluster.address = {address!r}: {error}") from error
        hidden = hidden_gpus(config, ray.cluster_resources().get("GPU", 0.0))
        if hidden is not None:
            ray.shutdown()
            raise UsageError(hidden)
        self.node = node_id()
        """The run's own node, whose files the engines of the `file` transport load and
        whose files a rank 0 there writes by path. By Ray's node id: two nodes of one
        machine may share an IP address."""

    def ranks(self, config: TrainerConfig, factory: Any, *args: Any) -> RayRanks:
        return RayRanks(self, config, factory, args)

    async def engines(self, config: Config, spawned: SpawnedEngines) -> RayEngines:
        return await RayEngines.start(self, config, spawned)

    def close(self) -> None:
        ray.shutdown()

    def place(self, resources: Resources, count: int, what: str) -> tuple[Any, list[dict]]:
        """A packed placement group of `count` bundles of `resources`, ready; and the actor
        options of each bundle. One line naming what is missing if the cluster has not."""
        bundle = {"CPU": resources.cpus, "GPU": resources.gpus}
        if resources.memory_gib is not None:
            bundle["memory"] = resources.memory_gib * 2**30
        bundle = {key: value for key, value in bundle.items() if value} | resources.custom
        group = placement_group([bundle] * count, strategy="PACK")
        try:
            ray.get(group.ready(), timeout=PLACE_S)
        except GetTimeoutError:
            remove_placement_group(group)
            raise UsageError(
                f"the Ray cluster cannot place {count} {what} of {bundle} within "
                f"{PLACE_S:.0f} s: it has {ray.available_resources()} available"
            ) from None
        options = [
            {
                "num_cpus": resources.cpus,
                "num_gpus": resources.gpus,
                "memory": bundle.get("memory"),
                "resources": resources.custom,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=i
                ),
            }
            for i in range(count)
        ]
        return group, options

    def require_here(self, node: str, what: str, why: str) -> None:
        if node != self.node:
            raise UsageError(
                f"Ray placed {what} on node {node}, not the run's ({self.node}): {why} "
                "(docs/scale.md)"
            )


def hidden_gpus(config: Config, cluster_gpus: float) -> str | None:
    """Why the run would not see the cluster's GPUs, if it would not: Ray shows an actor
    only the GPUs it asks for, so processes asking for none train or decode on CPUs,
    silently, however many GPUs their node has."""
    if not cluster_gpus or config.model.device == "cpu":
        return None
    sharded = config.trainer.world_size > 1
    processes: list[tuple[str, Resources, str]] = []
    if sharded:
        processes.append(("cluster.rank", config.cluster.rank, "trainer ranks"))
    if isinstance(config.engines, SpawnedEngines):
        processes.append(("engines.resources", config.engines.resources, "engines"))
    blind = [(key, what) for key, resources, what in processes if resources.gpus == 0]
    if not blind:
        return None
    keys = " and ".join(f"{key}.gpus" for key, _ in blind)
    whats = " and ".join(what for _, what in blind)
    # a sharded trainer's ranks take the device auto gives them (the config allows no other)
    or_cpus = "" if sharded else ', or model.device = "cpu" for CPUs'
    return (
        f"the Ray cluster has {cluster_gpus:g} GPUs, but {keys} = 0 hides them from the "
        f"run's {whats} (Ray shows an actor only the GPUs it asks for): set {keys} = 1"
        f"{or_cpus}"
    )


def _asked(config: Config, resource: str) -> float:
    ranks = config.trainer.world_size if config.trainer.world_size > 1 else 0
    asked = ranks * getattr(config.cluster.rank, resource)
    if isinstance(config.engines, SpawnedEngines):
        asked += config.engines.count * getattr(config.engines.resources, resource)
    return asked
