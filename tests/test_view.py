"""The training console: a live panel on a terminal, one line per step elsewhere."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from reinforge.commands import view as view_module
from reinforge.commands.view import TrainView, sparkline, step_line
from reinforge.orchestrate.metrics import StepMetrics, StepTime, step_metrics
from reinforge.rollout.summary import summarize
from reinforge.train.trainer import Selection, TrainStats


def _row(step: int, reward: float) -> StepMetrics:
    summary = summarize([], 1.0).model_copy(
        update={
            "reward_mean": reward,
            "reward_std": 0.1,
            "pass_rate": reward,
            "completion_tokens_mean": 20.0,
            "errored": 1,
        }
    )
    trained = TrainStats(
        loss=0.1, entropy=1.2, grad_norm=1.0, lr=1e-5, trained_tokens=200.0, clip_fraction=0.01
    )
    time_split = StepTime(
        trainer_idle_s=3.0, train_s=1.0, sync_s=0.0, rollout_idle_s=1.0, total_s=4.0
    )
    return step_metrics(
        step,
        summary,
        Selection(zero_variance_groups=3),
        trained,
        trained_version=step - 1,
        policy_version=step,
        dropped_stale=0,
        time=time_split,
        rollout_tokens_per_s=50.0,
        synced=None,
        traffic=[],
    )


def test_sparkline_scales_to_the_range():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▁▁"
    assert sparkline([]) == ""
    assert len(sparkline([float(i) for i in range(100)], width=10)) == 10


def test_a_terminal_gets_the_live_panel_with_curve_and_time_split():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=120)
    with TrainView(console, steps=4) as view:
        for step, reward in enumerate([0.0, 0.25, 0.5], start=1):
            view.update(_row(step, reward))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor movement
    assert "3/4" in text and "reward ▁▅█" in text
    assert "wait 75%" in text and "train 25%" in text


def test_a_pipe_gets_one_plain_line_per_step():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with TrainView(console, steps=2) as view:
        view.update(_row(1, 0.0))
        view.update(_row(2, 0.5))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("step    2/2  reward 0.500")
    assert "\x1b[" not in out.getvalue()


def test_an_off_policy_step_shows_its_staleness():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    row = _row(1, 0.0).model_copy(
        update={"staleness_max": 1, "staleness_mean": 0.5, "dropped_stale": 2}
    )
    with TrainView(console, steps=1) as view:
        view.update(row)
    assert "stale 0.50/1  dropped 2  carried 0" in out.getvalue()
    assert "stale" not in step_line(_row(1, 0.0), 1)


def test_a_log_keeps_one_line_per_step_at_any_width():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80)  # a pipe's default width
    with TrainView(console, steps=1) as view:
        view.update(_row(1, 0.5))
    assert len(out.getvalue().splitlines()) == 1 and len(out.getvalue()) > 80


ERROR = "reward 'grade' raised KeyError: [answer] (env.py:6)"
"""In brackets, as rich markup would eat them."""


def test_a_log_shows_a_step_s_first_error_on_the_next_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80)
    with TrainView(console, steps=2) as view:
        view.update(_row(1, 0.5).model_copy(update={"first_error": ERROR}))
        view.update(_row(2, 0.5))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[1] == f"step    1/2  first error: {ERROR}"
    assert lines[2].startswith("step    2/2  reward")


def test_the_live_panel_keeps_the_latest_first_error_in_view():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=120)
    with TrainView(console, steps=3) as view:
        view.update(_row(1, 0.5).model_copy(update={"first_error": ERROR}))
        view.update(_row(2, 0.5))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert text.rstrip().endswith(f"step    1/3  first error: {ERROR}")


def test_a_log_hears_from_a_long_step(monkeypatch):
    monkeypatch.setattr(view_module, "HEARTBEAT_S", 0.05)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with TrainView(console, steps=2):
        deadline = time.monotonic() + 30
        while "running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out.getvalue().startswith("step    1/2  running, ")


def test_the_live_panel_says_once_that_a_step_trained_nothing_and_counts_them_at_the_end():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, width=120)
    idle = {"train": None, "tasks": 3}  # its 3 groups each of equal rewards
    with TrainView(console, steps=3) as view:
        view.update(_row(1, 0.5).model_copy(update=idle))
        view.update(_row(2, 0.5))
        view.update(_row(3, 0.5).model_copy(update=idle))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert text.count("trained nothing: every group's rewards were equal") == 1
    assert "warning: step 1 trained nothing" in text
    assert text.rstrip().endswith("2 of 3 steps trained nothing (every group's rewards were equal)")
