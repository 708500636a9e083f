"""The orchestrator's config sections: the run (directory, length, cadence) and the loop
(how rollouts and training interleave)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from reinforge.types import Section


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


class LoopConfig(Section):
    """How rollouts and training interleave. In every mode a token trained at trainer
    version V was sampled by version V - max_staleness or later."""

    mode: Literal["sync", "async", "partial"] = "sync"
    """sync: each step samples its groups with the current weights, trains, syncs (on-policy;
    max_staleness does not apply). async: the rollout side runs up to max_staleness steps
    ahead and keeps generating while the trainer trains; a step trains on the first groups
    to finish. partial: as async, but the engine pauses while the trainer trains and the
    rollouts still in flight continue under the new weights (carried over)."""
    max_staleness: int = Field(1, ge=0)
    """In policy versions: a group holding a token sampled more than this many versions
    before the trainer's is dropped (counted), never trained. It also bounds how far ahead
    the rollout side runs: at most (max_staleness + 1) steps of groups in flight."""
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
    engine_url: str | None = None
    """The /v1 URL of a `reinforge serve` on this machine to sample from, e.g.
    http://127.0.0.1:8000/v1; None: an engine in this process."""
    engine_token: str | None = None
    """The `server.weights_token` that server was started with."""
    pause_lease_s: float = Field(600.0, gt=0.0)
    """Partial mode with `engine_url`: the longest the server holds decoding for one
    training step. Past it decoding resumes on its own, so a trainer that dies mid-step
    does not stop the engine for good; keep it above the slowest step's training."""


class Resources(Section):
    """What one process of a run asks its cluster for (Ray's resources; the local
    backend's processes share this machine)."""

    cpus: float = Field(1.0, ge=0.0)
    """CPUs Ray reserves for the process; a rank's torch uses as many threads."""
    gpus: float = Field(0.0, ge=0.0)
    """Whole GPUs, or a fraction to share one."""
    memory_gib: float | None = Field(None, gt=0.0)
    """Memory Ray reserves for the process; None: none reserved."""


class ClusterConfig(Section):
    """Where a run's processes go: its trainer ranks (`trainer.world_size`) and its engines
    (`rollout.engines`, or one for a sharded trainer)."""

    backend: Literal["local", "ray"] = "local"
    """local: processes of this machine. ray: Ray actors, each with the resources below,
    in placement groups (`pip install 'reinforge[ray]'`)."""
    address: str = ""
    """Ray: the cluster to join, e.g. "auto" for the one this machine belongs to; empty:
    a cluster of this machine alone, started for the run and stopped with it."""
    engine: Resources = Field(default_factory=Resources)
    """Each engine's resources."""
    rank: Resources = Field(default_factory=Resources)
    """Each trainer rank's resources."""
    weight_sync: Literal["file", "object_store"] = "file"
    """How new weights reach the run's engines. file: one safetensors file of the run's
    machine that every engine loads by its path. object_store (Ray): cast to
    `engine.dtype`, packed in buckets and put once in Ray's object store, from which each
    engine's actor takes them on its own node and hands them to its engine over localhost;
    no path crosses nodes, and a restarted engine catches up from the last push kept there."""
