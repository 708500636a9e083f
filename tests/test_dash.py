"""`reinforge dash` in a real headless browser (Debian's chromium, driven by selenium) over
run directories written with the real types and the real metrics function.

Set REINFORGE_DASH_SCREENSHOTS=DIR to also save a screenshot of each page there (the
pictures in docs/dash/ come from `REINFORGE_DASH_SCREENSHOTS=docs/dash`).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import Select, WebDriverWait

from reinforge.config import Config
from reinforge.orchestrate.metrics import StepMetrics, StepTime, step_metrics
from reinforge.policy.chat import ChatFormat
from reinforge.policy.models import load_tokenizer
from reinforge.rollout.evaluate import EvalSummary
from reinforge.rollout.store import RolloutWriter
from reinforge.rollout.summary import summarize
from reinforge.rundirs import diff
from reinforge.rundirs.dash.app import create_app
from reinforge.train.trainer import TrainStats, select_for_training
from reinforge.types import Group, Status, Task, Timings, Trajectory, TurnTime

from .commands import reinforge_here

STEPS = 12
SHOTS = os.environ.get("REINFORGE_DASH_SCREENSHOTS")
CHROMEDRIVER = shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    CHROMEDRIVER is None or shutil.which("chromium") is None,
    reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)",
)


def _trajectory(chat: ChatFormat, task: Task, index: int, step: int, answer: str) -> Trajectory:
    """One rollout as the engine records it: the prompt's tokens, then the sampled ones
    (loss mask 1, a log-prob and a policy version each); the second rollout of each task
    answers twice, with the environment's feedback (not trained) between its turns."""
    tokenizer = chat.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    replies = [f"I think it is {int(answer) + 1}.", answer] if index == 1 else [answer]
    ids = chat.prompt_ids(task.prompt)
    mask = [0] * len(ids)
    messages = list(task.prompt)
    for turn, reply in enumerate(replies):
        if turn:
            feedback = [{"role": "user", "content": "Not quite. Answer with just the number."}]
            before = len(ids)
            ids = chat.continuation_ids(ids, feedback, ended_with_eos=True)
            mask += [0] * (len(ids) - before)
            messages += feedback
        sampled = tokenizer.encode(reply, add_special_tokens=False) + [end]
        ids += sampled
        mask += [1] * len(sampled)
        messages.append({"role": "assistant", "content": reply})
    correct = float(replies[-1] == task.answer)
    sampled_count = sum(mask)
    return Trajectory(
        task_id=task.id,
        group_id=task.id,
        index=index,
        messages=messages,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-0.05 - 1.3 * (i % 5) for i in range(sampled_count)],
        policy_versions=[max(step - 2, 0)] * sampled_count,
        rewards={"correct": correct},
        reward=correct,
        status=Status.TRUNCATED if index == 1 and step % 5 == 0 else Status.OK,
        turns=len(replies),
        timings=Timings(
            generate_s=0.5 * len(replies),
            env_s=0.25,
            total_s=0.5 * len(replies) + 0.25,
            turns=[  # the feedback answers every reply but the last
                TurnTime(generate_s=0.5, env_s=0.25 if turn < len(replies) - 1 else 0.0)
                for turn in range(len(replies))
            ],
        ),
    )


