"""The trainer's step on a run's own batches, with each micro-batch's shared prefix run once
and without: seconds, and the tokens each plan computes.

The batches are the ones the run trained on: each step's recorded rollouts
(`trajectories/step_N.jsonl`), selected as the trainer selects them under the config given.
The model is the config's, so pass the config the run used, e.g. for the agentic job:

    reinforge train examples/coding.toml run.steps=3 run.dir=RUNS
    python benchmarks/shared_prefix.py RUNS/coding examples/coding.toml --rounds 3 \\
        --json benchmarks/shared_prefix-results.json

Both ways run on one trainer, alternating within each round, so the machine's load falls on
both alike; the first round is a warm-up and is reported but not in the medians. "Whole
rows" is a trainer whose config says `trainer.gradient_checkpointing`, under which it never
shares (recomputing layers would drop the prefix's keys and values), over the same model,
loaded without recomputation: so the two differ in sharing alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from reinforge.config import Config, load_config
from reinforge.policy.models import load_model
from reinforge.rollout.store import read_trajectories
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.trainable import load_trainable
from reinforge.train.trainer import Trainer, select_for_training
from reinforge.types import Group, Task

WAYS = ("shared", "whole rows")


def batches(run: Path, config: Config) -> list[TrainBatch]:
    """Each recorded step's batch, as the trainer built it (steps that trained nothing are
    left out)."""
    found = []
    for path in sorted(run.glob("trajectories/step_*.jsonl")):
        by_group: dict[str, list[Any]] = defaultdict(list)
        for trajectory in read_trajectories(path):
            by_group[trajectory.group_id].append(trajectory)
        groups = [
            Group(task=Task(id=rollouts[0].task_id, prompt=[]), trajectories=rollouts)
            for rollouts in by_group.values()
        ]
        selection = select_for_training(groups, config.trainer)
        if selection.trajectories:
            found.append(selection.batch())
    if not found:
        sys.exit(f"{run} has no recorded step with rollouts that train")
    return found


def run_parser(description: str) -> argparse.ArgumentParser:
    """A parser for a recorded run, the config it used and overrides to that config."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("run", type=Path, help="a training run's directory")
    parser.add_argument("config", type=Path, help="the config the run used")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, as for `train`")
    return parser


def model_and_reference(config: Config) -> tuple[PreTrainedModel, PreTrainedModel | None]:
    """The config's model to train, seeded, and its frozen KL reference (or None)."""
    torch.manual_seed(0)
    model, _ = load_trainable(config.model.name, config.trainer)
    reference = None
    if config.trainer.algorithm.loss.needs_reference:
        reference = load_model(config.model.name)[0].requires_grad_(False)
    return model, reference


def main() -> None:
    parser = run_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every batch")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    config = load_config(Config, args.config, args.overrides)
    steps = batches(args.run, config)
    model, reference = model_and_reference(config)
    trainers = {}
    for way in WAYS:
        trainer_config = config.trainer.model_copy(
            update={"gradient_checkpointing": way == "whole rows"}
        )
        trainers[way] = Trainer(model, trainer_config, config.optim, 1000, reference=reference)

    budget = config.trainer.micro_batch_tokens
    plans = {
        way: [
            sum(batch.select(rows).computed_tokens(way == "shared") for rows in plan)
            for batch in steps
            for plan in [micro_batches(batch, budget, way == "shared")]
        ]
        for way in WAYS
    }
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    for round_ in range(args.rounds):
        for way in WAYS if round_ % 2 == 0 else WAYS[::-1]:
            started = time.perf_counter()
            for batch in steps:
                trainers[way].step(batch)
            seconds[way].append(time.perf_counter() - started)
        print(f"round {round_}: " + ", ".join(f"{w} {s[-1]:.1f} s" for w, s in seconds.items()))

    medians = {way: statistics.median(s[1:] or s) for way, s in seconds.items()}
    results = {
        "run": str(args.run),
        "config": str(args.config),
        "overrides": args.overrides,
        "batches": len(steps),
        "rows": [int(batch.input_ids.shape[0]) for batch in steps],
        "real_tokens": [int(batch.attention_mask.sum()) for batch in steps],
        "computed_tokens": plans,
        "seconds_per_round": seconds,
        "median_s": medians,
        "ratio": medians["shared"] / medians["whole rows"],
    }
    for way in WAYS:
        print(
            f"{way:10s} median {medians[way]:.1f} s over {len(steps)} batches, "
            f"{sum(plans[way])} tokens computed"
        )
    print(f"shared / whole rows: {results['ratio']:.2f}x seconds")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
