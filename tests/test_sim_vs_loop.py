"""The simulator against the real loop, step for step, on the same workload.

`reinforge/sim` re-implements the loop of `orchestrate/loop.py` part for part (slots, the
staleness bound and its drops, uniform-group redraws, versions), and two copies of the same
rules drift apart silently. Here one small run trains for real (the tiny random model, the
built-in engine, in this process), the simulator replays the groups that run recorded, and
every step must agree exactly: the groups it took (by slot of the data order), those that
trained, the groups dropped as stale and set aside as uniform, the policy version after
it, and the staleness of every trained token. A change to the loop's rules that the
simulator does not share, or the other way round, fails here.

The real loop's timing is not deterministic and the simulator's is, so each workload is
one whose outcome the run's structure fixes, and the simulator is given times that make
its groups arrive in the same order:
- sync mode: nothing is in flight across a weight sync, and a step waits for every group
  it started, so its outcome does not depend on which group finishes first;
- async mode, on `tests/data/ordered_env.py`: groups reach the trainer one at a time, in
  an order the environment fixes, never while another samples, and some are held back a
  number of trainer steps. The simulator's profile makes sampling take next to no time and
  a trainer step one second, so a held group is given its steps in seconds less a half
  (it arrives during the training of the step the real one waits for).

Partial mode is left out: what it adds to async is the engine pausing while the trainer
trains, which matters to a group that starts as a step begins training on groups already
finished. The simulator holds such a group back until the step has synced; in the real
loop, whether it samples before or after the pause is a matter of timing. And the ordered
environment, which lets no group finish while another samples, never has a step train
on groups finished before it began.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from reinforge.config import Config, load_config
from reinforge.orchestrate.loop import train
from reinforge.orchestrate.metrics import StepMetrics
from reinforge.orchestrate.rollouts import task_seed
from reinforge.sim.config import Layout, LoopShape, Mode, SimConfig
from reinforge.sim.events import SimStep
from reinforge.sim.pipeline import Simulation
from reinforge.sim.profile import Curve, Profile, Sharing, TrainerTimes
from reinforge.sim.workload import GroupCost, read_run
from reinforge.train.trainer import select_for_training
from reinforge.types import Group, Task, Trajectory

from .commands import ROOT

UNIFORM_ENV = str(ROOT / "tests" / "data" / "uniform_env.py")
ORDERED_ENV = str(ROOT / "tests" / "data" / "ordered_env.py")
ORDERED_MODULE = "reinforge_user_env_ordered_env"
STALL_S = 120.0
"""Far longer than any of these runs takes (seconds): past it, the real loop has stalled,
as it would if it stopped starting a group for each one it takes, which the ordered
environment waits for."""

STEP_S = 1.0
"""A simulated trainer step; sampling takes next to no time beside it."""
TIE_S = 1e-4
"""Added per slot to a simulated group's time: groups that sample together arrive in slot
order, as the ordered environment lets them finish."""
PROFILE = Profile(
    model="tiny-random",
    engine="builtin",
    dtype="float32",
    threads=1,
    decode=Curve.of([(1, 1e-8)]),
    prefill=Curve.of([(1, 1e-8)]),
    trainer=TrainerTimes(fixed_s=STEP_S, tokens_per_s=1e15, measured=[]),
    sync_s=0.0,
    sharing=Sharing(decode=1.0, train=1.0),
)


@dataclass(frozen=True)
class Outcome:
    """What one step did with the groups it took, in terms that both sides record."""

    groups: tuple[int, ...]
    """Slots of the groups it took, trained or set aside (not the dropped ones)."""
    trained: tuple[int, ...]
    """Of those, the slots whose rollouts trained."""
    dropped: int
    redrawn: int
    policy_version: int
    staleness: dict[int, int]
    """Trained tokens by staleness: trainer version minus the version that sampled them."""


@dataclass(frozen=True)
class Case:
    """One small workload: a run's settings, shared by the real loop and the simulator, and
    what its run must show for an agreement on it to mean something."""

    mode: Mode
    env: str
    settings: tuple[str, ...]
    shows: Callable[[list[Outcome]], bool]
    """Whether the real run did what the case is there for (set groups aside, dropped one)."""
    holds: tuple[int, ...] = ()
    """The ordered environment's: slot i is held `holds[i]` trainer steps."""
    uniform: tuple[int, ...] = ()
    """The ordered environment's: slots whose groups cannot vary."""

    def overrides(self, run_dir: Path) -> list[str]:
        lists = {"holds": self.holds, "uniform": self.uniform}
        args = [f"env.args.{k}=[{', '.join(map(str, v))}]" for k, v in lists.items() if v]
        return [
            "model.name=tiny-random",
            f"env.name={self.env}",
            f"run.dir={run_dir}",
            "run.name=r",
            "run.checkpoint_every=1000",
            "rollout.rollouts_per_task=2",
            f"loop.mode={self.mode}",
            *self.settings,
            *args,
        ]


