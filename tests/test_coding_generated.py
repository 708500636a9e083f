"""The generated coding tasks on real sandboxes: each kind is solved by its reference
solution and not by doing nothing, the audit finds no hack, the same seed gives the same
tasks, and they only ever join the train split."""

from __future__ import annotations

import json

import pytest

from reinforge.envs.builtin.coding import load_environment
from reinforge.envs.builtin.coding.generated import KINDS, generate
from reinforge.envs.harbor import load_environment as load_harbor
from reinforge.errors import UsageError

from .commands import reinforge
from .test_harbor_env import run_all


def generated(env) -> list[str]:
    return sorted(name for name in env.runnable if name.startswith("generated-"))


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_every_kind_scores_1_with_its_solution_and_0_untouched(tmp_path, agent, reward):
    paths = generate(2 * len(KINDS), seed=0, root=tmp_path)
    assert {p.name.rsplit("-", 1)[0] for p in paths} == {f"generated-{kind}" for kind in KINDS}
    trajectories = await run_all(load_harbor(tmp_path, agent=agent))
    assert sorted(t.task_id for t in trajectories) == sorted(p.name for p in paths)
    assert all(t.status == "ok" and t.reward == reward for t in trajectories), trajectories


def test_the_generated_tasks_audit_clean(tmp_path):
    generate(len(KINDS), seed=0, root=tmp_path / "tasks")
    out = tmp_path / "audit.json"
    result = reinforge("audit", str(tmp_path / "tasks"), "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["hacked"] == 0 and len(report["tasks"]) == len(KINDS)
    assert report["oracle_mean"] == 1.0 and report["nop_mean"] == 0.0


def test_a_seed_gives_the_same_tasks_and_another_seed_others(tmp_path):
    def instructions(seed: int, name: str) -> list[str]:
        paths = generate(len(KINDS), seed, tmp_path / name)
        return [(p / "instruction.md").read_text() for p in paths]

    first = instructions(0, "a")
    assert first == instructions(0, "b")
    assert first != instructions(1, "c")


def test_generated_tasks_join_train_and_never_the_held_out_split():
    written = load_environment(split="train")
    train = load_environment(split="train", generated=5)
    assert set(train.runnable) == set(written.runnable) | set(generated(train))
    assert len(generated(train)) == 5
    assert not generated(load_environment(split="all", tiers=["medium"], generated=5))
    with pytest.raises(UsageError, match="generated tasks only join the train split"):
        load_environment(split="test", generated=5)
    with pytest.raises(UsageError, match="generated -1: must be 0 or more"):
        load_environment(generated=-1)


def test_generated_only_leaves_the_written_tasks_out():
    only = load_environment(split="train", tiers=["easy"], generated=5, generated_only=True)
    mixed = load_environment(split="train", tiers=["easy"], generated=5)
    assert sorted(only.runnable) == generated(mixed)
    with pytest.raises(UsageError, match="generated_only leaves only the generated tasks"):
        load_environment(generated_only=True)
    with pytest.raises(UsageError, match="split 'held-out': one of all, train, test"):
        load_environment(split="held-out", generated=2, generated_only=True)


def test_generated_kinds_narrows_the_generated_tasks_to_those_named():
    train = load_environment(split="train", generated=6, generated_kinds=["edit", "make-dir"])
    kinds = [name.rsplit("-", 1)[0] for name in generated(train)]
    assert sorted(kinds) == ["generated-edit"] * 3 + ["generated-make-dir"] * 3
    for bad in (["edit", "paint"], []):
        with pytest.raises(UsageError, match="generated_kinds .*: name one or more of edit, "):
            load_environment(split="train", generated=2, generated_kinds=bad)
