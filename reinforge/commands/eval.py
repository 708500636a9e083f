"""`reinforge eval`: run an environment against a model and report how it does."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reinforge.commands.config_args import (
    Flag,
    add_flag_arguments,
    key_values,
    load_with_flags,
    positional_or_override,
)
from reinforge.config import EvalConfig
from reinforge.policy.specs import check_model, is_url

if TYPE_CHECKING:
    from reinforge.rollout.evaluate import EvalSummary

FLAGS = (
    Flag("--model", "model.name", "SPEC_OR_URL"),
    Flag("--model-name", "model.served_name", "NAME"),
    Flag("--engine", "model.engine", "{builtin,vllm}"),
    Flag("--tasks", "eval.tasks", "N"),
    Flag("--rollouts", "eval.rollouts_per_task", "K"),
    Flag("--concurrency", "rollout.concurrency", "C"),
    Flag("--temperature", "rollout.sampling.temperature", "T"),
    Flag("--top-p", "rollout.sampling.top_p", "P"),
    Flag("--max-turns", "env.max_turns", "N"),
    Flag("--max-tokens", "env.max_tokens_per_turn", "M"),
    Flag("--timeout", "rollout.timeout_s", "SECONDS"),
    Flag("--out", "eval.out", "DIR"),
    Flag("--seed", "eval.seed", "S"),
    Flag("--dtype", "engine.dtype", "{auto,float32,bfloat16}"),
    Flag("--agent", "eval.agent", "{model,oracle,nop}"),
    Flag("--harness-variants", "env.augment.variants", "N"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "env",
        nargs="?",
        help="built-in or installed name, path/to/env.py, module:fn, or a Harbor task dir",
    )
    add_flag_arguments(parser, EvalConfig, FLAGS, "rollout.concurrency=8 env.args.difficulty=2")
    parser.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="argument for the environment's loader, parsed as a TOML value (repeatable)",
    )
    parser.set_defaults(func=run)


def load(args: argparse.Namespace) -> EvalConfig:
    """The config of the command line: the file, the flags (ENV and `--env-arg` too), then
    the `KEY=VALUE` overrides."""
    env, overrides = positional_or_override(args.env, args.overrides)
    pairs = key_values(args.env_arg, "env.args", "--env-arg")
    if env is not None:
        pairs["env.name"] = env
    return load_with_flags(EvalConfig, args, FLAGS, pairs, overrides)


def run(args: argparse.Namespace) -> int:
    config = load(args)
    if config.eval.agent == "model":  # a scripted agent loads no model
        check_model(config.model.name)
    from reinforge.envs.harbor.environment import use_agent
    from reinforge.envs.registry import load_configured
    from reinforge.errors import UsageError

    env = load_configured(config.env)
    use_agent(env, config.eval.agent)
    augment = config.env.augment
    if augment is not None and augment.variants and not augment.varies(list(env.harness.tools)):
        raise UsageError(
            f"{augment.variants} harness variants of {env.name!r} would all be alike: give "
            "env.augment.system_prompts, notes, tool_names, tool_descriptions, "
            "tool_formats or subagent"
        )
    out = config.eval.out or Path("runs") / f"eval-{env.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return asyncio.run(_run(config, env, out))


async def _run(config: EvalConfig, env: Any, out: Path) -> int:
    from rich.console import Console

    from reinforge.policy.client import PolicyClient
    from reinforge.rollout.evaluate import evaluate
    from reinforge.rollout.summary import check_errors

    console = Console(stderr=True)
    sampling = config.rollout.sampling
    engine = None
    if config.eval.agent != "model":  # a scripted agent: no model to load or to call
        client = PolicyClient.without_model(f"agent:{config.eval.agent}", sampling)
    elif is_url(config.model.name):
        client = await PolicyClient.for_url(
            config.model.name, sampling, model=config.model.served_name
        )
    else:
        from reinforge.policy.backends import load_engine
        from reinforge.policy.threads import prepare_cpu

        for line in prepare_cpu(config.model.threads, {"engine.dtype": config.engine.dtype}):
            console.print(line)
        with console.status(f"loading {config.model.name}"):
            engine = load_engine(config.model, config.engine)
        client = PolicyClient.for_engine(engine, sampling)
    variants = config.env.augment.variants if config.env.augment is not None else 0
    rollouts_per_task = config.eval.rollouts_per_task * max(variants, 1)  # under each variant
    try:
        with progress(console, config.eval.tasks * rollouts_per_task) as advance:
            _, summary = await evaluate(
                env,
                client,
                config.eval.tasks,
                rollouts_per_task,
                config.rollout,
                config.eval.seed,
                out,
                on_rollout=advance,
            )
    finally:
        await client.close()
        if engine is not None:
            engine.close()
    _print_summary(console, summary, out)
    check_errors(summary, config.eval.max_error_rate, "eval.max_error_rate")
    return 0


class progress:
    """A rich progress bar advanced once per finished rollout; in a log, a line at least
    every `HEARTBEAT_S` instead."""

    def __init__(self, console: Any, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        from reinforge.commands.view import Heartbeat

        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("rollouts", total=total)
        self._heartbeat = Heartbeat(console, self._line)

    def _line(self, elapsed_s: float) -> str:
        task = self._bar.tasks[0]
        return f"rollouts {task.completed:.0f}/{task.total:.0f}, {elapsed_s:.0f} s"

    def _advance(self, _trajectory: Any) -> None:
        self._bar.advance(self._task)

    def __enter__(self) -> Any:
        self._bar.start()
        self._heartbeat.__enter__()
        return self._advance

    def __exit__(self, *exc: object) -> None:
        self._heartbeat.__exit__(*exc)
        self._bar.stop()


def _print_summary(console: Any, summary: EvalSummary, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary.environment} - {summary.model}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("tasks x rollouts", f"{summary.tasks} x {summary.rollouts // max(summary.tasks, 1)}"),
        (
            f"reward (mean ± std of {summary.scored} scored)",
            f"{summary.reward_mean:.3f} ± {summary.reward_std:.3f}",
        ),
        ("errored or timed out", str(summary.errored)),
        *((f"  {name}", f"{value:.3f}") for name, value in summary.rewards.items()),
        ("pass@1", f"{summary.pass_rate:.3f}"),
        *([(f"pass@{summary.k}", f"{summary.pass_at_k:.3f}")] if summary.k > 1 else []),
        ("turns (mean)", f"{summary.turns_mean:.2f}"),
        ("sampled tokens (mean)", f"{summary.completion_tokens_mean:.1f}"),
        ("sequence tokens (mean)", f"{summary.tokens_mean:.1f}"),
        ("tool errors", str(summary.tool_errors)),
        ("loop rate", f"{summary.loop_rate:.3f}"),
        ("truncated by a loop (of truncated)", f"{summary.loop_truncation_rate:.3f}"),
        *(
            (
                f"level {name}: over budget, tokens, reward",
                f"{level.over_budget_rate:.3f}, {level.completion_tokens_mean:.1f}, "
                f"{level.reward_mean:.3f}",
            )
            for name, level in summary.levels.items()
        ),
        *(
            (
                f"harness variant {number}: reward",
                f"{variant.reward_mean:.3f} ({variant.rollouts - variant.errored} scored, "
                f"{variant.errored} errored)",
            )
            for number, variant in summary.variants.items()
        ),
        ("hack flags", ", ".join(f"{k} {v}" for k, v in summary.hack_flags.items()) or "none"),
        ("status", ", ".join(f"{k} {v}" for k, v in sorted(summary.status.items()))),
        ("sampled tokens/s", f"{summary.sampled_tokens_per_s:.1f}"),
        ("wall time", f"{summary.wall_s:.1f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
    console.print(f"wrote {out / 'trajectories.jsonl'} and {out / 'summary.json'}")
