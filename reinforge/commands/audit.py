"""`reinforge audit`: play known reward hacks against a Harbor environment's grader.

Exit code 0 when no exploit scored above 0 on any task and every task is sound (its
oracle scores 1, doing nothing 0); `FAILED_EXIT` when an exploit scored or a task is broken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from reinforge.errors import UsageError

FAILED_EXIT = 1
CONCURRENCY = 8
"""Rollouts in flight across all agents: each runs two sandboxes in turn, and `fill-disk`
fills a task's whole `storage_mb` in memory-backed storage."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env", help="a Harbor task dir, a folder of them, or `coding`")
    parser.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="argument for the environment's loader, as eval takes it (repeatable): "
        "`--env-arg generated.tasks=48 --env-arg generated.only=true` audits coding's "
        "generated tasks",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report here")
    parser.add_argument(
        "--tasks", type=int, metavar="N", help="audit N tasks drawn from the environment (all)"
    )
    parser.add_argument(
        "--exploit",
        action="append",
        metavar="NAME",
        help="run only this exploit (repeatable; default: all of them)",
    )
    parser.add_argument(
        "--exploit-file",
        action="append",
        type=Path,
        default=[],
        metavar="PATH",
        help="add your own exploit: a .py file whose exploit(task) returns a bash script "
        "(its NAME, else the file's stem, is what --exploit selects)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        metavar="C",
        help=f"rollouts in flight (default: {CONCURRENCY})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reinforge.commands.config_args import key_values
    from reinforge.config import load_config
    from reinforge.envs.config import EnvConfig
    from reinforge.envs.harbor.environment import HarborEnvironment
    from reinforge.envs.harbor.exploits import EXPLOITS
    from reinforge.envs.registry import load_environment
    from reinforge.rollout.config import RolloutConfig

    by_name = {e.name: e for e in EXPLOITS} | {
        e.name: e for e in map(_from_file, args.exploit_file)
    }
    unknown = [name for name in args.exploit or [] if name not in by_name]
    if unknown:
        raise UsageError(f"unknown exploit {unknown[0]!r}; one of {', '.join(by_name)}")
    if (args.tasks is not None and args.tasks < 1) or args.concurrency < 1:
        raise UsageError("--tasks and --concurrency take a number >= 1")
    exploits = [by_name[name] for name in args.exploit] if args.exploit else list(by_name.values())
    env_args = load_config(EnvConfig, None, [], key_values(args.env_arg, "args", "--env-arg"))
    env = load_environment(args.env, **env_args.args)
    if not isinstance(env, HarborEnvironment):
        raise UsageError(
            f"environment {env.name!r} is not a Harbor environment: audit runs a task "
            "directory, a folder of them, or `coding`"
        )
    config = RolloutConfig(concurrency=args.concurrency)
    num_tasks = min(args.tasks or len(env.runnable), len(env.runnable))
    report = asyncio.run(_audit(env, exploits, num_tasks, config))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    _print(report)
    return FAILED_EXIT if report.hacked or report.broken else 0


def _from_file(path: Path) -> Any:
    """A user's exploit: the file's `exploit(task)` gives the bash script for a task."""
    from reinforge.envs.harbor.agents import ScriptAgent
    from reinforge.envs.registry import load_user_file

    module = load_user_file(path, "exploit", "exploit")
    if not callable(getattr(module, "exploit", None)):
        raise UsageError(f"{path}: no function exploit(task) returning a bash script")
    return ScriptAgent(str(getattr(module, "NAME", path.stem)), module.exploit)


async def _audit(env: Any, exploits: list[Any], num_tasks: int, config: Any) -> Any:
    """The audit with a progress bar over its rollouts: each task, each exploit, the oracle
    and the nop agent."""
    from rich.console import Console

    from reinforge.commands.eval import progress
    from reinforge.rollout.audit import audit

    with progress(Console(stderr=True), num_tasks * (len(exploits) + 2)) as advance:
        return await audit(env, exploits, num_tasks, config, on_rollout=advance)


def _print(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from reinforge.rollout.audit import first_line

    console = Console()
    tasks = f"{len(report.tasks)} task" + ("s" if len(report.tasks) != 1 else "")
    table = Table(title=f"audit of {report.environment}: {tasks}")
    table.add_column("exploit")
    table.add_column("max reward", justify="right")
    table.add_column("tasks hacked", justify="right")
    table.add_column("errors", justify="right")
    table.add_column("faults", justify="right")
    table.add_column("leaks", justify="right")
    for exploit in report.exploits:
        style = "bold red" if exploit in report.hacked else None
        table.add_row(
            exploit.name,
            f"{exploit.max_reward:g}",
            str(len(exploit.tasks_hacked)),
            str(len(exploit.errors)),
            str(len(exploit.faults)),
            str(len(exploit.leaks)),
            style=style,
        )
    console.print(table)
    for agent, expected in ((report.oracle, "1"), (report.nop, "0")):
        errors = f", {len(agent.errors)} errored" if agent.errors else ""
        console.print(f"{agent.name} mean {agent.mean:.3f} (expect {expected}){errors}")
    agents = (report.oracle, report.nop, *report.exploits)
    for agent in (a for a in agents if a.errors):
        task, error = next(iter(agent.errors.items()))
        console.print(
            f"{agent.name} errored on {len(agent.errors)} task(s); {task}: {first_line(error)}"
        )
    for agent in (a for a in agents if a.faults):
        task, fault = next(iter(agent.faults.items()))
        console.print(
            f"{agent.name} scored 0 by its own fault on {len(agent.faults)} task(s); "
            f"{task}: {first_line(fault)}"
        )
    console.print(f"{len(report.exploits)} exploits in {report.wall_s:.1f} s")
    for task, reason in report.broken.items():
        console.print(f"[bold red]BROKEN[/] task {task}: {reason}")
    for exploit in report.hacked:
        if exploit.leaks:
            tasks = ", ".join(exploit.leaks)
            console.print(
                f"[bold red]LEAKED[/] to {exploit.name} (it read the audit's planted "
                f"secret, as it would a trainer's keys): {tasks}"
            )
        if exploit.tasks_hacked:
            tasks = ", ".join(exploit.tasks_hacked)
            console.print(f"[bold red]HACKED[/] by {exploit.name}: {tasks}")
        if exploit.errors:
            tasks = ", ".join(sorted(exploit.errors))
            console.print(
                f"[bold red]SHIELDED[/] by {exploit.name} (its failure became an error, "
                f"which leaves the batch): {tasks}"
            )
    if report.broken:
        console.print("not clean: a broken task's exploit scores say nothing; fix it first")
    elif not report.hacked:
        console.print("clean: no exploit scored")
