"""`reinforge sim`: hand-worked cases that pin the simulated loop, and the command as a user
runs it (a real subprocess, calibrating tiny-random).

The hand-worked cases use a profile of round numbers: a decode step of 10 ms at any batch,
a prefill too small to matter, a trainer step of 0.5 s plus 1 ms per token, no sync unless
named, and no slowdown from sharing a device unless named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reinforge.cli import main
from reinforge.config import load_config
from reinforge.sim.config import MODES, Layout, LoopShape, SimConfig
from reinforge.sim.pipeline import Simulation
from reinforge.sim.predict import Prediction, load_workload, predict
from reinforge.sim.profile import Curve, Profile, Sharing, TrainerTimes
from reinforge.sim.workload import GroupCost, RolloutCost, Workload
from reinforge.types import Status, Timings, Trajectory

from .commands import reinforge_here

TINY = 1e-9
"""Seconds of a prefill: there, but too small to change a hand-worked figure."""
ALONE = Sharing(decode=1.0, train=1.0)


def profile(
    decode_s: float = 0.01,
    fixed_s: float = 0.5,
    tokens_per_s: float = 1000.0,
    sync_s: float = 0.0,
    sharing: Sharing = ALONE,
) -> Profile:
    return Profile(
        model="test",
        engine="builtin",
        dtype="float32",
        threads=1,
        decode=Curve.of([(1, decode_s)]),
        prefill=Curve.of([(1, TINY)]),
        trainer=TrainerTimes(fixed_s=fixed_s, tokens_per_s=tokens_per_s, measured=[]),
        sync_s=sync_s,
        sharing=sharing,
    )


def config(*overrides: str) -> SimConfig:
    # admit newcomers at once, so a hand-worked start time is the time they arrive
    return load_config(SimConfig, None, ["engine.admit=at_once", *overrides])


class Fixed:
    """Every group alike: `rollouts` rollouts of `tokens` sampled tokens after a 10-token
    prompt, graded in `grade_s`; slot `slow` (if any) grades in `slow_s` instead; the
    slots in `uniform` have equal rewards (they train nothing), the others all train."""

    def __init__(
        self,
        rollouts: int,
        tokens: int,
        grade_s: float = 0.0,
        slow: int | None = None,
        slow_s: float = 0.0,
        uniform: frozenset[int] = frozenset(),
    ) -> None:
        self.rollouts = rollouts
        self.tokens = tokens
        self.grade_s = grade_s
        self.slow = slow
        self.slow_s = slow_s
        self.uniform = uniform

    def group(self, slot: int) -> GroupCost:
        rollout = RolloutCost(
            prompt_tokens=10, completion_tokens=self.tokens, context_tokens=0, turns=1, env_s=0
        )
        grade_s = self.slow_s if slot == self.slow else self.grade_s
        uniform = slot in self.uniform
        trained = (not uniform,) * self.rollouts
        return GroupCost((rollout,) * self.rollouts, grade_s, trained, uniform)


def simulate(cfg: SimConfig, workload: Workload, prof: Profile, mode: str = "sync", steps: int = 8):
    shape = LoopShape.of(cfg, mode)  # type: ignore[arg-type]
    return Simulation(shape, Layout(1, 1), prof, workload).run(steps)


def test_a_sync_step_is_the_slowest_group_then_train_then_sync():
    # 2 tasks x 2 rollouts of 10 tokens, graded in 1 s. All 4 rows start together: the
    # first iteration gives 2 tokens (prefill + decode), 8 more give the rest, so
    # decoding takes 9 x 10 ms = 0.09 s; grading 1 s; training 4 rollouts of 20 tokens
    # 0.5 + 80 / 1000 = 0.58 s; sync 0.1 s. Step: 0.09 + 1 + 0.58 + 0.1 = 1.77 s.
    cfg = config("rollout.tasks_per_step=2", "rollout.rollouts_per_task=2")
    steps = simulate(cfg, Fixed(2, 10, grade_s=1.0), profile(sync_s=0.1))
    for step in steps:
        assert step.time.total_s == pytest.approx(1.77)
        assert step.time.trainer_idle_s == pytest.approx(1.09)
        assert step.time.train_s == pytest.approx(0.58)
        assert step.time.sync_s == pytest.approx(0.1)
        # nothing in flight while the trainer trains and syncs
        assert step.time.rollout_idle_s == pytest.approx(0.68)
        assert step.trained_samples == 4 and step.dropped_stale == 0
        assert step.staleness == {0: 4 * 10}


def modes_on_a_decode_bound_workload(mode: str, **profile_args: object):
    # 1 task x 1 rollout of 100 tokens: 99 iterations, D = 0.99 s of decoding; a trainer
    # step of T = 0.505 + 110 tokens / 1000 = 0.615 s; max_staleness 1.
    cfg = config("rollout.tasks_per_step=1", "rollout.rollouts_per_task=1")
    prof = profile(fixed_s=0.505, **profile_args)  # type: ignore[arg-type]
    return simulate(cfg, Fixed(1, 100), prof, mode, steps=12)


def test_async_overlaps_decoding_with_training_and_partial_pauses_it():
    # sync: D + T = 1.605 s a step.
    # async: slot n + 2 starts when step n ends and decodes through step n + 1's training,
    #   so end(n + 2) = max(end(n + 1), end(n) + D) + T: two steps every D + T, plus the
    #   0.005 s a released slot waits for the iteration in flight (T ends mid-iteration):
    #   1.61 s.
    # partial: the engine pauses while the trainer trains, so a slot released at the end
    #   of step n waits out step n + 1's training: two steps every D + 2T = 2.22 s.
    per_two_steps = {"sync": 2 * 1.605, "async": 1.61, "partial": 0.99 + 2 * 0.615}
    for mode, expected in per_two_steps.items():
        steps = modes_on_a_decode_bound_workload(mode)[2:]
        pairs = [
            a.time.total_s + b.time.total_s for a, b in zip(steps[::2], steps[1::2], strict=False)
        ]
        assert pairs == pytest.approx([expected] * len(pairs), abs=1e-6), mode


def test_tokens_carry_the_version_that_sampled_them():
    # async: a slot that starts as step n ends decodes through step n + 1's training
    # (0.615 s: iterations 0-61 began before the sync, 63 tokens with the first
    # iteration's two) under version n, the other 37 under n + 1; step n + 2 trains it
    # at version n + 1. The slot after it decodes wholly between two syncs: staleness 1.
    steps = modes_on_a_decode_bound_workload("async")[2:]
    assert [s.staleness for s in steps[:2]] == [{1: 63, 0: 37}, {1: 100}]
    assert all(s.staleness in ({1: 63, 0: 37}, {1: 100}) for s in steps)
    # partial: released slots wait while the next step trains, then both decode under
    # the new version; one trains at once (staleness 0), the other a step later (1)
    steps = modes_on_a_decode_bound_workload("partial")[2:]
    assert all(s.staleness in ({0: 100}, {1: 100}) for s in steps)


def test_sharing_a_device_slows_the_trainer_while_the_engine_decodes():
    # async, colocated, the trainer at half speed beside a decoding engine: step 2 trains
    # while the slot released by step 1 decodes for 0.99 s, doing 0.495 s of its 0.615 s
    # of work; the other 0.12 s at full speed once the engine stops: 1.11 s.
    steps = modes_on_a_decode_bound_workload("async", sharing=Sharing(decode=1.0, train=2.0))
    assert steps[0].time.train_s == pytest.approx(0.615)  # nothing decoding beside it
    assert steps[1].time.train_s == pytest.approx(1.11)


def test_the_staleness_bound_drops_a_group_that_finishes_too_late():
    # 1 task x 2 rollouts a step, bound 1: slots 0 and 1 start together; slot 0's grading
    # takes 10 s, by which time the trainer has moved on many versions: dropped, once,
    # its slot given back; every other step trains the next slot in order.
    cfg = config("rollout.tasks_per_step=1", "rollout.rollouts_per_task=2")
    workload = Fixed(2, 10, slow=0, slow_s=10.0)
    steps = simulate(cfg, workload, profile(), "async", steps=20)
    assert sum(s.dropped_stale for s in steps) == 1
    assert all(s.trained_samples == 2 for s in steps)
    assert all(max(s.staleness) <= 1 for s in steps)
    # sync never drops: nothing is in flight across a weight sync
    steps = simulate(cfg, workload, profile(), "sync", steps=5)
    assert sum(s.dropped_stale for s in steps) == 0
    assert steps[0].time.trainer_idle_s == pytest.approx(10.09)


def test_uniform_groups_give_their_slots_to_the_next_tasks_while_the_redraws_last():
    # sync, 2 tasks x 2 rollouts of 10 tokens (0.09 s of decoding), one redraw a step;
    # slots 0, 2 and 3 have equal rewards.
    # step 1: slots 0 and 1 finish at 0.09 s; 0 is set aside and slot 2 starts in its
    #   place, finishing at 0.18 s: uniform, but the redraw is spent, so it counts. The
    #   step trains slot 1 alone: 0.5 + 40 / 1000 = 0.54 s; 0.18 + 0.54 = 0.72 s.
    # step 2: slots 3 and 4; 3 is set aside for slot 5, which varies: 0.18 + 0.58 s.
    # step 3: slots 6 and 7 vary: 0.09 + 0.58 s, nothing set aside.
    shape = ["rollout.tasks_per_step=2", "rollout.rollouts_per_task=2"]
    workload = Fixed(2, 10, uniform=frozenset({0, 2, 3}))
    steps = simulate(config(*shape, "loop.uniform_redraws=1"), workload, profile(), steps=3)
    assert [s.time.total_s for s in steps] == pytest.approx([0.72, 0.76, 0.67])
    assert [s.time.trainer_idle_s for s in steps] == pytest.approx([0.18, 0.18, 0.09])
    assert [s.redrawn for s in steps] == [1, 1, 0]
    assert [s.trained_samples for s in steps] == [2, 4, 4]
    assert [s.taken_rollouts for s in steps] == [6, 6, 4]  # set-aside groups are taken
    assert [s.staleness for s in steps] == [{0: 20}, {0: 40}, {0: 40}]
    # without redraws a step takes the first 2 groups: slots 2 and 3 train nothing
    steps = simulate(config(*shape), workload, profile(), steps=3)
    assert [s.time.total_s for s in steps] == pytest.approx([0.63, 0.09, 0.67])
    assert [s.redrawn for s in steps] == [0, 0, 0]
    assert [s.trained_samples for s in steps] == [2, 0, 4]


def test_redraws_buy_signal_with_time_and_stay_within_their_budget():
    # half the groups uniform, 4 tasks x 2 rollouts a step, up to 2 set aside a step
    args = ["rollout.tasks_per_step=4", "rollout.rollouts_per_task=2", "sim.workload.signal=0.5"]
    args += ["sim.workload.completion_tokens.median=32", "sim.workload.completion_tokens.cap=256"]
    for mode in MODES:
        runs = {}
        for redraws in (0, 2):
            cfg = config(*args, f"loop.uniform_redraws={redraws}")
            runs[redraws] = steps = simulate(cfg, load_workload(cfg), profile(), mode, steps=30)
            for step in steps:
                assert step.redrawn <= redraws
                assert step.taken_rollouts == (4 + step.redrawn) * 2
                if step.redrawn < redraws:  # the budget lasted: every counted group varies
                    assert step.trained_samples == 4 * 2
                if mode == "sync":  # a slot given back twice starts a group that goes stale
                    assert step.dropped_stale == 0 and set(step.staleness) <= {0}
                else:
                    assert max(step.staleness, default=0) <= 1
        assert sum(s.redrawn for s in runs[2]) > 0, mode
        trained = {r: sum(s.trained_samples for s in steps) for r, steps in runs.items()}
        assert trained[2] > trained[0], mode
        if mode == "sync":  # each redraw waits for one more group
            took = {r: sum(s.time.total_s for s in steps) for r, steps in runs.items()}
            assert took[2] > took[0]


def test_predictions_are_deterministic_for_a_seed():
    args = ["sim.devices=3", "sim.steps=6", "sim.workload.grade_s.median=1.0"]
    args.append("sim.workload.grade_s.sigma=1.0")
    first = predict(config(*args), profile(), load_workload(config(*args)))
    again = predict(config(*args), profile(), load_workload(config(*args)))
    other = config(*args, "sim.seed=1")
    assert first == again
    assert first != predict(other, profile(), load_workload(other))
    # 3 modes x (colocated, 1 + 2, 2 + 1)
    assert [(p.mode, p.samplers, p.trainers) for p in first[:3]] == [
        ("sync", 3, 3),
        ("sync", 1, 2),
        ("sync", 2, 1),
    ]
    assert len(first) == 9 and all(isinstance(p, Prediction) for p in first)


def recorded(
    group: str, index: int, reward: float | None, status: Status = Status.OK
) -> Trajectory:
    """A rollout as a run records it: 3 prompt tokens, 2 sampled, 0.4 s of grading."""
    return Trajectory(
        task_id=group,
        group_id=group,
        index=index,
        token_ids=[1, 2, 3, 4, 5],
        loss_mask=[0, 0, 0, 1, 1],
        logprobs=[-1.0, -1.0],
        policy_versions=[0, 0],
        reward=reward,
        status=status,
        turns=1,
        timings=Timings(env_s=0.25, score_s=0.4),
    )


def write_run(run: Path, trajectories: list[Trajectory]) -> None:
    folder = run / "trajectories"
    folder.mkdir(parents=True)
    lines = [t.model_dump_json() for t in trajectories]
    (folder / "step_00001.jsonl").write_text("\n".join(lines) + "\n")


def test_a_run_gives_the_workload_its_groups(tmp_path):
    # one group of two rollouts: 3 prompt tokens, 2 sampled, graded together in 0.8 s
    # (the generator records 0.4 s on each); rewards differ, so both train
    write_run(tmp_path / "run", [recorded("t", 0, 0.0), recorded("t", 1, 1.0)])
    cfg = config("rollout.rollouts_per_task=2", f"sim.from_run='{tmp_path / 'run'}'")
    group = load_workload(cfg).group(0)
    assert group.grade_s == pytest.approx(0.8) and group.trained == (True, True)
    assert not group.uniform
    assert group.rollouts[0] == RolloutCost(
        prompt_tokens=3, completion_tokens=2, context_tokens=0, turns=1, env_s=0.25
    )
    assert group.trained_tokens == 10


def test_a_run_says_which_groups_are_uniform_as_the_loop_judges_them(tmp_path):
    # under trainer.truncated = "mask": rewards 1, 1 are uniform; two errors are too (fewer
    # than two rewards to differ); two truncated rollouts of rewards 0, 1 vary but are
    # masked: they train nothing, yet the loop keeps them, as it keeps rewards 0, 1
    error, cut = Status.ERROR, Status.TRUNCATED
    rollouts = [recorded("equal", 0, 1.0), recorded("equal", 1, 1.0)]
    rollouts += [recorded("varies", 0, 0.0), recorded("varies", 1, 1.0)]
    rollouts += [recorded("errored", 0, None, error), recorded("errored", 1, None, error)]
    rollouts += [recorded("masked", 0, 0.0, cut), recorded("masked", 1, 1.0, cut)]
    write_run(tmp_path / "run", rollouts)
    args = ["rollout.rollouts_per_task=2", f"sim.from_run='{tmp_path / 'run'}'"]
    args += ["trainer.truncated=mask", "sim.replay=true", "rollout.tasks_per_step=1"]
    cfg = config(*args, "loop.uniform_redraws=1")
    workload = load_workload(cfg)
    costs = [workload.group(slot) for slot in range(4)]
    assert [c.uniform for c in costs] == [True, False, True, False]
    assert [c.trained for c in costs] == [(False,) * 2, (True,) * 2, (False,) * 2, (False,) * 2]
    # replayed in sync: each step sets its uniform group aside and counts the next one
    steps = simulate(cfg, workload, profile(), steps=2)
    assert [s.redrawn for s in steps] == [1, 1]
    assert [s.trained_samples for s in steps] == [2, 0]
    assert [s.taken_rollouts for s in steps] == [4, 4]


def test_a_curve_interpolates_between_points_and_extends_the_last_segment():
    curve = Curve.of([(1, 0.01), (8, 0.02), (16, 0.04)])
    assert curve(1) == curve(0.5) == 0.01
    assert curve(4.5) == pytest.approx(0.015)
    assert curve(32) == pytest.approx(0.08)  # 0.04 + 16 x 0.0025


def test_calibrate_then_predict_through_the_command(tmp_path: Path):
    out = tmp_path / "profile.json"
    small = [
        "sim.calibration.batches=[1, 2]",
        "sim.calibration.decode_tokens=6",
        "sim.calibration.train_tokens=[96, 192]",
        "sim.calibration.rounds=1",
    ]
    done = reinforge_here(
        "sim", "calibrate", "--model", "tiny-random", "--profile", str(out), *small
    )
    assert done.returncode == 0, done.stderr
    measured = Profile.load(out)
    assert [p.x for p in measured.decode.points] == [1, 2]
    assert measured.trainer.tokens_per_s > 0 and measured.model == "tiny-random"

    done = reinforge_here("sim", "--profile", str(out), "--devices", "2", "--steps", "4", "--json")
    assert done.returncode == 2  # the config's model is the default, not tiny-random
    assert done.stderr.strip() == (
        f"reinforge sim: error: {out} was calibrated for tiny-random (builtin, float32), the "
        "config runs smollm2-135m (builtin, float32): calibrate for it (`reinforge sim "
        "calibrate`), or predict with --model tiny-random"
    )
    predict = ("sim", "--profile", str(out), "--model", "tiny-random")
    done = reinforge_here(*predict, "--devices", "2", "--steps", "4", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert len(figures["predictions"]) == 6  # 3 modes x (colocated, 1 + 1)
    assert set(figures["best"]) == {"sync", "async", "partial"}
    for p in figures["predictions"]:
        assert p["step_s"] > 0 and 0 <= p["sampler_utilisation"] <= 1

    done = reinforge_here(*predict, "--devices", "2", "--samplers", "3")
    assert done.returncode == 2
    assert done.stderr.strip() == "reinforge sim: error: --samplers 3 is more than --devices 2"
    done = reinforge_here("sim", "predict", "--profile", str(tmp_path / "none.json"))
    assert done.returncode == 2 and "reinforge sim calibrate" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_predict_refuses_a_profile_of_another_model_engine_or_dtype(tmp_path, capsys):
    path = tmp_path / "profile.json"
    profile().save(path)  # model "test", builtin, float32
    for flags, fix in [
        ([], "--model test"),
        (["--model", "test", "--dtype", "bfloat16"], "--dtype float32"),
        (["--model", "test", "--engine", "vllm"], "--engine builtin"),
    ]:
        assert main(["sim", "--profile", str(path), *flags]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"reinforge sim: error: {path} was calibrated for test (builtin, ")
        assert error.endswith(f"or predict with {fix}\n") and error.count("\n") == 1
    assert main(["sim", "--profile", str(path), "--model", "test", "--steps", "3"]) == 0
    # a dtype of auto is what the profile's machine settled it to (bfloat16 on a GPU)
    profile().model_copy(update={"dtype": "bfloat16"}).save(path)
    assert main(["sim", "--profile", str(path), "--model", "test", "--steps", "3"]) == 0
    assert main(["sim", "--profile", str(path), "--model", "test", "--dtype", "float32"]) == 2
    assert capsys.readouterr().err.endswith("or predict with --dtype bfloat16\n")


def test_sim_reads_the_overrides_it_takes_and_refuses_the_others(tmp_path, capsys):
    path = tmp_path / "profile.json"
    profile().save(path)
    predict = ["sim", "predict", "--profile", str(path), "--model", "test", "--json"]
    assert main([*predict, "--mode", "sync", "sim.steps=3", "rollout.tasks_per_step=2"]) == 0
    (figures,) = json.loads(capsys.readouterr().out)["predictions"]
    assert figures["steps"] == 2  # steps 2 on of 3
    assert figures["rollouts_per_min"] == pytest.approx(2 * 4 * 60 / figures["step_s"])
    measured = "not read by sim predict: the profile measured it (give it to sim calibrate)"
    for args, refused in [
        ([*predict, "optim.lr=0.1"], f"optim.lr: {measured}"),
        (
            [*predict, "sim.calibration.rounds=1"],
            "sim.calibration.rounds: read by sim calibrate only",
        ),
        (["sim", "calibrate", "--mode", "sync"], "--mode: not read by sim calibrate"),
        (["sim", "calibrate", "env.name=wordle"], "env.name: not read by sim calibrate"),
    ]:
        assert main(args) == 2
        assert capsys.readouterr().err == f"reinforge sim: error: {refused}\n"
