"""`reinforge` command line: each subcommand is a thin module over library calls.

Every command module exposes `add_arguments(parser)`, which adds its arguments and sets
`func` to a callable taking the parsed namespace and returning an exit code. A user
mistake raises `UsageError`: one clear line on stderr and exit code 2, never a traceback.
Too many failed rollouts raise `TooManyErrors`: one line, exit code 3. Ctrl-C is one line
and exit code 130; a run saves what it can first (`Interrupted` says what), and the line
ends with the command that resumes it. SIGTERM (a scheduler's preemption, `kill`,
`docker stop`) stops a command the same way, with exit code 143.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from importlib import import_module
from types import FrameType

from reinforge.errors import (
    ERRORS_EXIT,
    INTERRUPTED_EXIT,
    TERMINATED_EXIT,
    Interrupted,
    TooManyErrors,
    UsageError,
)

COMMANDS = {
    "serve": "serve a model over an OpenAI-compatible API (token ids included)",
    "eval": "evaluate a model on an environment",
    "train": "train a model with RL on an environment",
    "sft": "fine-tune a model on stored trajectories (SFT warm-up)",
    "sandbox": "run a command in a fresh sandbox, or benchmark sandboxes",
    "audit": "play known reward hacks against a Harbor environment's grader",
    "dash": "a web dashboard of runs: curves, time split, trajectories token by token",
    "diff": "what a policy learned: behaviour at two steps of a run, or in two evals",
    "sim": "simulate the loop: step time, samples/min, staleness, best device split",
}
"""Each is the module `reinforge.commands.<name>`, with `add_arguments(parser)`."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, with the arguments of `command` only (of all when None):
    a command's arguments may need its config classes, whose imports (torch, openai) one
    command should not pay for another's."""
    parser = argparse.ArgumentParser(
        prog="reinforge", description="Train LLM agents with reinforcement learning."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        if command in (None, name):
            import_module(f"reinforge.commands.{name}").add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(build_parser(argv[0] if argv else None), argv)
    with sigterm_as_ctrl_c() as terminated:
        try:
            return int(args.func(args) or 0)
        except UsageError as error:
            print(f"reinforge {args.command}: error: {error}", file=sys.stderr)
            return 2
        except TooManyErrors as error:
            print(f"reinforge {args.command}: error: {error}", file=sys.stderr)
            return ERRORS_EXIT
        except (Interrupted, KeyboardInterrupt) as error:
            what = f": {error}" if isinstance(error, Interrupted) else ""
            stopped = "terminated" if terminated.is_set() else "interrupted"
            resume = _resuming(args, argv)
            print(f"reinforge {args.command}: {stopped}{what}{resume}", file=sys.stderr)
            return TERMINATED_EXIT if terminated.is_set() else INTERRUPTED_EXIT


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[threading.Event]:
    """SIGTERM handed to whatever handles Ctrl-C at that moment (asyncio's run, an SFT
    loop's own handler, Python's KeyboardInterrupt), so that a preempted run saves its
    last finished step as Ctrl-C has it do; the event says SIGTERM came. A second SIGTERM
    is a second Ctrl-C: out at once. Off the main thread, where no handler can be set,
    SIGTERM keeps its default."""
    terminated = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield terminated
        return

    def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
        terminated.set()
        on_ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(on_ctrl_c):  # ignored or default: nothing saves, so stop here
            raise KeyboardInterrupt
        on_ctrl_c(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, as_ctrl_c)
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, previous)


def _resuming(args: argparse.Namespace, argv: list[str]) -> str:
    """How to go on, for a command that resumes (`--resume`): its own command line, made
    to resume rather than start over."""
    if not hasattr(args, "resume"):
        return ""
    again = [arg for arg in argv if arg not in ("--overwrite", "--resume")] + ["--resume"]
    return f"; resume with: reinforge {shlex.join(again)}"


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
