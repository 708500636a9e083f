"""`reinforge diff`: what a policy learned, from the rollouts a run recorded at two steps
or from two evals of the same tasks."""

from __future__ import annotations

import argparse
from pathlib import Path

from reinforge.errors import UsageError
from reinforge.rundirs import diff
from reinforge.rundirs.diff import Report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="RUN | EVAL_BEFORE EVAL_AFTER",
        help="a training run's directory (with --from and --to), or two `reinforge eval` "
        "output folders",
    )
    parser.add_argument("--from", dest="start", type=int, metavar="STEP", help="the step before")
    parser.add_argument("--to", dest="end", type=int, metavar="STEP", help="the step after")
    parser.add_argument(
        "--window",
        type=int,
        default=diff.WINDOW,
        metavar="N",
        help=f"steps read around each step (default: {diff.WINDOW})",
    )
    parser.add_argument(
        "--markdown", type=Path, metavar="PATH", help="also write the report to this file"
    )
    parser.add_argument(
        "--pass-threshold",
        type=float,
        metavar="T",
        help="a rollout passes at reward >= T (default: the threshold the rollouts recorded)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=diff.TOP,
        metavar="K",
        help=f"n-grams listed as rising and as falling (default: {diff.TOP})",
    )
    parser.add_argument(
        "--min-count",
        type=int,
        default=diff.MIN_COUNT,
        metavar="C",
        help=f"rollouts that must hold an n-gram on one side (default: {diff.MIN_COUNT})",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=diff.EXAMPLES,
        metavar="K",
        help=f"tasks shown before and after (default: {diff.EXAMPLES})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    steps = (args.start, args.end)
    if len(args.paths) == 1:
        if None in steps:
            raise UsageError("give --from STEP and --to STEP of the run (or two eval folders)")
        before, after = diff.run_sides(args.paths[0], args.start, args.end, args.window)
    elif len(args.paths) == 2:
        if steps != (None, None):
            raise UsageError("--from and --to pick steps of one run; two evals take neither")
        before, after = diff.eval_sides(*args.paths)
    else:
        raise UsageError("give one run's directory or two eval folders")
    report = diff.compare(
        before, after, args.pass_threshold, args.top, args.min_count, args.examples
    )
    _print(report)
    if args.markdown is not None:
        try:
            args.markdown.write_text(diff.markdown(report), encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {args.markdown}: {error.strerror}") from error
        print(f"wrote {args.markdown}")
    return 0


def _print(report: Report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    before, after = escape(report.before), escape(report.after)
    console.print(escape(report.sizes), highlight=False)
    table = Table(title=f"{before} -> {after}")
    table.add_column("metric")
    for name in (before, after, "change"):
        table.add_column(name, justify="right")
    for row in report.rows:
        table.add_row(*(escape(cell) for cell in diff.cells(row)))
    console.print(table)
    for title, ngrams in (("rose", report.rose), ("fell", report.fell)):
        grams = Table(title=f"n-grams that {title} (rollouts per 1000)")
        grams.add_column("n-gram")
        grams.add_column(before, justify="right")
        grams.add_column(after, justify="right")
        for ngram in ngrams:
            grams.add_row(escape(ngram.text), f"{ngram.before:.0f}", f"{ngram.after:.0f}")
        console.print(grams if ngrams else f"n-grams that {title}: none")
    if not report.pairs:
        console.print(diff.NO_PAIRS)
    for pair in report.pairs:
        example = Table(title=f"task {escape(pair.task_id)}", show_lines=True)
        example.add_column(before, ratio=1)
        example.add_column(after, ratio=1)
        example.add_row(
            diff.example_caption(pair.before_reward, pair.before),
            diff.example_caption(pair.after_reward, pair.after),
        )
        example.add_row(escape(pair.before.text), escape(pair.after.text))
        console.print(example)
