"""What a policy learned: its behaviour in two sets of rollouts, side by side.

A training step's rollouts are on-policy samples of the weights at that step, so the steps
around it describe the policy there without generating anything new; two evals of
checkpoints on the same tasks give samples of the same tasks. Each side gets the numbers of
`summarize` (the ones metrics.jsonl and `reinforge eval` report), tool errors by kind, the
word n-grams of its sampled text that rose and fell most, and rollouts of a task both sides
saw.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from reinforge.errors import UsageError
from reinforge.rollout.store import read_trajectories
from reinforge.rollout.summary import SCORED, summarize
from reinforge.types import Group, Message, Status, Task, Trajectory

WINDOW = 3
"""Steps read around each step of a run: one step's rollouts are too few to tell apart."""
TOP = 10
"""N-grams listed as rising and as falling."""
MIN_COUNT = 3
"""Rollouts that must hold an n-gram on one side before it is listed: rarer ones are noise."""
EXAMPLES = 3
"""Tasks shown before and after."""
MAX_N = 3
EXAMPLE_CHARS = 300
WORD = re.compile(r"[\w']+")
NO_PAIRS = (
    "No task appears on both sides (a training run usually draws new tasks each step); "
    "evals of two checkpoints on the same tasks pair every task."
)
RAISED = re.compile(r"^Error: ([A-Z]\w*(?:Error|Exception)): ")


@dataclass(frozen=True)
class Side:
    """The rollouts of one side and the pass threshold they were scored with (None when the
    files do not record it)."""

    label: str
    trajectories: list[Trajectory]
    pass_threshold: float | None


@dataclass(frozen=True)
class Row:
    """One metric on both sides; `counts` are the events behind the values when those are
    rates (per rollout), so a rate of few events reads as such."""

    metric: str
    before: float
    after: float
    counts: tuple[int, int] | None = None
    digits: int = 3


@dataclass(frozen=True)
class Ngram:
    """Rollouts whose sampled text holds `text`, per 1000 rollouts of each side."""

    text: str
    before: float
    after: float


@dataclass(frozen=True)
class Example:
    reward: float | None
    status: str
    text: str


@dataclass(frozen=True)
class Pair:
    """A task both sides saw: the mean reward of its rollouts on each side (None: none was
    scored) and its first rollout on each."""

    task_id: str
    before_reward: float | None
    after_reward: float | None
    before: Example
    after: Example


@dataclass(frozen=True)
class Report:
    before: str
    after: str
    sizes: str
    """Rollouts and tasks of each side, in words."""
    pass_threshold: float
    rows: list[Row]
    rose: list[Ngram]
    fell: list[Ngram]
    pairs: list[Pair]


def run_sides(run: Path, start: int, end: int, window: int = WINDOW) -> tuple[Side, Side]:
    """The rollouts of the `window` steps centred on `start` and on `end` (fewer at the ends
    of the run) of a training run's directory."""
    if not run.is_dir():
        raise UsageError(f"no such run: {run}")
    if not (run / "trajectories").is_dir():
        raise UsageError(f"{run} is not a training run: it has no trajectories/ folder")
    if window < 1:
        raise UsageError(f"--window must be at least 1, not {window}")
    files = {int(p.stem.removeprefix("step_")): p for p in run.glob("trajectories/step_*.jsonl")}
    before, after = _window(start, window, files, run), _window(end, window, files, run)
    if set(before) & set(after):
        raise UsageError(
            f"the windows around steps {start} and {end} overlap ({window} steps each); "
            "use a smaller --window or steps further apart"
        )
    thresholds = _recorded_thresholds(run)

    def side(steps: list[int]) -> Side:
        rollouts = [t for step in steps for t in read_trajectories(files[step])]
        return Side(_steps_label(steps), rollouts, thresholds.get(steps[0]))

    return side(before), side(after)