def _stalenesses(outcomes: list[Outcome]) -> set[int]:
    return {s for o in outcomes for s in o.staleness}


CASES = {
    # each step's tasks: one whose group varies, one whose group cannot; one redraw a step,
    # and a step whose redraw is uniform too counts it (trains one group of its three)
    "sync-redraws": Case(
        "sync",
        UNIFORM_ENV,
        ("env.args.varying=1", "rollout.tasks_per_step=2", "loop.uniform_redraws=1", "run.steps=4"),
        shows=lambda real: (
            all(o.redrawn == 1 for o in real) and any(len(o.trained) == 1 for o in real)
        ),
    ),
    # every group uniform: a step trains nothing, syncs nothing, and the version stays
    "sync-all-uniform": Case(
        "sync",
        UNIFORM_ENV,
        ("env.args.varying=0", "rollout.tasks_per_step=2", "loop.uniform_redraws=1", "run.steps=2"),
        shows=lambda real: all(o.redrawn == 1 and not o.trained for o in real),
    ),
    # a teacher teaches every task: a group of equal rewards trains on its distillation
    # advantages, so the loop never sets one aside
    "sync-distilled": Case(
        "sync",
        UNIFORM_ENV,
        (
            "env.args.varying=1",
            "rollout.tasks_per_step=2",
            "loop.uniform_redraws=1",
            "run.steps=2",
            'distill.teachers=[{model = "tiny-random"}]',
        ),
        shows=lambda real: all(o.trained == o.groups for o in real),
    ),
    # slot 1 comes back a step after it sampled, and trains; slot 0 two steps after, and
    # reaches the trainer 3 versions behind, one past the bound: dropped. The groups after
    # it wait their turns behind the others in flight, the last 2 versions behind: at the
    # bound, trained.
    "async-drop": Case(
        "async",
        ORDERED_ENV,
        ("rollout.tasks_per_step=1", "loop.max_staleness=2", "run.steps=7"),
        shows=lambda real: sum(o.dropped for o in real) >= 1 and _stalenesses(real) == {0, 1, 2},
        holds=(2, 1),
    ),
    # slots 1 and 2 come back in one step: the first is set aside, the second counts and
    # the step trains nothing; slot 5 is set aside in its step
    "async-redraws": Case(
        "async",
        ORDERED_ENV,
        (
            "rollout.tasks_per_step=1",
            "loop.max_staleness=1",
            "loop.uniform_redraws=1",
            "run.steps=5",
        ),
        shows=lambda real: (
            sum(o.redrawn for o in real) >= 2
            and any(not o.trained for o in real)
            and _stalenesses(real) == {0, 1}
        ),
        uniform=(1, 2, 5),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_the_simulator_replays_a_real_run_step_for_step(tmp_path: Path, name: str):
    case = CASES[name]
    config = load_config(Config, None, case.overrides(tmp_path))
    run = _train(config, case)
    real = _loop_outcomes(run, config)

    sim_config = load_config(SimConfig, None, case.overrides(tmp_path))
    replayed = _Replayed(run, config, case.holds)
    simulation = Simulation(LoopShape.of(sim_config, case.mode), Layout(1, 1), PROFILE, replayed)
    simulated = _sim_outcomes(simulation.run(len(real)), replayed)

    assert simulated == real, _differences(real, simulated)
    assert case.shows(real), f"the run did not do what {name} is there for: {real}"


def _train(config: Config, case: Case) -> Path:
    """The real run, in this process; the ordered environment is told of each step done."""

    def on_step(metrics: StepMetrics) -> None:
        if case.env == ORDERED_ENV:
            sys.modules[ORDERED_MODULE].steps_done += 1

    async def within_limit() -> Path:
        training = asyncio.ensure_future(train(config, on_step))
        done, _ = await asyncio.wait({training}, timeout=STALL_S)
        if not done:
            training.cancel()
            await asyncio.gather(training, return_exceptions=True)
            pytest.fail(f"the real loop stalled: no end after {STALL_S:.0f} s")
        return training.result()

    return asyncio.run(within_limit())


def _slot_of(config: Config) -> Callable[[str], int]:
    """A task id's slot in the data order. The test environments name their tasks
    `<kind>-<seed>-<index>`; the seed is that of the tasks' step of the data order
    (`task_seed`), looked up among far more steps than a run of these started."""
    per_step = config.rollout.tasks_per_step
    steps = {task_seed(config.run.seed, step): step for step in range(100 * config.run.steps)}

    def slot(task_id: str) -> int:
        _, seed, index = task_id.rsplit("-", 2)
        return steps[int(seed)] * per_step + int(index)

    return slot


def _recorded(run: Path) -> list[list[Group]]:
    """Each step's groups as the run recorded them (all it took, in slot order)."""
    steps = []
    for path in sorted((run / "trajectories").glob("step_*.jsonl")):
        trajectories = [Trajectory.model_validate_json(line) for line in path.open()]
        groups: list[Group] = []
        for trajectory in trajectories:
            if groups and groups[-1].task.id == trajectory.group_id:
                groups[-1].trajectories.append(trajectory)
            else:
                task = Task(id=trajectory.group_id, prompt=[])
                groups.append(Group(task=task, trajectories=[trajectory]))
        steps.append(groups)
    return steps


def _loop_outcomes(run: Path, config: Config) -> list[Outcome]:
    """The real run's steps, from its metrics and trajectories. Which rollouts trained is
    decided again as the loop decides it, and checked against what its metrics say."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    slot = _slot_of(config)
    outcomes, version = [], 0
    for row, groups in zip(rows, _recorded(run), strict=True):
        selection = select_for_training(groups, config.trainer, config.distill, row["redrawn"])
        staleness = Counter(version - v for t in selection.trajectories for v in t.policy_versions)
        assert len(selection.trajectories) == row["trained_samples"]
        assert max(staleness, default=0) == row["staleness_max"]
        outcomes.append(
            Outcome(
                groups=tuple(slot(g.task.id) for g in groups),
                trained=tuple(sorted({slot(t.group_id) for t in selection.trajectories})),
                dropped=row["dropped_stale"],
                redrawn=row["redrawn"],
                policy_version=row["policy_version"],
                staleness=dict(staleness),
            )
        )
        version = row["policy_version"]
    return outcomes


class _Replayed:
    """The real run's groups by slot (what they sampled, and which of their rollouts
    trained), with times that make them arrive in the order the run had: slot by slot,
    and a held group its steps less a half later (steps of `STEP_S`: every step until it
    is due must train). A slot the run never recorded (dropped, or still in flight at its
    end) gets the shape of a recorded group; should the simulator take one, the steps
    differ."""

    def __init__(self, run: Path, config: Config, holds: tuple[int, ...]) -> None:
        self.most = 10 * config.run.steps * config.rollout.tasks_per_step
        """Far more slots than the run started: a simulation that gets there is lost (one
        that drops every group draws the next for ever)."""
        slot = _slot_of(config)
        ids = [g.task.id for groups in _recorded(run) for g in groups]
        costs = read_run(run, config.trainer, config.distill)  # in the same order
        self.costs = {slot(i): cost for i, cost in zip(ids, costs, strict=True)}
        first = costs[0]
        self.unrecorded = replace(first, trained=(True,) * len(first.rollouts), uniform=False)
        self.holds = holds

    def group(self, slot: int) -> GroupCost:
        if slot > self.most:
            raise AssertionError(f"the simulator started slot {slot}: far more than the run")
        cost = self.costs.get(slot, self.unrecorded)
        hold = self.holds[slot] if slot < len(self.holds) else 0
        held_s = (hold - 0.5) * STEP_S if hold else 0.0
        return replace(
            cost,
            rollouts=tuple(replace(r, env_s=0.0) for r in cost.rollouts),
            grade_s=held_s + slot * TIE_S,
        )


def _sim_outcomes(steps: list[SimStep], workload: _Replayed) -> list[Outcome]:
    outcomes = []
    for step in steps:
        trained = tuple(s for s in step.slots if any(workload.group(s).trained))
        samples = sum(sum(workload.group(s).trained) for s in step.slots)
        assert samples == step.trained_samples
        outcomes.append(
            Outcome(
                groups=step.slots,
                trained=trained,
                dropped=step.dropped_stale,
                redrawn=step.redrawn,
                policy_version=step.policy_version,
                staleness=dict(step.staleness),
            )
        )
    return outcomes


def _differences(real: list[Outcome], simulated: list[Outcome]) -> str:
    lines = ["the simulator and the real loop differ:"]
    for number, (r, s) in enumerate(zip(real, simulated, strict=True), start=1):
        mark = "  " if r == s else "!="
        lines.append(f"{mark} step {number}: loop {r}")
        lines.append(f"{mark} step {number}: sim  {s}")
    return "\n".join(lines)
