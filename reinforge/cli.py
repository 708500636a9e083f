"""`reinforge` command line: each subcommand is a thin module over library calls.

Every command module exposes `register(subparsers)`, which adds its parser and sets
`func` to a callable taking the parsed namespace and returning an exit code. A user
mistake raises `UsageError`: one clear line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from reinforge.errors import UsageError


def build_parser() -> argparse.ArgumentParser:
    from reinforge.commands import eval as eval_cmd
    from reinforge.commands import sandbox as sandbox_cmd
    from reinforge.commands import serve as serve_cmd
    from reinforge.commands import sft as sft_cmd
    from reinforge.commands import train as train_cmd

    parser = argparse.ArgumentParser(
        prog="reinforge", description="Train LLM agents with reinforcement learning."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (serve_cmd, eval_cmd, train_cmd, sft_cmd, sandbox_cmd):
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as error:
        print(f"reinforge {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Options may come between positional arguments (`train CONFIG --resume KEY=VALUE`):
    a command's own parser reads its arguments intermixed. A command with sub-commands of
    its own (`sandbox run ...`) cannot be read so and is parsed as usual."""
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if not argv or argv[0] not in commands:
        return parser.parse_args(argv)  # help, or an error naming the known commands
    try:
        args = commands[argv[0]].parse_intermixed_args(argv[1:])
    except TypeError:
        return parser.parse_args(argv)
    args.command = argv[0]
    return args


if __name__ == "__main__":
    sys.exit(main())
