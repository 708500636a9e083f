"""`reinforge dash`: a local web dashboard of the runs and evals below a folder."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from reinforge.errors import UsageError
from reinforge.orchestrate.config import RunConfig

PORT = 8080
HOST = "127.0.0.1"
"""Local only by default: the dashboard shows every trajectory of every run below the folder."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    runs_dir = RunConfig.model_fields["dir"].default
    parser.add_argument(
        "runs_dir",
        nargs="?",
        type=Path,
        default=runs_dir,
        metavar="RUNS_DIR",
        help=f"folder holding run directories and eval outputs, or one of them "
        f"(default: {runs_dir}, where train and eval write)",
    )
    parser.add_argument("--port", type=int, default=PORT, help=f"TCP port (default: {PORT})")
    parser.add_argument(
        "--host", default=HOST, help=f"address to listen on (default: {HOST}; 0.0.0.0: all)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.runs_dir.is_dir():
        raise UsageError(f"no such folder: {args.runs_dir}")
    import uvicorn

    from reinforge.rundirs.dash.app import create_app

    listener = _listen(args.host, args.port)
    host, port = listener.getsockname()[:2]
    print(f"reinforge dash: {args.runs_dir} at http://{host}:{port}/", flush=True)
    server = uvicorn.Server(uvicorn.Config(create_app(args.runs_dir), log_level="warning"))
    server.run(sockets=[listener])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """The bound socket, so a port in use is one line to the user, not a server traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror}") from error
    return listener
