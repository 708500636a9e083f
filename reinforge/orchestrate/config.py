"""The orchestrator's config sections: the run (directory, length, cadence), the loop (how
rollouts and training interleave), the engines (where the policy samples) and the cluster
(where the run's processes go). The loop and the engines are variants, tagged by
`loop.mode` and `engines.kind`: a key belongs to the variants it applies to, so a key that
would change nothing cannot be written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, Tag, field_validator

from reinforge.types import Section, by_kind, tagged


class RunConfig(Section):
    name: str = "run"
    """The run directory is `<dir>/<name>`."""
    dir: Path = Path("runs")
    """Where run directories are made."""
    steps: int = Field(20, ge=1)
    """Optimizer steps of the run (SFT derives its own from the data)."""
    seed: int = 0
    """Seeds task order and sampling."""
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints; the last step always writes one."""
    keep_checkpoints: int | None = Field(None, ge=1)
    """How many of the newest checkpoints a run keeps; older ones are deleted once a newer
    one is complete. None keeps every one. A checkpoint holds the model and the optimizer's
    state: about 1.6 GB for SmolLM2-135M."""
    trackers: list[Literal["wandb", "mlflow", "trackio"]] = Field(default_factory=list)
    """Experiment trackers that also get each step's metrics and the config (W&B, MLflow,
    trackio; `pip install 'reinforge[trackers]'`); metrics.jsonl is written either way and
    stays the record. Each is set up by its own environment variables (WANDB_MODE,
    MLFLOW_TRACKING_URI, TRACKIO_DIR, ...)."""
    project: str = "reinforge"
    """The W&B or trackio project, or MLflow experiment, that the run is logged under (as
    `name`)."""


class _Loop(Section):
    """The keys of every loop mode."""

    uniform_redraws: int = Field(0, ge=0)
    """Dynamic sampling (DAPO's): each step may set aside up to this many groups whose
    rewards are all equal and that no teacher scores (they would train nothing) and draw
    the next tasks in their place, so that it trains on `rollout.tasks_per_step` groups
    that vary while this lasts. Set-aside groups are sampled by the same weights, recorded
    with the step's trajectories, and counted in its rollout numbers and in
    `zero_variance_groups` and `redrawn`. 0: a step trains on the groups it draws first."""
    max_error_rate: float = Field(0.1, ge=0.0, le=1.0)
    """Fraction of a step's rollouts that may error or time out; past it the run stops once
    the step is recorded, with exit code 3 and the first error. 0.1, as
    `eval.max_error_rate`: errored rollouts are left out of the gradient, so past it a step
    trains on whatever its environment survived, and a broken environment or grader (every
    rollout an error) ends the run at its first step instead of passing for a hard task.
    Timeouts count too: a status cannot tell a slow policy from a hung sandbox. Raise it for
    an environment known to fail now and then."""

    @property
    def staleness_bound(self) -> int:
        """The most policy versions a trained token may lag the trainer's."""
        return 0


class SyncLoop(_Loop):
    """Each step samples its groups with the current weights, trains, syncs: on-policy,
    so no staleness to bound."""

    mode: Literal["sync"] = "sync"


class _OffPolicyLoop(_Loop):
    max_staleness: int = Field(1, ge=0)
    """In policy versions: a group holding a token sampled more than this many versions
    before the trainer's is dropped (counted), never trained. It also bounds how far ahead
    the rollout side runs: at most (max_staleness + 1) steps of groups in flight."""

    @property
    def staleness_bound(self) -> int:
        return self.max_staleness


class AsyncLoop(_OffPolicyLoop):
    """The rollout side runs up to max_staleness steps ahead and keeps generating while the
    trainer trains; a step trains on the first groups to finish."""

    mode: Literal["async"] = "async"


class PartialLoop(_OffPolicyLoop):
    """As async, but the engines pause while the trainer trains, and the rollouts still in
    flight continue under the new weights (carried over)."""

    mode: Literal["partial"] = "partial"
    pause_lease_s: float = Field(600.0, gt=0.0)
    """With served or spawned engines: the longest a server holds decoding for one training
    step. Past it decoding resumes on its own, so a trainer that dies mid-step does not
    stop the engines for good; keep it above the slowest step's training. (An engine in the
    run's process pauses for exactly the step.)"""


LoopConfig = Annotated[
    Annotated[SyncLoop, Tag("sync")]
    | Annotated[AsyncLoop, Tag("async")]
    | Annotated[PartialLoop, Tag("partial")],
    tagged("mode", "sync"),
]


class Resources(Section):
    """What one process of a run asks its cluster for (Ray's resources; the local
    backend's processes share this machine)."""

    cpus: float = Field(1.0, ge=0.0)
    """CPUs Ray reserves for the process; a rank's torch uses as many threads."""
    gpus: float = Field(0.0, ge=0.0)
    """Whole GPUs, or a fraction to share one."""
    memory_gib: float | None = Field(None, gt=0.0)
    """Memory Ray reserves for the process; None: none reserved."""
    custom: dict[str, float] = Field(default_factory=dict)
    """Ray custom resources, e.g. {host_b = 1} to place the process on a node that offers
    them (`ray start --resources='{"host_b": 100}'`): the one key that says where a process
    goes, not only how much it takes. Ray only (`cluster.backend = "ray"`)."""

    @field_validator("custom")
    @classmethod
    def _custom_and_positive(cls, custom: dict[str, float]) -> dict[str, float]:
        builtin = sorted(set(custom) & {"CPU", "GPU", "memory", "object_store_memory"})
        if builtin:
            raise ValueError(f"{builtin[0]} is not custom: ask for it by cpus, gpus or memory_gib")
        for name, amount in custom.items():
            if amount <= 0:
                raise ValueError(f"{name} = {amount:g}: ask for more than 0 of it")
        return custom


