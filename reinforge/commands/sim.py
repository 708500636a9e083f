"""`reinforge sim calibrate` and `reinforge sim [predict]`: size a run before paying for it.

`calibrate` times the configured engine and trainer on this machine and writes a profile;
`predict` (the default) plays the loop forward on it for each mode and placement of the
devices. Both read the train config tree (a run's TOML simulates as it trains) plus a
`sim` section, so they share one parser: a flag means the same to both (`--profile` is
written, then read), or the action that does not read it refuses it (calibrate takes no
workload and no devices; `reinforge.config.UNREAD`). Predict refuses a profile calibrated
for another model, engine or dtype than the config's.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from reinforge.commands.config_args import (
    Flag,
    add_flag_arguments,
    load_with_flags,
    positional_or_override,
)
from reinforge.errors import UsageError

if TYPE_CHECKING:
    from reinforge.sim.config import SimConfig
    from reinforge.sim.predict import Prediction

ACTIONS = ("calibrate", "predict")
FLAGS = (
    Flag("--profile", "sim.profile", "PROFILE.json"),
    Flag("--model", "model.name", "SPEC"),
    Flag("--engine", "model.engine", "{builtin,vllm}"),
    Flag("--dtype", "engine.dtype", "{auto,float32,bfloat16}"),
    Flag("--from-run", "sim.from_run", "RUN_DIR"),
    Flag("--mode", "sim.modes", "MODE[,MODE]"),
    Flag("--max-staleness", "sim.max_staleness", "S"),
    Flag("--devices", "sim.devices", "N"),
    Flag("--samplers", "sim.samplers", "S"),
    Flag("--tasks", "rollout.tasks_per_step", "N"),
    Flag("--rollouts", "rollout.rollouts_per_task", "K"),
    Flag("--steps", "sim.steps", "N"),
    Flag("--seed", "sim.seed", "S"),
    Flag("--length-median", "sim.workload.completion_tokens.median", "TOKENS"),
    Flag("--length-sigma", "sim.workload.completion_tokens.sigma", "SIGMA"),
    Flag("--max-tokens", "sim.workload.completion_tokens.cap", "TOKENS"),
    Flag("--prompt-tokens", "sim.workload.prompt_tokens", "TOKENS"),
    Flag("--turns", "sim.workload.turns", "N"),
    Flag("--env-median", "sim.workload.env_s.median", "SECONDS"),
    Flag("--grade-median", "sim.workload.grade_s.median", "SECONDS"),
    Flag("--grade-sigma", "sim.workload.grade_s.sigma", "SIGMA"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from reinforge.sim.config import SimConfig

    parser.usage = (
        "reinforge sim calibrate [--model M] [--engine E] [--profile P] [KEY=VALUE ...]\n"
        "       reinforge sim [predict] [--profile P] [--from-run RUN | workload flags] "
        "[--mode M] [--devices N] [--json] [KEY=VALUE ...]"
    )
    parser.add_argument(
        "action",
        nargs="?",
        metavar="{calibrate,predict}",
        help="calibrate: time the engine (decode step against batch size) and the trainer "
        "here, and write the profile; predict (the default): simulate each mode and split",
    )
    add_flag_arguments(parser, SimConfig, FLAGS, "sim.max_staleness=2 sim.replay=true")
    parser.add_argument("--json", action="store_true", help="predict: print JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reinforge.sim.config import SimConfig

    action, overrides = positional_or_override(args.action, args.overrides)
    if action not in (None, *ACTIONS):
        raise UsageError(f"unknown action {action!r}: calibrate or predict")
    command = f"sim {action or 'predict'}"
    config = load_with_flags(SimConfig, args, FLAGS, overrides=overrides, command=command)
    if action == "calibrate":
        return run_calibrate(config)
    return run_predict(config, args.json)


def run_calibrate(config: SimConfig) -> int:
    from rich.console import Console

    from reinforge.sim.calibrate import calibrate

    folder = config.sim.profile.parent
    if not folder.is_dir():  # said now, not after the minutes of measuring
        raise UsageError(f"cannot write {config.sim.profile}: no folder {folder}")
    console = Console(stderr=True)
    profile = calibrate(config, lambda line: console.print(line, highlight=False))
    profile.save(config.sim.profile)
    decode = profile.decode.points
    console.print(
        f"decode step {decode[0].seconds * 1e3:.1f} ms at batch {decode[0].x:g}, "
        f"{decode[-1].seconds * 1e3:.1f} ms at {decode[-1].x:g}; trainer "
        f"{profile.trainer.tokens_per_s:.0f} tokens/s + {profile.trainer.fixed_s:.2f} s a "
        f"step; sync {profile.sync_s:.2f} s; sharing a device: decode x"
        f"{profile.sharing.decode:.2f}, train x{profile.sharing.train:.2f}",
        highlight=False,
    )
    console.print(f"wrote {config.sim.profile}", highlight=False)
    return 0


def run_predict(config: SimConfig, as_json: bool) -> int:
    from reinforge.sim.predict import best, check_profile, load_workload, predict
    from reinforge.sim.profile import Profile

    profile = Profile.load(config.sim.profile)
    check_profile(profile, config)
    predictions = predict(config, profile, load_workload(config))
    chosen = best(predictions)
    if as_json:
        out = {
            "predictions": [p.model_dump(mode="json") for p in predictions],
            "best": {mode: p.model_dump(mode="json") for mode, p in chosen.items()},
        }
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    _print(predictions, list(chosen.values()), config.sim.devices)
    return 0


COLUMNS = (
    "mode",
    "layout",
    "step s",
    "samples/min",
    "idle s",
    "train s",
    "stale",
    "0/1/2+ %",
    "drop/step",
    "redrawn/step",
    "util S/T",
)
KEY = """\
layout: samplers + trainers, or N shared (each device samples and trains); * the best of
its mode. idle: the trainer waiting for groups; train: train + sync. stale: mean (max)
staleness, and the % of trained tokens at staleness 0/1/2+. redrawn: uniform groups set
aside (loop.uniform_redraws). util: share of the time the samplers / the trainers work."""


def _print(predictions: list[Prediction], chosen: list[Prediction], devices: int) -> None:
    rows = [COLUMNS]
    for p in predictions:
        shares = [p.staleness.get(0, 0.0), p.staleness.get(1, 0.0)]
        shares.append(max(1.0 - sum(shares), 0.0) if p.staleness else 0.0)
        rows.append(
            (
                p.mode,
                str(p.layout) + (" *" if p in chosen else ""),
                f"{p.step_s:.2f}",
                f"{p.samples_per_min:.1f}",
                f"{p.trainer_idle_s:.2f}",
                f"{p.train_s + p.sync_s:.2f}",
                f"{p.staleness_mean:.2f} ({p.staleness_max})",
                "/".join(f"{100 * share:.0f}" for share in shares),
                f"{p.dropped_per_step:.2f}",
                f"{p.redrawn_per_step:.2f}",
                f"{p.sampler_utilisation:.0%}/{p.trainer_utilisation:.0%}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    print(f"simulated on {devices} device{'s' * (devices > 1)}, steps 2 on:")
    for row in rows:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in pairs]
        print("  ".join(cells).rstrip())
    print(KEY)
    for p in chosen:
        print(f"best for {p.mode}: {p.layout} ({p.samples_per_min:.1f} samples/min)")
