"""`reinforge serve`: the policy engine behind an OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import sys

from reinforge.commands.config_args import (
    Flag,
    add_flag_arguments,
    load_with_flags,
)
from reinforge.config import ServeConfig
from reinforge.policy.specs import check_model

FLAGS = (
    Flag("--model", "model.name", "SPEC"),
    Flag("--engine", "model.engine", "{builtin,vllm}"),
    Flag("--host", "server.host", "HOST"),
    Flag("--port", "server.port", "PORT"),
    Flag("--dtype", "engine.dtype", "{auto,float32,bfloat16}"),
    Flag("--max-batch", "engine.max_batch", "N"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag_arguments(
        parser, ServeConfig, FLAGS, "server.max_tokens=256 server.sampling.temperature=0.7"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_with_flags(ServeConfig, args, FLAGS)
    check_model(config.model.name)
    from reinforge.policy.backends import load_engine
    from reinforge.policy.server import serve
    from reinforge.policy.threads import prepare_cpu

    for line in prepare_cpu(config.model.threads, {"engine.dtype": config.engine.dtype}):
        print(line, file=sys.stderr)
    engine = load_engine(config.model, config.engine)
    try:
        serve(engine, config.server)
    finally:
        engine.close()
    return 0