def _groups(chat: ChatFormat, step: int, skill: float) -> list[Group]:
    """Four tasks x two rollouts; `skill * step` of the eight answer right, so the reward
    rises over the steps. Step 1's last rollout errored in its grader."""
    right = round(skill * step)
    groups = []
    for number in range(4):
        a, b = 11 + 7 * number + step, 23 + 5 * number
        task = Task(
            id=f"arith-{step}-{number}",
            prompt=[
                {"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}
            ],
            answer=str(a + b),
        )
        trajectories = []
        for index in range(2):
            answer = str(a + b) if index * 4 + number < right else str(a + b - 10)
            trajectories.append(_trajectory(chat, task, index, step, answer))
        if step == 1 and number == 3:
            trajectories[1] = trajectories[1].model_copy(
                update={
                    "status": Status.ERROR,
                    "reward": None,
                    "rewards": {},
                    "error": "ValueError: the grader could not parse the answer (grader.py:12)",
                }
            )
        groups.append(Group(task=task, trajectories=trajectories))
    return groups


def _write_run(root: Path, name: str, chat: ChatFormat, steps: int, skill: float) -> Path:
    """A training run's directory as `RunRecorder` leaves it, without checkpoints."""
    config = Config.model_validate(
        {
            "model": {"name": "tiny-random"},
            "env": {"name": "arithmetic"},
            "run": {"name": name, "dir": str(root), "steps": STEPS},
            "loop": {"mode": "async", "max_staleness": 1},
        }
    )
    run = config.run_dir
    (run / "trajectories").mkdir(parents=True)
    (run / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
    with (run / "metrics.jsonl").open("w") as metrics:
        for step in range(1, steps + 1):
            metrics.write(
                _metrics(step, _groups(chat, step, skill), config).model_dump_json() + "\n"
            )
            with (run / "trajectories" / f"step_{step:05d}.jsonl").open("w") as out:
                for group in _groups(chat, step, skill):
                    out.writelines(t.model_dump_json() + "\n" for t in group.trajectories)
    return run


def _metrics(step: int, groups: list[Group], config: Config) -> StepMetrics:
    selection = select_for_training(groups, config.trainer)
    tokens = sum(t.completion_tokens for t in selection.trajectories)
    trained = TrainStats(
        loss=0.02 / step,
        entropy=2.5 - 0.1 * step,
        clip_fraction=0.01 * (step % 3),
        grad_norm=1.0 / math.sqrt(step),
        lr=1e-5,
        trained_tokens=float(tokens),
    )
    idle_s = 4.0 + step % 3
    time_split = StepTime(
        trainer_idle_s=idle_s, train_s=2.5, sync_s=0.1, rollout_idle_s=0.5, total_s=idle_s + 2.8
    )
    return step_metrics(
        step,
        summarize(groups, 1.0),
        selection,
        trained,
        trained_version=step - 1,
        policy_version=step,
        dropped_stale=0,
        time=time_split,
        rollout_tokens_per_s=120.0,
        synced=None,
        traffic=[],
    )


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(load_tokenizer("tiny-random"))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory, chat: ChatFormat) -> Path:
    """`alpha` (12 steps, learning), `beta` (5 steps, slower), and an eval."""
    root = tmp_path_factory.mktemp("runs")
    _write_run(root, "alpha", chat, STEPS, 8 / STEPS)
    _write_run(root, "beta", chat, 5, 0.4)
    writer = RolloutWriter(root / "eval-arithmetic")
    groups = _groups(chat, 3, 0.5)
    for group in groups:
        writer.write_group(group)
    writer.write_summary(
        EvalSummary(
            **dict(summarize(groups, 1.0)),
            environment="arithmetic",
            model="tiny-random",
            seed=0,
            wall_s=2.0,
            sampled_tokens_per_s=100.0,
        )
    )
    writer.close()
    return root


@pytest.fixture(scope="module")
def dash_url(runs_dir: Path) -> Iterator[str]:
    """The app on a free port, served by uvicorn in a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(runs_dir), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def _wait(driver: Any, condition: Any, seconds: float = 60) -> Any:
    return WebDriverWait(driver, seconds).until(condition)


def _count(driver: Any, selector: str) -> int:
    return driver.execute_script(f"return document.querySelectorAll({selector!r}).length")


def _open(driver: Any, url: str, ready: str, shot: str | None = None) -> None:
    """Load `url`, wait until `ready` (a CSS selector) is on the page, and check the console
    stayed free of errors; with REINFORGE_DASH_SCREENSHOTS set, save the page as `shot`."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url)
    try:
        _wait(driver, lambda d: _count(d, ready) > 0)
    except TimeoutException:
        shown = driver.find_element("id", "error").text
        raise AssertionError(
            f"{ready} never came; page error {shown!r}, console: {driver.get_log('browser')}"
        ) from None
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert not driver.find_element("id", "error").is_displayed()
    if SHOTS and shot:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / shot))