def eval_sides(before: Path, after: Path) -> tuple[Side, Side]:
    """The rollouts of two `reinforge eval` output folders, labelled by the folders' names
    (by their paths when the names are the same)."""
    same = before.name == after.name
    return (
        _eval_side(before, str(before) if same else before.name),
        _eval_side(after, str(after) if same else after.name),
    )


def _eval_side(folder: Path, label: str) -> Side:
    path = folder / "trajectories.jsonl"
    if not path.is_file():
        raise UsageError(f"{folder} holds no trajectories.jsonl (what reinforge eval writes)")
    summary = folder / "summary.json"
    stored = json.loads(summary.read_text(encoding="utf-8")) if summary.is_file() else {}
    return Side(label, read_trajectories(path), stored.get("pass_threshold"))


def compare(
    before: Side,
    after: Side,
    pass_threshold: float | None = None,
    top: int = TOP,
    min_count: int = MIN_COUNT,
    examples: int = EXAMPLES,
) -> Report:
    """The report of the two sides, pass rates at `pass_threshold` (None: the one both
    sides recorded)."""
    threshold = _threshold(before, after, pass_threshold)
    for side in (before, after):
        if not side.trajectories:
            raise UsageError(f"{side.label} holds no rollouts")
    rose, fell = ngram_changes(before.trajectories, after.trajectories, top, min_count)
    return Report(
        before=before.label,
        after=after.label,
        sizes=f"{before.label}: {_size(before.trajectories)}; "
        f"{after.label}: {_size(after.trajectories)}",
        pass_threshold=threshold,
        rows=behaviour_rows(before.trajectories, after.trajectories, threshold),
        rose=rose,
        fell=fell,
        pairs=pairs(before.trajectories, after.trajectories, examples),
    )


def behaviour_rows(
    before: list[Trajectory], after: list[Trajectory], pass_threshold: float
) -> list[Row]:
    """The metrics of `summarize` for each side, then tool errors by kind, hack flags and
    statuses as events per rollout."""
    b, a = (summarize(_groups(side), pass_threshold) for side in (before, after))
    n = (len(before), len(after))
    rows = [Row("reward (mean)", b.reward_mean, a.reward_mean)]
    for term in sorted(b.rewards.keys() | a.rewards.keys()):
        rows.append(Row(f"  {term}", b.rewards.get(term, 0.0), a.rewards.get(term, 0.0)))
    rows += [
        Row(f"pass rate (reward >= {pass_threshold:g})", b.pass_rate, a.pass_rate),
        Row("turns (mean)", b.turns_mean, a.turns_mean, digits=2),
        Row(
            "completion tokens (mean)", b.completion_tokens_mean, a.completion_tokens_mean, digits=1
        ),
        _rate("tool errors per rollout", (b.tool_errors, a.tool_errors), n),
    ]
    kb, ka = (Counter(k for t in side for k in error_kinds(t.messages)) for side in (before, after))
    rows += [_rate(f"  {kind}", (kb[kind], ka[kind]), n) for kind in sorted(kb.keys() | ka.keys())]
    looped = (round(b.loop_rate * n[0]), round(a.loop_rate * n[1]))
    rows.append(_rate("loop rate", looped, n))
    hb, ha = b.hack_flags, a.hack_flags
    for flag in sorted(hb.keys() | ha.keys()):
        rows.append(_rate(f"hack: {flag}", (hb.get(flag, 0), ha.get(flag, 0)), n))
    for status in Status:
        counts = (b.status.get(status.value, 0), a.status.get(status.value, 0))
        if any(counts):
            rows.append(_rate(f"status: {status.value}", counts, n))
    return rows


def error_kinds(messages: list[Message]) -> list[str]:
    """The kind of each tool error in a conversation, read from the tool messages that
    `Environment._run_tools` and `Tool.call` write: a malformed call (it has no tool name),
    an unknown tool, invalid arguments, or the exception the tool raised."""
    kinds = []
    for message in messages:
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str):
            continue
        if not content.startswith("Error: "):
            continue
        if "name" not in message:
            kinds.append("malformed tool call")
        elif content.startswith("Error: no tool named"):
            kinds.append("unknown tool")
        elif content.startswith("Error: invalid arguments"):
            kinds.append("invalid arguments")
        elif raised := RAISED.match(content):
            kinds.append(f"raised {raised.group(1)}")
        else:
            kinds.append("other tool error")
    return kinds


