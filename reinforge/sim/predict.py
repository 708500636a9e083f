"""From simulated steps to the figures a run reports, for each mode and placement of the
devices, and the best placement of each mode.

Figures cover steps 2 on, as `benchmarks/async.py` measures real runs: the first step
starts with an empty pipeline. Samples per minute is 60 x trained samples / step time
summed over those steps, as in metrics.jsonl.
"""

from __future__ import annotations

from collections import Counter
from statistics import fmean

from reinforge.errors import UsageError
from reinforge.sim.config import Layout, LoopShape, Mode, SimConfig
from reinforge.sim.events import SimStep
from reinforge.sim.pipeline import Simulation
from reinforge.sim.profile import Profile
from reinforge.sim.workload import Parametric, Recorded, Workload, read_run
from reinforge.types import Record


class Prediction(Record):
    mode: Mode
    samplers: int
    trainers: int
    colocated: bool
    """Every device both samples and trains."""
    steps: int
    """Steps the figures cover."""
    step_s: float
    """Mean `time.total_s`."""
    samples_per_min: float
    rollouts_per_min: float
    """Rollouts the steps took, trained or not (their groups' rewards all equal), set
    aside or not."""
    trainer_idle_s: float
    train_s: float
    sync_s: float
    rollout_idle_s: float
    staleness_mean: float
    """Over trained tokens."""
    staleness_max: int
    staleness: dict[int, float]
    """Share of trained tokens at each staleness."""
    dropped_per_step: float
    redrawn_per_step: float
    """Uniform groups set aside (`loop.uniform_redraws`)."""
    sampler_utilisation: float
    """Share of the time the sampler devices run engine iterations."""
    trainer_utilisation: float
    """Share of the time the trainer devices train or sync."""

    @property
    def layout(self) -> Layout:
        devices = self.samplers if self.colocated else self.samplers + self.trainers
        return Layout(self.samplers, devices)


def load_workload(config: SimConfig) -> Workload:
    sim = config.sim
    size = config.rollout.rollouts_per_task
    if sim.from_run is None:
        if sim.replay:
            raise UsageError("sim.replay replays a run: give one with --from-run")
        return Parametric(sim.workload, size, config.env.max_tokens_per_turn, sim.seed)
    groups = read_run(sim.from_run, config.trainer, config.distill)
    found = len(groups[0].rollouts)
    if found != size:
        raise UsageError(
            f"{sim.from_run} has groups of {found} rollouts, rollout.rollouts_per_task is "
            f"{size}: pass the run's config (or --rollouts {found})"
        )
    return Recorded(groups, sim.replay, sim.seed)


def check_profile(profile: Profile, config: SimConfig) -> None:
    """Refuse a profile of another model, engine or dtype than the config's: its timings
    would predict another run than the one asked about, and nothing would say so. A dtype
    of auto is what the profile's machine settled it to."""
    flags = ("--model", "--engine", "--dtype")
    measured = (profile.model, profile.engine, profile.dtype)
    dtype = profile.dtype if config.engine.dtype == "auto" else config.engine.dtype
    configured = (config.model.name, config.model.engine, dtype)
    if measured == configured:
        return
    pairs = zip(flags, measured, configured, strict=True)
    fix = " ".join(f"{flag} {mine}" for flag, mine, asked in pairs if mine != asked)
    raise UsageError(
        f"{config.sim.profile} was calibrated for {measured[0]} ({measured[1]}, {measured[2]}), "
        f"the config runs {configured[0]} ({configured[1]}, {configured[2]}): calibrate for "
        f"it (`reinforge sim calibrate`), or predict with {fix}"
    )


def layouts(config: SimConfig) -> list[Layout]:
    devices, samplers = config.sim.devices, config.sim.samplers
    if samplers is not None:
        if samplers > devices:
            raise UsageError(f"--samplers {samplers} is more than --devices {devices}")
        return [Layout(samplers, devices)]
    return [Layout(devices, devices), *(Layout(s, devices) for s in range(1, devices))]


def predict(config: SimConfig, profile: Profile, workload: Workload) -> list[Prediction]:
    """Every mode of `sim.modes` in every layout of `sim.devices`, on the same workload."""
    predictions = []
    for mode in config.sim.modes:
        shape = LoopShape.of(config, mode)
        for layout in layouts(config):
            simulation = Simulation(shape, layout, profile, workload, config.sim.sync_s)
            steps = simulation.run(config.sim.steps)
            predictions.append(summarize(steps[1:], mode, layout))
    return predictions


def best(predictions: list[Prediction]) -> dict[Mode, Prediction]:
    """Each mode's layout with the most trained samples per minute (then rollouts)."""
    chosen: dict[Mode, Prediction] = {}
    for p in predictions:
        current = chosen.get(p.mode)
        if current is None or _rank(p) > _rank(current):
            chosen[p.mode] = p
    return chosen


def _rank(p: Prediction) -> tuple[float, float]:
    return (round(p.samples_per_min, 6), round(p.rollouts_per_min, 6))


def summarize(steps: list[SimStep], mode: Mode, layout: Layout) -> Prediction:
    total_s = sum(s.time.total_s for s in steps)
    staleness: Counter[int] = Counter()
    for step in steps:
        staleness.update(step.staleness)
    tokens = sum(staleness.values())
    busy_train = sum(s.time.train_s + s.time.sync_s for s in steps)
    return Prediction(
        mode=mode,
        samplers=layout.samplers,
        trainers=layout.trainers,
        colocated=layout.colocated,
        steps=len(steps),
        step_s=total_s / len(steps),
        samples_per_min=60 * sum(s.trained_samples for s in steps) / total_s,
        rollouts_per_min=60 * sum(s.taken_rollouts for s in steps) / total_s,
        trainer_idle_s=fmean(s.time.trainer_idle_s for s in steps),
        train_s=fmean(s.time.train_s for s in steps),
        sync_s=fmean(s.time.sync_s for s in steps),
        rollout_idle_s=fmean(s.time.rollout_idle_s for s in steps),
        staleness_mean=sum(k * n for k, n in staleness.items()) / tokens if tokens else 0.0,
        staleness_max=max(staleness, default=0),
        staleness={k: staleness[k] / tokens for k in sorted(staleness)},
        dropped_per_step=fmean(s.dropped_stale for s in steps),
        redrawn_per_step=fmean(s.redrawn for s in steps),
        sampler_utilisation=sum(s.sampler_busy_s for s in steps) / (layout.samplers * total_s),
        trainer_utilisation=busy_train / total_s,
    )
