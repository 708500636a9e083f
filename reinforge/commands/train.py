"""`reinforge train CONFIG.toml [key=value ...]`: the RL loop (sync, async or partial)."""

from __future__ import annotations

import argparse
import asyncio

from reinforge.commands.config_args import add_config_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "run.steps=40 optim.lr=2e-5")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reinforge.commands.config_args import load_command_config

    config = load_command_config(args)
    from reinforge.envs.registry import check_args

    check_args(config.env)  # before the model stack's imports, as `eval` loads it
    from rich.console import Console

    from reinforge.commands.view import TrainView
    from reinforge.orchestrate.loop import train
    from reinforge.policy.threads import prepare_cpu

    console = Console(stderr=True)
    console.print(f"run directory: {config.run_dir}")
    keys = {"trainer.precision": config.trainer.precision, "engine.dtype": config.engine.dtype}
    local = config.cluster.backend == "local"  # else ranks and engines may compute elsewhere
    for line in prepare_cpu(config.model.threads, keys if local else {}):
        console.print(line)
    with TrainView(console, config.run.steps) as view:
        asyncio.run(train(config, view.update, args.resume, args.overwrite))
    return 0
