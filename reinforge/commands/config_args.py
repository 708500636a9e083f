"""The arguments of commands that run from the config tree: `[CONFIG.toml] [KEY=VALUE ...]
[--resume]`, read by `reinforge.config.load_command_config`."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    """`example` shows a few overrides in the help."""
    parser.add_argument("config", type=Path, nargs="?", help="TOML config (only overrides)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help=f"dotted overrides, e.g. {example}"
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run from its last checkpoint"
    )