@needs_browser
def test_runs_list_shows_runs_and_evals(browser: Any, dash_url: str) -> None:
    _open(browser, dash_url, "tr[data-run='eval-arithmetic']", "runs.png")
    cells = {
        row.get_attribute("data-run"): row.text
        for row in browser.find_elements("css selector", "#runs tbody tr")
    }
    assert {"alpha", "beta", "eval-arithmetic"} <= set(cells)
    assert f"{STEPS}/{STEPS}" in cells["alpha"] and "finished" in cells["alpha"]
    assert f"5/{STEPS}" in cells["beta"]
    assert "8 rollouts" in cells["eval-arithmetic"]


@needs_browser
def test_curves_render_overlaid_and_smoothed(browser: Any, dash_url: str) -> None:
    _open(browser, f"{dash_url}/run.html?run=alpha&run=beta", "#time-split canvas", "run.png")
    keys = browser.execute_script(
        "return [...document.querySelectorAll('#charts .chart')].map(c => c.dataset.key)"
    )
    assert keys[:3] == ["reward_mean", "pass_rate", "rewards.correct"]
    trained = {"train.entropy", "train.clip_fraction", "train.grad_norm"}
    assert trained | {"staleness_mean", "time.train_s", "errored"} <= set(keys)
    assert not {"step", "k", "tasks", "rollouts", "pass_threshold"} & set(keys)
    assert "dropped_stale" in browser.find_element("id", "always-zero").text
    reward = browser.find_element("css selector", ".chart[data-key='reward_mean']")
    assert reward.get_attribute("data-points") == str(STEPS)
    legend = reward.find_element("css selector", ".u-legend").text
    assert "alpha" in legend and "beta" in legend
    assert reward.get_attribute("data-series") == "4"  # each run smoothed, and faint raw
    # Smoothing off: the raw curves go, one series per run stays.
    browser.execute_script(
        "const s = document.getElementById('smoothing'); s.value = 0;"
        "s.dispatchEvent(new Event('input'));"
    )
    reward = browser.find_element("css selector", ".chart[data-key='reward_mean']")
    assert reward.get_attribute("data-series") == "2"
    split = browser.find_element("css selector", "#time-split .u-legend").text
    assert "waiting for rollouts" in split and "training" in split and "other" in split


@needs_browser
def test_trajectory_viewer_marks_trained_tokens(
    browser: Any, dash_url: str, runs_dir: Path
) -> None:
    _open(browser, f"{dash_url}/trajectories.html?run=alpha&step=1", "#rows tbody tr")
    lines = (runs_dir / "alpha" / "trajectories" / "step_00001.jsonl").read_text().splitlines()
    trajectory = Trajectory.model_validate_json(lines[1])  # two turns, feedback between
    browser.find_element("css selector", "#rows tr[data-line='1']").click()
    _wait(browser, lambda d: _count(d, ".tokens .tok") > 0)
    assert _count(browser, ".tokens .tok.trained") == sum(trajectory.loss_mask)
    untrained = len(trajectory.token_ids) - sum(trajectory.loss_mask)
    assert _count(browser, ".tokens .tok:not(.trained)") == untrained
    tokens = browser.find_element("css selector", ".tokens").text
    assert "Not quite." in tokens and "What is" in tokens
    detail = browser.find_element("id", "detail").text  # each turn's reply and answer
    assert "answers 0.25" in detail and "0.50 + 0.25, 0.50 + 0.00" in detail
    if SHOTS:
        _open(browser, browser.current_url, ".tokens .tok.trained", "trajectories.png")
    # The errored rollout: filtered by status, with its error and no advantage.
    Select(browser.find_element("id", "status")).select_by_visible_text("error")
    assert _count(browser, "#rows tbody tr") == 1
    browser.find_element("css selector", "#rows tbody tr").click()
    _wait(browser, lambda d: "grader could not parse" in d.find_element("id", "detail").text)
    assert "not trained" in browser.find_element("id", "detail").text


