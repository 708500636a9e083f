"""The simulator's config: the train tree (`Config`) plus a `sim` section.

The loop's own settings (`loop.max_staleness`, `loop.uniform_redraws`,
`rollout.tasks_per_step`, `rollout.rollouts_per_task`, `rollout.concurrency`,
`engine.max_batch`, ...) are read from the same keys `reinforge train` reads, so a run's
config file simulates as it trains; the `sim` section holds only what a run does not have:
the profile, the devices, and a parametric workload for a run not yet made. `LoopShape` is
what the simulated loop reads of all that, and `Layout` one placement of the devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from reinforge.config import Config
from reinforge.orchestrate.config import AsyncLoop, SyncLoop
from reinforge.policy.config import AtOnce, Grouped
from reinforge.types import Section

Mode = Literal["sync", "async", "partial"]
MODES: tuple[Mode, ...] = ("sync", "async", "partial")


class Lognormal(Section):
    """A lognormal law by its median and sigma, capped: long-tailed like completion lengths
    and test-suite times are. Sigma 0 makes every draw the median."""

    median: float = Field(ge=0.0)
    sigma: float = Field(0.0, ge=0.0)
    cap: float | None = Field(None, gt=0.0)
    """Largest draw; None: uncapped."""


class ParametricWorkload(Section):
    """What each rollout costs when no run says so. Draws are independent per rollout."""

    completion_tokens: Lognormal = Field(
        default_factory=lambda: Lognormal(median=256, sigma=1.0, cap=2048)
    )
    """Sampled tokens per rollout, over all its turns; `env.max_tokens_per_turn` x turns
    caps them too, when set."""
    prompt_tokens: int = Field(128, ge=1)
    """The first prompt's tokens."""
    turns: int = Field(1, ge=1)
    """Policy turns per rollout; the completion tokens and `env_s` split evenly over them."""
    env_s: Lognormal = Field(default_factory=lambda: Lognormal(median=0.0))
    """Seconds per rollout in tools and the environment, while it holds a concurrency slot."""
    grade_s: Lognormal = Field(default_factory=lambda: Lognormal(median=0.0))
    """Seconds of grading per rollout. A group's rollouts are graded together once all
    have finished, so a group waits for its slowest grade."""
    signal: float = Field(1.0, ge=0.0, le=1.0)
    """Share of groups whose rewards differ; the others are uniform: they train nothing,
    and `loop.uniform_redraws` may set them aside."""


class CalibrationSection(Section):
    """What `reinforge sim calibrate` measures: a minute or two on SmolLM2-135M on a CPU."""

    batches: list[int] | None = None
    """Batch sizes whose decode step is timed; None: 1, 2, 4, ... up to engine.max_batch."""
    decode_tokens: int = Field(16, ge=4)
    """Tokens each request of a timed batch decodes."""
    prompt_tokens: int = Field(32, ge=1)
    """Tokens of each calibration prompt (their prefill is timed too)."""
    train_tokens: list[int] = Field(default_factory=lambda: [512, 1024, 2048])
    """Sequence tokens of the timed trainer steps (rows of prompt_tokens + 64 tokens)."""
    rounds: int = Field(3, ge=1)
    """Times each batch size and each trainer step is measured. A shared machine's load
    comes and goes and only adds time, so the least-loaded round is kept."""


class SimSection(Section):
    profile: Path = Path("sim-profile.json")
    """The timings `reinforge sim calibrate` writes and `reinforge sim predict` reads."""
    from_run: Path | None = None
    """A run directory whose trajectories give the workload (completion lengths, tool and
    grading times, which groups trained); None: `workload`."""
    replay: bool = False
    """With `from_run`: slot i of the data order gets the run's i-th group (exact for a
    sync run: a what-if of that run in another mode or layout); off: groups drawn from the
    run at random."""
    workload: ParametricWorkload = Field(default_factory=ParametricWorkload)
    modes: list[Mode] = Field(default_factory=lambda: list(MODES))
    """Loop modes to simulate."""
    max_staleness: int | None = Field(None, ge=0)
    """The staleness bound of the simulated async and partial loops; None: the config's
    `loop.max_staleness` when its loop is async or partial, else an async loop's default."""
    devices: int = Field(1, ge=1, le=64)
    """Devices to place. Every split is simulated: S samplers and devices - S trainers, and
    all of them sampling and training in turn (colocated, as one machine does)."""
    samplers: int | None = Field(None, ge=1)
    """Simulate only this many sampler devices (= devices: colocated); None: every split."""
    sync_s: float | None = Field(None, ge=0.0)
    """Seconds of a weight sync; None: the profile's, measured colocated. Separate sampler
    devices receive the weights over a link: set it for that."""
    steps: int = Field(50, ge=2)
    """Steps simulated; the figures cover steps 2 on, as benchmarks/async.py measures."""
    seed: int = 0
    """Seeds the workload's draws: every mode and layout gets the same group in a slot."""
    calibration: CalibrationSection = Field(default_factory=CalibrationSection)

    @field_validator("modes", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`--mode sync,async` as a list."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class SimConfig(Config):
    """`reinforge sim calibrate` and `reinforge sim predict`."""

    sim: SimSection = Field(default_factory=SimSection)


@dataclass(frozen=True)
class Layout:
    samplers: int
    """Devices that run an engine each."""
    devices: int
    """All devices; `samplers == devices` means colocated: each device samples and trains."""

    @property
    def colocated(self) -> bool:
        return self.samplers == self.devices

    @property
    def trainers(self) -> int:
        return self.devices if self.colocated else self.devices - self.samplers

    def __str__(self) -> str:
        if self.colocated:
            return f"{self.devices} shared"
        return f"{self.samplers} + {self.trainers}"


@dataclass(frozen=True)
class LoopShape:
    """The settings of the real loop and engine that the simulation obeys."""

    mode: Mode
    max_staleness: int
    uniform_redraws: int
    tasks_per_step: int
    concurrency: int
    max_batch: int
    admit: AtOnce | Grouped

    @classmethod
    def of(cls, config: SimConfig, mode: Mode) -> LoopShape:
        return cls(
            mode=mode,
            max_staleness=0 if mode == "sync" else _off_policy_bound(config),
            uniform_redraws=config.loop.uniform_redraws,
            tasks_per_step=config.rollout.tasks_per_step,
            concurrency=config.rollout.concurrency,
            max_batch=config.engine.max_batch,
            admit=config.engine.admit,
        )


def _off_policy_bound(config: SimConfig) -> int:
    """The staleness bound of a simulated async or partial loop."""
    if config.sim.max_staleness is not None:
        return config.sim.max_staleness
    if isinstance(config.loop, SyncLoop):  # an on-policy run: as it would run async
        return AsyncLoop().max_staleness
    return config.loop.max_staleness
