"""Does `reinforge sim` predict real runs? Real short runs of each loop mode on this machine
against the simulator's prediction of the same config, side by side.

1. For each of sync, async and partial, one after the other:
   - `reinforge sim calibrate` on the model (tiny-random by default): the engine's decode
     step against the batch, prefill, trainer steps, sync, and both sides at once. Right
     before each run, because this machine's load, and with it every timing, drifts by
     several times within minutes (other work shares its 2 cores);
   - `reinforge train` in that mode on the long-tailed workload of `benchmarks/async.py`
     (`benchmarks/tail_env.py`: Pareto list lengths, lognormal grader sleeps seeded by
     the slot), with its settings: 8 tasks x 4 rollouts, 64 tokens a turn,
     `loop.max_staleness=1`, seed 0.
2. `reinforge sim predict --mode MODE --from-run <the sync run> sim.replay=true` on the
   profile measured before that mode's run: slot i of the data order gets the sync run's
   i-th group (the same task, so the same grader delays, as every mode draws for that
   slot), for the same number of steps; and, for reference, the same workload resampled
   over 100 steps (the steady state).

Step time is the mean `time.total_s` and samples per minute 60 x trained samples / step
time summed, both over steps 2 on, from metrics.jsonl read as `StepMetrics`; the
prediction covers the same steps. The ratio is predicted / measured; the target is
within 20%.

    python benchmarks/sim_validate.py --json benchmarks/sim_validate-results.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reinforge.orchestrate.metrics import StepMetrics

REPO = Path(__file__).resolve().parents[1]
MODES = ("sync", "async", "partial")
TARGET = 0.2
"""Predicted step time within this share of the measured."""


def loop_settings(args: argparse.Namespace) -> list[str]:
    """What the runs and the simulation share."""
    return [
        f"model.name={args.model}",
        f"rollout.tasks_per_step={args.tasks_per_step}",
        f"rollout.rollouts_per_task={args.rollouts_per_task}",
    ]


def reinforge(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "reinforge", *command], cwd=REPO, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"reinforge {command[0]} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def train(args: argparse.Namespace, mode: str, scratch: Path) -> dict[str, Any]:
    load = os.getloadavg()[0]
    started = time.perf_counter()
    reinforge(
        "train",
        *loop_settings(args),
        "env.name=benchmarks/tail_env.py",
        f"env.args.max_tokens={args.max_tokens}",
        f"run.steps={args.steps}",
        f"run.seed={args.seed}",
        f"run.checkpoint_every={args.steps}",
        f"loop.mode={mode}",
        *([] if mode == "sync" else [f"loop.max_staleness={args.max_staleness}"]),
        f"run.dir={scratch}",
        f"run.name={mode}",
    )
    lines = (scratch / mode / "metrics.jsonl").read_text().splitlines()
    steps = [StepMetrics.model_validate_json(line) for line in lines][1:]
    total_s = sum(s.time.total_s for s in steps)
    trained = [s for s in steps if s.trained_samples]
    samples = sum(s.trained_samples for s in steps)
    return {
        "step_s": total_s / len(steps),
        "samples_per_min": 60 * samples / total_s,
        "trainer_idle_s": sum(s.time.trainer_idle_s for s in steps) / len(steps),
        "train_s": sum(s.time.train_s + s.time.sync_s for s in steps) / len(steps),
        "staleness_mean": sum(s.staleness_mean * s.trained_samples for s in trained)
        / max(samples, 1),
        "dropped_per_step": sum(s.dropped_stale for s in steps) / len(steps),
        "wall_s": time.perf_counter() - started,
        "load": [load, os.getloadavg()[0]],
    }


def predict(
    args: argparse.Namespace, mode: str, profile: Path, run: Path, replay: bool
) -> dict[str, Any]:
    steps = args.steps if replay else 100
    out = reinforge(
        "sim",
        "predict",
        f"--mode={mode}",
        f"--max-staleness={args.max_staleness}",
        f"--profile={profile}",
        f"--from-run={run}",
        "--json",
        *loop_settings(args),
        f"sim.replay={'true' if replay else 'false'}",
        f"sim.steps={steps}",
    )
    (prediction,) = json.loads(out)["predictions"]
    return prediction


def row(mode: str, measured: dict[str, Any], replay: dict[str, Any], steady: dict[str, Any]) -> str:
    ratio = replay["step_s"] / measured["step_s"]
    met = "met" if abs(ratio - 1) <= TARGET else "not met"
    return (
        f"| {mode} | {measured['step_s']:.2f} | {replay['step_s']:.2f} | **{ratio:.2f}** ({met}) "
        f"| {steady['step_s']:.2f} | {measured['samples_per_min']:.1f} "
        f"| {replay['samples_per_min']:.1f} | "
        f"{replay['samples_per_min'] / measured['samples_per_min']:.2f} "
        f"| {measured['trainer_idle_s']:.2f} / {replay['trainer_idle_s']:.2f} "
        f"| {measured['train_s']:.2f} / {replay['train_s'] + replay['sync_s']:.2f} "
        f"| {measured['staleness_mean']:.2f} / {replay['staleness_mean']:.2f} "
        f"| {measured['dropped_per_step']:.2f} / {replay['dropped_per_step']:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--steps", type=int, default=6, help="per run; figures from step 2 on")
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--rollouts-per-task", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64, help="sampled tokens per turn")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the runs and profiles in this folder")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sim-validate-") as temp:
        scratch = args.keep or Path(temp)
        scratch.mkdir(parents=True, exist_ok=True)
        measured, profiles = {}, {}
        for mode in MODES:
            profiles[mode] = profile = scratch / f"profile-{mode}.json"
            started = time.perf_counter()
            reinforge("sim", "calibrate", f"model.name={args.model}", f"--profile={profile}")
            calibrated_s = time.perf_counter() - started
            measured[mode] = run = train(args, mode, scratch)
            print(
                f"{mode}: calibrated in {calibrated_s:.0f} s; step {run['step_s']:.2f} s, "
                f"{run['samples_per_min']:.1f} samples/min, process {run['wall_s']:.0f} s, "
                f"load {run['load'][0]:.1f} -> {run['load'][1]:.1f}",
                flush=True,
            )
        sync_run = scratch / "sync"
        replayed = {m: predict(args, m, profiles[m], sync_run, replay=True) for m in MODES}
        steady = {m: predict(args, m, profiles[m], sync_run, replay=False) for m in MODES}
        calibrations = {m: json.loads(profiles[m].read_text()) for m in MODES}

    print()
    print(
        "| mode | step s, measured | predicted (replay) | ratio | predicted (steady state) "
        "| samples/min, measured | predicted | ratio | trainer idle s, measured / predicted "
        "| train + sync s | staleness | dropped / step |"
    )
    print("|---" * 12 + "|")
    for mode in MODES:
        print(row(mode, measured[mode], replayed[mode], steady[mode]))
    if args.json:
        result = {
            "profiles": calibrations,
            "measured": measured,
            "predicted_replay": replayed,
            "predicted_steady": steady,
            "settings": vars(args) | {"json": str(args.json), "keep": str(args.keep)},
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