def sampled_text(trajectory: Trajectory) -> str:
    """What the policy wrote: its messages' text and the tool calls it made."""
    parts = []
    for message in trajectory.messages:
        if message.get("role") != "assistant":
            continue
        parts.append(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments") or ""
            parts += [
                str(function.get("name", "")),
                json.dumps(arguments) if isinstance(arguments, dict) else str(arguments),
            ]
    return "\n".join(parts)


def ngrams(text: str, max_n: int = MAX_N) -> set[str]:
    """The lower-cased word 1- to `max_n`-grams of `text`."""
    words = WORD.findall(text.lower())
    return {
        " ".join(words[i : i + n]) for n in range(1, max_n + 1) for i in range(len(words) - n + 1)
    }


def ngram_changes(
    before: list[Trajectory], after: list[Trajectory], top: int = TOP, min_count: int = MIN_COUNT
) -> tuple[list[Ngram], list[Ngram]]:
    """The `top` n-grams whose share of rollouts rose most, and those that fell most. Of an
    n-gram and a longer one holding it in the same rollouts, only the longer is listed."""
    counts = [Counter(g for t in side for g in ngrams(sampled_text(t))) for side in (before, after)]
    changes = [
        Ngram(g, 1000 * counts[0][g] / len(before), 1000 * counts[1][g] / len(after))
        for g in counts[0].keys() | counts[1].keys()
        if max(counts[0][g], counts[1][g]) >= min_count
    ]
    rose = sorted(
        (c for c in changes if c.after > c.before),
        key=lambda c: (c.before - c.after, -c.text.count(" "), c.text),
    )
    fell = sorted(
        (c for c in changes if c.after < c.before),
        key=lambda c: (c.after - c.before, -c.text.count(" "), c.text),
    )
    return _distinct(rose, counts, top), _distinct(fell, counts, top)


def pairs(before: list[Trajectory], after: list[Trajectory], limit: int = EXAMPLES) -> list[Pair]:
    """Up to `limit` tasks both sides saw, those whose mean reward changed most first."""
    by_task = [_by_task(before), _by_task(after)]
    found = []
    for task_id in by_task[0].keys() & by_task[1].keys():
        means = [_mean_reward(side[task_id]) for side in by_task]
        first = [_example(side[task_id][0]) for side in by_task]
        found.append(Pair(task_id, means[0], means[1], first[0], first[1]))
    found.sort(key=lambda p: (-abs((p.after_reward or 0.0) - (p.before_reward or 0.0)), p.task_id))
    return found[:limit]


def cells(row: Row) -> tuple[str, str, str, str]:
    """A row as the table and the Markdown file show it: metric, before, after, change."""
    values = [f"{v:.{row.digits}f}" for v in (row.before, row.after)]
    if row.counts is not None:
        values = [f"{v} ({c})" for v, c in zip(values, row.counts, strict=True)]
    return row.metric, values[0], values[1], f"{row.after - row.before:+.{row.digits}f}"


def markdown(report: Report) -> str:
    """The report as a Markdown document."""
    lines = [
        f"# {report.before} -> {report.after}",
        "",
        f"{report.sizes}.",
        "",
        f"| metric | {report.before} | {report.after} | change |",
        "|---|--:|--:|--:|",
    ]
    lines += ["| " + " | ".join(_escape(c) for c in cells(row)) + " |" for row in report.rows]
    for title, listed in (("rose", report.rose), ("fell", report.fell)):
        lines += ["", f"## N-grams that {title} (rollouts per 1000)", ""]
        if not listed:
            lines.append("none")
            continue
        lines += [f"| n-gram | {report.before} | {report.after} |", "|---|--:|--:|"]
        lines += [f"| `{_escape(g.text)}` | {g.before:.0f} | {g.after:.0f} |" for g in listed]
    lines += ["", "## The same task before and after", ""]
    if not report.pairs:
        lines.append(NO_PAIRS)
    for pair in report.pairs:
        lines += [f"### {pair.task_id}", ""]
        for label, mean, example in (
            (report.before, pair.before_reward, pair.before),
            (report.after, pair.after_reward, pair.after),
        ):
            lines += [
                f"**{label}** ({example_caption(mean, example)}):",
                "",
                "```",
                example.text,
                "```",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def example_caption(mean: float | None, example: Example) -> str:
    reward = "none" if example.reward is None else f"{example.reward:.3f}"
    task = "none" if mean is None else f"{mean:.3f}"
    return f"reward {reward}, {example.status}; task mean {task}"


def _threshold(before: Side, after: Side, given: float | None) -> float:
    if given is not None:
        return given
    first, second = before.pass_threshold, after.pass_threshold
    if first is None or second is None:
        label = before.label if first is None else after.label
        raise UsageError(f"{label} records no pass threshold; give --pass-threshold")
    if first != second:
        raise UsageError(
            f"the sides were scored with different pass thresholds ({first:g}, {second:g}); "
            "give --pass-threshold"
        )
    return first


def _window(step: int, window: int, files: dict[int, Path], run: Path) -> list[int]:
    if step not in files:
        have = f"steps {min(files)}-{max(files)}" if files else "no steps"
        raise UsageError(f"{run} has no trajectories for step {step} (it has {have})")
    first = step - (window - 1) // 2
    return [s for s in range(first, first + window) if s in files]


def _recorded_thresholds(run: Path) -> dict[int, float]:
    """Each step's `pass_threshold` in metrics.jsonl."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return {row["step"]: row["pass_threshold"] for row in rows if "pass_threshold" in row}


def _steps_label(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def _size(trajectories: list[Trajectory]) -> str:
    tasks = len({t.task_id for t in trajectories})
    return f"{len(trajectories)} rollouts of {tasks} tasks"


def _groups(trajectories: list[Trajectory]) -> list[Group]:
    """Rollouts grouped as they were sampled, for `summarize`'s per-group pass rate."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return [Group(task=Task(id=g[0].task_id, prompt=[]), trajectories=g) for g in groups.values()]


def _rate(metric: str, counts: tuple[int, int], rollouts: tuple[int, int]) -> Row:
    """Events per rollout on each side, with the counts."""
    return Row(metric, counts[0] / rollouts[0], counts[1] / rollouts[1], counts)


def _distinct(ranked: list[Ngram], counts: list[Counter[str]], top: int) -> list[Ngram]:
    chosen: list[Ngram] = []
    for ngram in ranked:
        same = (counts[0][ngram.text], counts[1][ngram.text])
        if any(
            f" {ngram.text} " in f" {c.text} " and (counts[0][c.text], counts[1][c.text]) == same
            for c in chosen
        ):
            continue
        chosen.append(ngram)
        if len(chosen) == top:
            break
    return chosen


def _by_task(trajectories: list[Trajectory]) -> dict[str, list[Trajectory]]:
    tasks: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        tasks.setdefault(trajectory.task_id, []).append(trajectory)
    return tasks


def _mean_reward(trajectories: list[Trajectory]) -> float | None:
    rewards = [t.reward or 0.0 for t in trajectories if t.status in SCORED]
    return sum(rewards) / len(rewards) if rewards else None


def _example(trajectory: Trajectory) -> Example:
    text = (
        textwrap.shorten(sampled_text(trajectory), EXAMPLE_CHARS, placeholder=" ...") or "(no text)"
    )
    return Example(trajectory.reward, trajectory.status.value, text)


def _escape(text: str) -> str:
    """A table cell's text in Markdown: pipes escaped, a sub-row's indent kept."""
    indent = len(text) - len(text.lstrip(" "))
    return "&nbsp;" * indent + text.lstrip(" ").replace("|", "\\|")
