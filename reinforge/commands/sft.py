"""`reinforge sft [CONFIG.toml] [key=value ...]`: SFT warm-up from stored trajectories."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from reinforge.commands.config_args import add_config_arguments

if TYPE_CHECKING:
    from reinforge.orchestrate.metrics import SftStepMetrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "sft.data=runs/eval-arith sft.min_reward=1 optim.lr=1e-5")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reinforge.commands.config_args import load_command_config

    config = load_command_config(args)
    from rich.console import Console

    from reinforge.orchestrate.sft import sft_config, train_sft
    from reinforge.policy.models import load_tokenizer
    from reinforge.policy.threads import prepare_cpu
    from reinforge.train.sft import load_data

    console = Console(stderr=True)
    data = load_data(config.sft, load_tokenizer(config.model.name))
    config = sft_config(config, len(data.examples))
    console.print(
        f"{len(data.examples)} of {data.read} trajectories kept from {len(data.files)} "
        f"file(s), {data.rendered} rendered from their messages; "
        f"{config.sft.epochs} epoch(s), {config.run.steps} steps"
    )
    console.print(f"run directory: {config.run_dir}")
    for line in prepare_cpu(config.model.threads, {"trainer.precision": config.trainer.precision}):
        console.print(line)

    def show(metrics: SftStepMetrics) -> None:
        train = metrics.train
        console.print(
            f"step {metrics.step:4d}/{config.run.steps}  epoch {metrics.epoch + 1}  "
            f"nll {train.nll:.4f}  tokens {train.trained_tokens:6.0f}  "
            f"grad {train.grad_norm:7.3f}  lr {train.lr:.2e}  "
            f"{metrics.time_s:5.2f}s  {metrics.tokens_per_s:7.0f} tok/s",
            soft_wrap=True,
        )

    train_sft(config, data.examples, show, resume=args.resume, overwrite=args.overwrite)
    return 0
