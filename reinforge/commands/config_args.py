"""Command-line arguments over the config trees: one mechanism for every command.

`train` and `sft` take `[CONFIG.toml] [KEY=VALUE ...]`. `eval` and `serve` take
`--config FILE` and `KEY=VALUE` overrides too, and keep their familiar flags, each of which
is only another name for one config key: its help and default are read from that field, so
no default is declared twice. A value set in several ways takes the last of: the file, the
flags, the `KEY=VALUE` overrides. A flag or override of a key the command does not read
(`reinforge.config.UNREAD`) is refused, never ignored.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from reinforge.config import Config, Root, load_config, parse_value, readers, unread
from reinforge.errors import ConfigError, UsageError
from reinforge.policy.specs import check_model


@dataclass(frozen=True)
class Flag:
    """`--name VALUE` sets the config key `key`."""

    name: str
    key: str
    metavar: str | None = None


def positional_or_override(first: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """argparse cannot tell an optional positional (a config file, an environment) from the
    first `KEY=VALUE` override, so a first argument holding "=" is an override."""
    if first is not None and "=" in first:
        return None, [first, *overrides]
    return first, overrides


def load_command_config(args: argparse.Namespace) -> Config:
    """`reinforge train|sft [CONFIG.toml] [KEY=VALUE ...]`, with the model it names checked
    (its tokenizer is loaded long after the model stack's imports)."""
    first, overrides = positional_or_override(args.config, args.overrides)
    config = load_config(Config, None if first is None else Path(first), overrides)
    refuse_unread(readers(args.command, config), [(key, key) for key in _keys(overrides)])
    check_model(config.model.name)
    return config


def add_config_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    """`[CONFIG.toml] [KEY=VALUE ...] [--resume | --overwrite]`; `example` shows a few
    overrides."""
    parser.add_argument("config", nargs="?", help="TOML config (only overrides)")
    add_overrides(parser, example)
    starts = parser.add_mutually_exclusive_group()
    starts.add_argument(
        "--resume",
        action="store_true",
        help="continue the run from its last checkpoint (from step 0 when it has none)",
    )
    starts.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run that the run directory holds and start over",
    )


def add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help=f"dotted overrides, e.g. {example}"
    )


def add_flag_arguments(
    parser: argparse.ArgumentParser, root: type[BaseModel], flags: Sequence[Flag], example: str
) -> None:
    """`[KEY=VALUE ...] [--config FILE]` and one argument per flag; unset flags leave the
    config alone (argparse.SUPPRESS). `example` shows a few overrides."""
    add_overrides(parser, example)
    parser.add_argument("--config", type=Path, help="TOML config file (only overrides)")
    defaults = root()
    for flag in flags:
        description, default = _field(root, defaults, flag.key)
        shown = "none" if default is None else default
        parser.add_argument(
            flag.name,
            dest=_dest(flag),
            default=argparse.SUPPRESS,
            metavar=flag.metavar,
            help=f"{description} (default: {shown}; key {flag.key})",
        )


def load_with_flags(
    root: type[Root],
    args: argparse.Namespace,
    flags: Sequence[Flag],
    pairs: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    command: str | None = None,
) -> Root:
    """The config of `--config FILE`, then the flags given, then `pairs` (key: value, e.g.
    `--env-arg`), then the `KEY=VALUE` overrides (default: `args.overrides`). `command`:
    the name `UNREAD` knows the command by, when not `args.command` (`sim predict`)."""
    overrides = args.overrides if overrides is None else overrides
    given = {f.key: getattr(args, _dest(f)) for f in flags if hasattr(args, _dest(f))}
    try:
        config = load_config(root, args.config, overrides, given | (pairs or {}))
    except ConfigError as error:
        named = [f.name for f in flags if f.key == error.key and f.key in given]
        if named:
            raise UsageError(f"{named[0]}: {error.problem}") from error
        raise
    set_here = [(f.name, f.key) for f in flags if f.key in given]
    set_here += [(key, key) for key in [*(pairs or {}), *_keys(overrides)]]
    refuse_unread(readers(command or args.command, config), set_here)
    return config


def refuse_unread(names: Sequence[str], given: Sequence[tuple[str, str]]) -> None:
    """Refuse the first of `given` (the name a user gave, the key it sets) that the command
    of `names` (`readers`) does not read, in one line naming it: a value that
    does nothing must not pass for one that worked (`sft run.steps=1` ran every step of
    the data)."""
    for name, key in given:
        why = unread(names, key)
        if why is not None:
            raise UsageError(f"{name}: {why}")


def key_values(pairs: Sequence[str], key: str, flag: str) -> dict[str, Any]:
    """`NAME=VALUE` pairs of a repeatable flag as values of `key.NAME`, parsed like
    `KEY=VALUE` overrides (TOML values: numbers, booleans, quoted strings, arrays)."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} takes NAME=VALUE, got {pair!r}")
        parsed[f"{key}.{name}"] = parse_value(value)
    return parsed


def _keys(overrides: Sequence[str]) -> list[str]:
    """The dotted keys of `KEY=VALUE` overrides (`load_config` has checked their form)."""
    return [override.partition("=")[0] for override in overrides]


def _dest(flag: Flag) -> str:
    return "flag_" + flag.name.lstrip("-").replace("-", "_")


def _field(root: type[BaseModel], defaults: BaseModel, key: str) -> tuple[str, Any]:
    """The description and default of a dotted key, read from the config classes."""
    *sections, name = key.split(".")
    owner: BaseModel = defaults
    for section in sections:
        value = getattr(owner, section)
        if value is None:  # an optional section that is off: its class's defaults
            annotation = type(owner).model_fields[section].annotation
            (kind,) = [t for t in get_args(annotation) if isinstance(t, type)
                       and issubclass(t, BaseModel)]  # fmt: skip
            value = kind()
        owner = value
    description = " ".join((type(owner).model_fields[name].description or name).split())
    return description.split(". ")[0].rstrip("."), getattr(owner, name)
