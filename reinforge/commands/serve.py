"""`reinforge serve`: the policy engine behind an OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse

from reinforge.policy.specs import DEFAULT_MODEL


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible API (token ids included)"
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="smollm2-135m, tiny-random or a local HF model folder",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="precision the engine samples with",
    )
    parser.add_argument("--max-batch", type=int, default=64, help="most sequences decoded together")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reinforge.policy.engine import Engine
    from reinforge.policy.server import serve

    engine = Engine.from_spec(args.model, dtype=args.dtype, max_batch=args.max_batch)
    try:
        serve(engine, args.host, args.port)
    finally:
        engine.close()
    return 0