@needs_browser
def test_what_changed_between_two_steps(browser: Any, dash_url: str, runs_dir: Path) -> None:
    _open(browser, f"{dash_url}/run.html?run=alpha", ".diff-link")
    browser.find_element("css selector", ".diff-link").click()
    _wait(browser, lambda d: _count(d, "#metrics tbody tr") > 0)
    assert "diff.html?run=alpha" in browser.current_url

    def reward_row() -> list[str]:
        row = browser.find_element("css selector", "#metrics tr[data-metric='reward (mean)']")
        return [cell.text for cell in row.find_elements("css selector", "td")]

    # alpha learns: steps 1-2 (a window of 3 at the first step) against steps 11-12
    _open(browser, f"{dash_url}/diff.html?run=alpha", "#metrics tbody tr", "diff.png")
    _, before, after, change = reward_row()
    assert float(before) < float(after) and change.startswith("+")
    assert _count(browser, "#rose tbody tr") > 0  # the right answers' numbers
    _open(browser, f"{dash_url}/diff.html?run=alpha&from=1&to=2&window=1", "#metrics tbody tr")
    report = diff.compare(*diff.run_sides(runs_dir / "alpha", 1, 2, window=1))
    (reward,) = [row for row in report.rows if row.metric == "reward (mean)"]
    assert reward_row()[1:3] == [f"{reward.before:.3f}", f"{reward.after:.3f}"]


@needs_browser
def test_live_run_shows_new_steps_without_reload(
    browser: Any, dash_url: str, runs_dir: Path, chat: ChatFormat
) -> None:
    run = _write_run(runs_dir, "live", chat, 2, 0.5)
    _open(browser, f"{dash_url}/run.html?run=live", ".chart[data-key='reward_mean']")
    chart = ".chart[data-key='reward_mean']"
    assert browser.find_element("css selector", chart).get_attribute("data-points") == "2"
    browser.execute_script("window.notReloaded = true")
    config = Config.model_validate_json((run / "config.json").read_text())
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write(_metrics(3, _groups(chat, 3, 0.5), config).model_dump_json() + "\n")
    _wait(
        browser, lambda d: d.find_element("css selector", chart).get_attribute("data-points") == "3"
    )
    assert browser.execute_script("return window.notReloaded") is True


def test_api_reads_a_run_as_written(runs_dir: Path) -> None:
    client = TestClient(create_app(runs_dir))
    rows = client.get("/api/metrics", params={"run": "alpha", "since": 10}).json()
    assert [r["step"] for r in rows["rows"]] == [11, 12] and rows["next"] == STEPS
    # A resumed run rewrites metrics.jsonl shorter: the page starts over.
    assert client.get("/api/metrics", params={"run": "beta", "since": 9}).json()["restart"]
    assert client.get("/api/metrics", params={"run": "../.."}).status_code == 404
    # Step 3: groups 0-1 answer right once in two (rewards 1, 0), groups 2-3 never. GRPO:
    # (1 - 0.5) / (sample std 0.7071 + 1e-4) = 0.7070; equal rewards train nothing.
    step = client.get("/api/trajectories", params={"run": "alpha", "step": 3}).json()
    advantages = [r["advantage"] for r in step["rows"]]
    assert advantages[:4] == pytest.approx([0.70700, -0.70700, 0.70700, -0.70700], abs=1e-4)
    assert advantages[4:] == [None] * 4
    evaluated = client.get("/api/trajectories", params={"run": "eval-arithmetic"}).json()
    assert evaluated["no_advantages"] == "an eval trains nothing"
    one = client.get("/api/trajectory", params={"run": "alpha", "step": 3, "line": 1}).json()
    assert len(one["token_texts"]) == len(one["token_ids"])
    assert "".join(one["token_texts"]).startswith("<|im_start|>system")
    # Pointed at one run, the dashboard shows that run alone, by its folder's name.
    alone = TestClient(create_app(runs_dir / "alpha"))
    assert [run["id"] for run in alone.get("/api/runs").json()["runs"]] == ["alpha"]
    assert alone.get("/api/metrics", params={"run": "beta"}).status_code == 404


def test_dash_command_rejects_a_missing_folder(tmp_path: Path) -> None:
    result = reinforge_here("dash", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "no such folder" in result.stderr