class InProcessEngine(Section):
    """One engine in the run's own process, beside a trainer of one process. The built-in
    engine sampling in float32 (`engine.dtype`: auto on a CPU) runs the trainer's own
    model: no second copy of
    the weights, and the optimizer step, made under the engine's lock, is the sync. Any
    other (bfloat16, vLLM) keeps its own copy, refreshed after each step. A sharded
    trainer's weights are not in the run's process: it samples from spawned or served
    engines."""

    kind: Literal["in_process"] = "in_process"


class ServedEngine(Section):
    """One `reinforge serve` that the user started on this machine (the weights reach it as
    a file), started with `server.weights_token`; after each step the trainer pushes its
    weights to it. The run neither starts, restarts nor stops it."""

    kind: Literal["served"] = "served"
    url: str
    """Its /v1 URL, e.g. http://127.0.0.1:8000/v1."""
    token: str | None = None
    """The `server.weights_token` it was started with."""


class FileSync(Section):
    """One safetensors file of the run's node that every engine loads by its path."""

    kind: Literal["file"] = "file"


class ObjectStoreSync(Section):
    """(`cluster.backend = "ray"`) Cast to `engine.dtype`, packed in buckets and put once in
    Ray's object store, from which each engine's actor takes them on its own node and
    hands them to its engine over localhost; no path crosses nodes, and a restarted engine
    catches up from the last push kept there."""

    kind: Literal["object_store"] = "object_store"
    delta: bool = False
    """After the first push, send each bucket as its changed elements with a checksum of
    the result where that is smaller, and an engine's actor builds the bucket on the one it
    holds (a bucket that no delta makes smaller goes whole, as fp32 ones do). It moves a
    small share of the bytes (bf16 at lr 1e-5: about 6%), but the driver compares every
    element and both sides hash every bucket, on one CPU core each: on one machine it made
    a SmolLM2-135M bf16 sync slower, not faster (benchmarks/README.md). Worth it where the
    network out of the driver's node, not its CPU, is what a sync waits for."""


class BroadcastSync(Section):
    """Cast to `engine.dtype` and broadcast in buckets over a gloo process group of the
    run's process and its engines, each engine copying one bucket in while the next
    arrives; no file is written. A restarted engine catches up from the last push, laid in
    a file of the run's own memory on its machine, from Ray's object store on a Ray run's
    nodes."""

    kind: Literal["broadcast"] = "broadcast"
    timeout_s: float = Field(30.0, gt=0.0)
    """The longest the weights group may take to form, and each push over it. An engine
    that dies or hangs mid-push costs the push this long at most, then the push goes on
    without it and the group forms again from the engines up. The sync's own, apart from
    the trainer's: keep it short."""


WeightSyncConfig = Annotated[
    Annotated[FileSync, Tag("file")]
    | Annotated[ObjectStoreSync, Tag("object_store")]
    | Annotated[BroadcastSync, Tag("broadcast")],
    tagged("kind", "file"),
    BeforeValidator(by_kind),
]


class SpawnedEngines(Section):
    """`reinforge serve` processes that the run starts with its model, engine and sampling
    settings, where `cluster.backend` puts them, and stops when it ends. Each episode goes
    to the least-loaded one (its later turns stay there), the weights go to all of them
    after each step, and one that dies is restarted while its episodes' turns go to the
    others."""

    kind: Literal["spawned"] = "spawned"
    count: int = Field(1, ge=1)
    """Engine processes."""
    restarts: int = Field(3, ge=0)
    """How many times, all engines together, the run restarts an engine whose process died
    or stopped answering; one more death stops the run. 0: the first death stops it."""
    resources: Resources = Field(default_factory=Resources)
    """Each engine's resources."""
    weight_sync: WeightSyncConfig = Field(default_factory=FileSync)
    """How new weights reach the engines (`weight_sync = "object_store"` names a variant
    with its defaults)."""


EnginesConfig = Annotated[
    Annotated[InProcessEngine, Tag("in_process")]
    | Annotated[ServedEngine, Tag("served")]
    | Annotated[SpawnedEngines, Tag("spawned")],
    tagged("kind", "in_process"),
]


class ClusterConfig(Section):
    """Where a run's processes go: its trainer ranks (`trainer.world_size`) and its spawned
    engines (`engines.kind = "spawned"`)."""

    backend: Literal["local", "ray"] = "local"
    """local: processes of this machine. ray: Ray actors, each with its resources
    (`cluster.rank`, `engines.resources`), in placement groups (`pip install
    'reinforge[ray]'`)."""
    address: str = ""
    """Ray: the cluster to join, e.g. "auto" for the one this machine belongs to; empty:
    a cluster of this machine alone, started for the run and stopped with it."""
    rank: Resources = Field(default_factory=Resources)
    """Each trainer rank's resources."""
