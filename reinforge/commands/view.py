"""What `reinforge train` shows while it runs: progress, the reward curve, the time split.

On a terminal a live panel redraws after each step; elsewhere (CI logs, pipes) each step is
one plain line, so logs stay readable. Both show the step's `StepMetrics`, the record
`metrics.jsonl` holds. A step that trained nothing, every group's rewards being equal, is
said in words the first time and counted at the end: a run can train nothing and exit 0,
and `train: null` in its record is easy to miss.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from reinforge.orchestrate.metrics import StepMetrics

_BARS = "▁▂▃▄▅▆▇█"
_RECENT = 8
HEARTBEAT_S = 30.0
"""Longest silence of a command whose output is a log rather than a terminal."""


class Heartbeat:
    """Where output is a log (CI, a pipe), a line at least every `HEARTBEAT_S`, so a long
    step or eval never looks hung; a terminal has its live display instead. `describe`
    gets the seconds since the start; `beat()` says a line was just printed."""

    def __init__(self, console: Console, describe: Callable[[float], str]) -> None:
        self.console = console
        self.describe = describe
        self._started = self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reinforge-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if not self.console.is_terminal:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self) -> None:
        self._last = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(max(self._last + HEARTBEAT_S - time.monotonic(), 0.0)):
            now = time.monotonic()
            if now - self._last >= HEARTBEAT_S:
                line = self.describe(now - self._started)
                self.console.print(line, highlight=False, soft_wrap=True)
                self._last = now


def sparkline(values: list[float], width: int = 60) -> str:
    """Values as block characters scaled to [min, max], the latest `width` of them."""
    values = values[-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(_BARS[round((v - low) / span * (len(_BARS) - 1))] for v in values)


def step_line(metrics: StepMetrics, steps: int) -> str:
    times = metrics.time
    return (
        f"step {metrics.step:4d}/{steps}  "
        f"reward {metrics.reward_mean:.3f} ± {metrics.reward_std:.3f}  "
        f"pass {metrics.pass_rate:.2f}  "
        f"len {metrics.completion_tokens_mean:5.1f}  "
        f"zero-var {metrics.zero_variance_groups}"
        + (f" (redrawn {metrics.redrawn})" if metrics.redrawn else "")
        + f"  errors {metrics.errored}  "
        f"wait {times.trainer_idle_s:5.1f}s  train {times.train_s:5.1f}s  "
        f"sync {times.sync_s:4.2f}s" + _staleness(metrics)
    )


def error_line(metrics: StepMetrics, steps: int) -> str:
    """The step's first error: the count alone says nothing of what to fix."""
    return f"step {metrics.step:4d}/{steps}  first error: {metrics.first_error}"


def _staleness(metrics: StepMetrics) -> str:
    """Only when the data was off-policy: a synchronous run has nothing to say here."""
    if not (metrics.staleness_max or metrics.dropped_stale):
        return ""
    return (
        f"  stale {metrics.staleness_mean:.2f}/{metrics.staleness_max}"
        f"  dropped {metrics.dropped_stale}  carried {metrics.carried_over}"
    )


def trained_nothing(metrics: StepMetrics) -> bool:
    """Whether every group of the step had equal rewards, so no advantage to learn from."""
    return metrics.train is None and metrics.zero_variance_groups == metrics.tasks


def nothing_trained_line(metrics: StepMetrics) -> str:
    return (
        f"warning: step {metrics.step} trained nothing: every group's rewards were equal "
        "(zero variance), so no rollout was better than another; try an SFT warm-up "
        "(reinforge sft), more rollouts per task (rollout.rollouts_per_task), or a graded "
        "reward that gives partial credit"
    )


def _trained(metrics: StepMetrics, name: str) -> str:
    """A trainer or loss number of the step, or "-" when nothing trained (or the loss has
    no such number)."""
    value = getattr(metrics.train, name, None)
    return "-" if value is None else f"{value:.3f}"


class TrainView:
    """Call `update(metrics)` after each step; use as a context manager."""

    def __init__(self, console: Console, steps: int) -> None:
        self.console = console
        self.steps = steps
        self.rows: list[StepMetrics] = []
        self.progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task("train", total=steps)
        self.live = Live(self._render(), console=console, refresh_per_second=2)
        self.heartbeat = Heartbeat(console, self._waiting)

    def __enter__(self) -> TrainView:
        if self.console.is_terminal:
            self.live.__enter__()
        self.heartbeat.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.__exit__(*exc)
        if self.console.is_terminal:
            self.live.__exit__(*exc)
        idle = sum(trained_nothing(row) for row in self.rows)
        if idle:
            self.console.print(
                f"{idle} of {len(self.rows)} steps trained nothing "
                "(every group's rewards were equal)",
                highlight=False,
                soft_wrap=True,
            )

    def _waiting(self, elapsed_s: float) -> str:
        return f"step {len(self.rows) + 1:4d}/{self.steps}  running, {elapsed_s:.0f} s since start"

    def update(self, metrics: StepMetrics) -> None:
        first_idle = trained_nothing(metrics) and not any(map(trained_nothing, self.rows))
        self.rows.append(metrics)
        self.progress.update(self.task, completed=metrics.step)
        if self.console.is_terminal:
            self.live.update(self._render())
        else:
            self.console.print(step_line(metrics, self.steps), highlight=False, soft_wrap=True)
            if metrics.first_error is not None:
                line = error_line(metrics, self.steps)
                self.console.print(line, highlight=False, soft_wrap=True, markup=False)
            self.heartbeat.beat()
        if first_idle:
            self.console.print(nothing_trained_line(metrics), highlight=False, soft_wrap=True)

    def _render(self) -> Group:
        rewards = [row.reward_mean for row in self.rows]
        curve = f"reward {sparkline(rewards)}" if rewards else "reward (after the first step)"
        return Group(self.progress, curve, self._table(), self._time_split(), self._error())

    def _table(self) -> Table:
        table = Table(box=None, pad_edge=False)
        names = ("step", "reward", "pass", "len", "zero-var", "errors", "clip", "entropy", "step s")
        for name in names:
            table.add_column(name, justify="right")
        for row in self.rows[-_RECENT:]:
            table.add_row(
                str(row.step),
                f"{row.reward_mean:.3f}",
                f"{row.pass_rate:.2f}",
                f"{row.completion_tokens_mean:.1f}",
                str(row.zero_variance_groups),
                str(row.errored),
                _trained(row, "clip_fraction"),
                _trained(row, "entropy"),
                f"{row.time.total_s:.1f}",
            )
        return table

    def _error(self) -> Text:
        """The latest step's first error that had one, kept in view while later steps go
        on; plain text, as an error message may hold brackets."""
        erring = next((row for row in reversed(self.rows) if row.first_error is not None), None)
        return Text("" if erring is None else error_line(erring, self.steps))

    def _time_split(self) -> str:
        """Where the time went over the steps so far: the first question of a slow run."""
        if not self.rows:
            return ""
        parts = {"wait": "trainer_idle_s", "train": "train_s", "sync": "sync_s"}
        totals = {
            part: sum(getattr(row.time, key) for row in self.rows) for part, key in parts.items()
        }
        whole = sum(row.time.total_s for row in self.rows) or 1.0
        split = "  ".join(f"{part} {100 * t / whole:.0f}%" for part, t in totals.items())
        return f"time: {split}  (rollout {self.rows[-1].tokens_per_s.rollout:.0f} tok/s)"
