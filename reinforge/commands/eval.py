"""`reinforge eval`: run an environment against a model and report how it does."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from reinforge.errors import UsageError
from reinforge.policy.specs import DEFAULT_MODEL


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a model on an environment")
    parser.add_argument("env", help="built-in or installed name, path/to/env.py, or module:fn")
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="model spec (smollm2-135m, tiny-random, HF folder) or an "
        "http(s)://.../v1 URL of an OpenAI-compatible server",
    )
    parser.add_argument("--model-name", help="model name to request from a URL server")
    parser.add_argument("--tasks", type=int, default=16, help="number of tasks")
    parser.add_argument("--rollouts", type=int, default=1, help="rollouts per task")
    parser.add_argument("--concurrency", type=int, default=32, help="rollouts in flight")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, help="per-turn token limit (default: env's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per rollout")
    parser.add_argument("--out", type=Path, help="output folder (default: runs/eval-ENV-TIME)")
    parser.add_argument("--seed", type=int, default=0, help="seed for tasks and sampling")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="argument for the environment's loader (repeatable)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check(args)
    from reinforge.envs.registry import load_environment

    env = load_environment(args.env, **_env_args(args.env_arg))
    if args.max_tokens is not None:
        env.harness.max_tokens_per_turn = args.max_tokens
    out = args.out or Path("runs") / f"eval-{env.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return asyncio.run(_run(args, env, out))


async def _run(args: argparse.Namespace, env: Any, out: Path) -> int:
    from rich.console import Console

    from reinforge.policy.client import PolicyClient, SamplingDefaults
    from reinforge.rollout.evaluate import evaluate
    from reinforge.rollout.generator import RolloutSettings

    console = Console(stderr=True)
    sampling = SamplingDefaults(
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=env.harness.max_tokens_per_turn,
        seed=args.seed,
    )
    engine = None
    if args.model.startswith(("http://", "https://")):
        client = await PolicyClient.for_url(args.model, sampling, model=args.model_name)
    else:
        from reinforge.policy.engine import Engine

        with console.status(f"loading {args.model}"):
            engine = Engine.from_spec(args.model, dtype=args.dtype)
        client = PolicyClient.for_engine(engine, sampling)
    settings = RolloutSettings(
        rollouts_per_task=args.rollouts,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        seed=args.seed,
    )
    try:
        with _progress(console, args.tasks * args.rollouts) as advance:
            _, summary = await evaluate(
                env, client, args.tasks, settings, out, task_seed=args.seed, on_rollout=advance
            )
    finally:
        await client.close()
        if engine is not None:
            engine.close()
    _print_summary(console, summary, out)
    return 0


def _check(args: argparse.Namespace) -> None:
    for name in ("tasks", "rollouts", "concurrency"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1")
    if not 0.0 <= args.temperature <= 2.0:
        raise UsageError("--temperature must be between 0 and 2")
    if not 0.0 < args.top_p <= 1.0:
        raise UsageError("--top-p must be in (0, 1]")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError("--max-tokens must be at least 1")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")


def _env_args(pairs: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values parse as JSON where they can (numbers, booleans)."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env-arg takes KEY=VALUE, got {pair!r}")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


class _progress:
    """A rich progress bar advanced once per finished rollout."""

    def __init__(self, console: Any, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("rollouts", total=total)

    def __enter__(self) -> Any:
        self._bar.start()
        return lambda _trajectory: self._bar.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()


def _print_summary(console: Any, summary: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['environment']} - {summary['model']}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        (
            "tasks x rollouts",
            f"{summary['tasks']} x {summary['rollouts'] // max(summary['tasks'], 1)}",
        ),
        ("reward (mean ± std)", f"{summary['reward_mean']:.3f} ± {summary['reward_std']:.3f}"),
    ]
    rows += [(f"  {name}", f"{value:.3f}") for name, value in summary["rewards"].items()]
    rows += [(key, f"{summary[key]:.3f}") for key in summary if key.startswith("pass@")]
    rows += [
        ("turns (mean)", f"{summary['turns_mean']:.2f}"),
        ("sampled tokens (mean)", f"{summary['sampled_tokens_mean']:.1f}"),
        ("sequence tokens (mean)", f"{summary['tokens_mean']:.1f}"),
        ("tool errors", str(summary["tool_errors"])),
        ("status", ", ".join(f"{k} {v}" for k, v in sorted(summary["status"].items()))),
        ("sampled tokens/s", f"{summary['sampled_tokens_per_s']:.1f}"),
        ("wall time", f"{summary['wall_s']:.1f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    console.print(f"wrote {out / 'trajectories.jsonl'} and {out / 'summary.json'}")
