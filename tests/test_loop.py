"""The asynchronous and partial loop modes on real parts: the tiny random model, the real
engine, a test environment that holds one group back until the trainer has moved on."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reinforge.config import Config, load_config
from reinforge.orchestrate.loop import train
from reinforge.orchestrate.rollouts import task_seed
from reinforge.policy.models import load_model
from reinforge.train.checkpoints import load_trainer_state
from reinforge.types import Trajectory

from .commands import ROOT, kill_after, tiny_train

GATED_ENV = str(ROOT / "tests" / "data" / "gated_env.py")
UNIFORM_ENV = str(ROOT / "tests" / "data" / "uniform_env.py")
SLOW_TASK = f"gated-{task_seed(0, 0)}-0"
"""The group the gated environment holds back: the first task of the run's first step."""


def _run(
    tmp_path: Path, *overrides: str, env: str = GATED_ENV
) -> tuple[list[dict], list[Trajectory]]:
    """Train in this process (on the gated environment unless `env` names another; the
    gated one counts finished steps in its module); returns the metrics rows and the
    recorded trajectories."""
    config = load_config(
        Config,
        None,
        [
            "model.name=tiny-random",
            f"env.name={env}",
            f"run.dir={tmp_path}",
            "run.name=r",
            "rollout.tasks_per_step=2",
            "rollout.rollouts_per_task=2",
            *overrides,
        ],
    )

    def on_step(metrics: dict) -> None:
        if env == GATED_ENV:
            sys.modules["reinforge_user_env_gated_env"].steps_done += 1

    run = asyncio.run(train(config, on_step))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    recorded = [
        Trajectory.model_validate_json(line)
        for path in sorted((run / "trajectories").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return rows, recorded


def _weights_by_version(run: Path) -> dict[int, dict[str, torch.Tensor]]:
    """The policy of every version the run had: the start, then each checkpoint."""
    versions = {0: load_model("tiny-random")[0].state_dict()}
    for checkpoint in sorted((run / "checkpoints").iterdir()):
        model = load_model(str(checkpoint))[0]
        versions[load_trainer_state(checkpoint)["policy_version"]] = model.state_dict()
    return versions


def test_partial_mode_carries_a_rollout_over_the_weight_sync_token_exactly(tmp_path):
    rows, recorded = _run(
        tmp_path,
        "loop.mode=partial",
        "loop.max_staleness=2",  # the held group trains at step 1 or 2, never dropped
        "env.args.hold_until_step=1",
        "run.steps=3",
        "run.checkpoint_every=1",
        "optim.lr=1e-2",  # weights that differ enough for a stale KV cache to show
    )
    assert all(row["staleness_max"] <= 2 for row in rows)
    carried = [t for t in recorded if len(set(t.policy_versions)) > 1]
    assert SLOW_TASK in {t.task_id for t in carried}
    # the metrics count the carried rollouts that trained: a group whose rewards came out
    # equal is recorded but trains nothing
    rewards: dict[str, set[float | None]] = {}
    for t in recorded:
        rewards.setdefault(t.group_id, set()).add(t.reward)
    trained = [t for t in carried if len(rewards[t.group_id]) > 1]
    assert sum(row["carried_over"] for row in rows) == len(trained)

    # Each sampled token's log-prob is that of the weights its version names, given the
    # tokens before it: the sync neither mixed old states into new weights nor re-sampled.
    weights = _weights_by_version(tmp_path / "r")
    model = load_model("tiny-random")[0]
    for trajectory in carried:
        ids = torch.tensor([trajectory.token_ids])  # (1, L)
        sampled = [i for i, m in enumerate(trajectory.loss_mask) if m]
        for version in sorted(set(trajectory.policy_versions)):
            model.load_state_dict(weights[version])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # (L, V)
            for position, recorded, v in zip(
                sampled, trajectory.logprobs, trajectory.policy_versions, strict=True
            ):
                if v == version:
                    expected = float(logp[position - 1, trajectory.token_ids[position]])
                    assert abs(recorded - expected) < 1e-4, (position, version)


def test_async_mode_never_trains_a_group_older_than_the_bound(tmp_path):
    rows, trained = _run(
        tmp_path,
        "loop.mode=async",
        "loop.max_staleness=1",
        "env.args.hold_until_step=2",  # its first turn was sampled by version 0
        "run.steps=5",
    )
    assert sum(row["dropped_stale"] for row in rows) >= 1
    assert all(row["staleness_max"] <= 1 for row in rows)
    assert SLOW_TASK not in {t.task_id for t in trained}
    assert len(trained) == 5 * 2 * 2  # every step still trained on two full groups


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_uniform_groups_are_set_aside_and_the_next_tasks_drawn_in_their_place(tmp_path, mode):
    # each step's tasks: one whose group varies, one whose group cannot
    rows, recorded = _run(
        tmp_path,
        f"loop.mode={mode}",
        f"env.name={UNIFORM_ENV}",
        "env.args.varying=1",
        "loop.uniform_redraws=4",
        "run.steps=3",
        env=UNIFORM_ENV,
    )
    for row in rows:
        # two varying groups trained every step, once it had set the uniform ones aside
        assert row["trained_samples"] == 4 and row["train"] is not None
        assert row["zero_variance_groups"] == row["redrawn"]
        assert row["tasks"] == 2 + row["redrawn"]  # the step's numbers count them too
    if mode == "sync":  # every step starts on a task after a varying one
        assert all(row["redrawn"] >= 1 for row in rows)
    same = [t for t in recorded if t.task_id.startswith("same-")]
    assert same
    assert len(same) == 2 * sum(row["redrawn"] for row in rows)  # recorded, never trained
    assert len(recorded) - len(same) == 3 * 4


def test_uniform_redraws_are_bounded_per_step(tmp_path):
    rows, recorded = _run(
        tmp_path,
        f"env.name={UNIFORM_ENV}",
        "env.args.varying=0",  # every group uniform
        "loop.uniform_redraws=1",
        "run.steps=2",
        env=UNIFORM_ENV,
    )
    for row in rows:
        assert row["redrawn"] == 1 and row["zero_variance_groups"] == 3
        assert row["tasks"] == 3 and row["train"] is None
    assert len(recorded) == 2 * 3 * 2


def test_without_redraws_a_step_trains_on_the_groups_it_draws_first(tmp_path):
    rows, _ = _run(tmp_path, f"env.name={UNIFORM_ENV}", "run.steps=2", env=UNIFORM_ENV)
    for row in rows:
        assert row["redrawn"] == 0 and row["zero_variance_groups"] == 1
        assert row["tasks"] == 2 and row["trained_samples"] == 2


def test_a_killed_async_run_resumes_with_its_versions_and_staleness(tmp_path):
    argv = tiny_train(
        tmp_path, "run.steps=4", "run.checkpoint_every=2", "loop.mode=async", "loop.max_staleness=1"
    )
    killed = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "r" / "metrics.jsonl"
    kill_after(killed, metrics, 3)  # past the step-2 checkpoint, before the end

    resumed = subprocess.run([*argv, "--resume"], cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # Versions continue from the checkpoint (never restart at 0), so staleness stays bounded.
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    assert all(0 <= r["staleness_max"] <= 1 for r in rows)
