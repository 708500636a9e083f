"""The generated coding tasks on real sandboxes: each kind is solved by its reference
solution and not by doing nothing, a Python task is graded by the values its function
returns, none names a path or function that a written task names, the audit finds no hack,
the same seed gives the same tasks, and they only ever join the train split."""

from __future__ import annotations

import ast
import json
import re

import pytest

from reinforge.envs.builtin.coding import TASKS, written_names
from reinforge.envs.builtin.coding.generated import KINDS, generate, named
from reinforge.envs.builtin.coding.generated.task_dir import FUNCTION_CHECK
from reinforge.envs.registry import load_environment
from reinforge.errors import UsageError

from .commands import reinforge_here
from .test_harbor_env import played_by, run_all


def generated(env) -> list[str]:
    return sorted(name for name in env.runnable if name.startswith("generated-"))


def coding(**args):
    return load_environment("coding", **args)


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_every_kind_scores_1_with_its_solution_and_0_untouched(tmp_path, agent, reward):
    paths = generate(2 * len(KINDS), seed=0, root=tmp_path, kinds=list(KINDS))
    assert {p.name.rsplit("-", 1)[0] for p in paths} == {f"generated-{kind}" for kind in KINDS}
    trajectories = await run_all(played_by(agent, tmp_path))
    assert sorted(t.task_id for t in trajectories) == sorted(p.name for p in paths)
    assert all(t.status == "ok" and t.reward == reward for t in trajectories), trajectories


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_described_contents_score_1_with_their_solution_and_0_untouched(
    tmp_path, agent, reward
):
    """The forms that describe what to write (a section and its settings, a JSON object,
    a folder holding a file) instead of listing the file's lines."""
    paths = generate(48, seed=1, root=tmp_path, kinds=["create", "make-dir"])
    said = "\n".join((p / "instruction.md").read_text() for p in paths)
    forms = ("INI file", "TOML file", "JSON object", "one setting per line", "holding one file")
    assert all(form in said for form in forms), said
    trajectories = await run_all(played_by(agent, tmp_path))
    assert len(trajectories) == 48
    assert all(t.status == "ok" and t.reward == reward for t in trajectories), trajectories


async def test_a_python_task_is_graded_on_what_its_function_returns(tmp_path):
    """A change that runs but returns the wrong values scores 0, whatever the file says."""
    python_kinds = ["fix-operator", "fix-typo", "return-not-print", "implement"]
    python_kinds.append("implement-described")
    paths = generate(2 * len(python_kinds), seed=0, root=tmp_path, kinds=python_kinds)
    for path in paths:
        (module,) = (path / "environment").glob("*.py")
        wrong = f"#!/bin/bash\nsed -i 's/^    .*/    return 0/' /app/{module.name}\n"
        (path / "solution" / "solve.sh").write_text(wrong)
    trajectories = await run_all(played_by("oracle", tmp_path))
    assert len(trajectories) == len(paths)
    assert all(t.status == "ok" and t.reward == 0.0 for t in trajectories), trajectories


async def test_a_described_body_is_the_agents_to_find_and_no_shortcut_passes(tmp_path):
    """The instruction says what the function returns in words and one example, never the
    expression; returning the argument as it came, or the example's value, scores 0."""
    for shortcut in ("argument", "example"):
        paths = generate(60, seed=0, root=tmp_path / shortcut, kinds=["implement-described"])
        for path in paths:
            instruction = (path / "instruction.md").read_text().strip()
            solve = path / "solution" / "solve.sh"
            expression = re.search(r"/return (.+)/' ", solve.read_text()).group(1)
            assert (
                f"`{expression}`" not in instruction and f"return {expression}" not in instruction
            )
            (module,) = (path / "environment").glob("*.py")
            signature = module.read_text().splitlines()[0]
            returned = {
                "argument": re.search(r"\((\w+)\):", signature).group(1),
                "example": re.search(r"`([^`]+)`\.$", instruction).group(1),
            }[shortcut]
            body = f"{signature}\n    return {returned}\n"
            solve.write_text(f"#!/bin/bash\ncat > /app/{module.name} <<'PY'\n{body}PY\n")
        trajectories = await run_all(played_by("oracle", tmp_path / shortcut))
        assert len(trajectories) == len(paths)
        assert all(t.status == "ok" and t.reward == 0.0 for t in trajectories), trajectories


def test_every_function_task_runs_the_candidate_with_the_one_shared_check():
    """The written function tasks each carry the check (a Harbor task is self-contained);
    a fix to it must reach them all and the generated ones alike."""

    def runner(test: str) -> list[str | None]:
        return [
            ast.get_source_segment(test, node)
            for node in ast.parse(test).body
            if isinstance(node, ast.FunctionDef) and node.name in ("unprivileged", "evaluate")
        ]

    shared = runner(FUNCTION_CHECK.read_text())
    assert len(shared) == 2
    tests = (test.read_text() for test in TASKS.glob("*/tests/test_task.py"))
    written = [test for test in tests if "def evaluate" in test]
    assert len(written) >= 20
    assert all(runner(test) == shared for test in written)


def test_a_generated_task_never_names_a_path_or_function_a_written_task_names(tmp_path):
    written = written_names()
    assert {"/app/notes.md", "/app/docs", "/app/deploy.yaml", "total", "welcome"} <= written

    def names(paths) -> set[str]:
        return set().union(*(named((p / "instruction.md").read_text()) for p in paths))

    every = list(KINDS)
    assert names(generate(200, seed=1, root=tmp_path / "drawn", kinds=every)) & written
    kept = generate(200, seed=1, root=tmp_path / "kept", kinds=every, avoid=written)
    assert not names(kept) & written
    env = coding(split="train", generated={"tasks": 200, "seed": 1})
    assert not names(env.runnable[name].path for name in generated(env)) & written


def test_the_generated_tasks_audit_clean(tmp_path):
    generate(len(KINDS), seed=0, root=tmp_path / "tasks", kinds=list(KINDS))
    out = tmp_path / "audit.json"
    result = reinforge_here("audit", str(tmp_path / "tasks"), "--json", str(out))
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
    written = coding(split="train")
    train = coding(split="train", generated={"tasks": 5})
    assert set(train.runnable) == set(written.runnable) | set(generated(train))
    assert len(generated(train)) == 5
    assert not generated(coding(split="all", tiers=["medium"], generated={"tasks": 5}))
    with pytest.raises(UsageError, match="generated tasks only join the train split"):
        coding(split="test", generated={"tasks": 5})
    with pytest.raises(UsageError, match="env.args.generated.tasks: Input should be greater"):
        coding(generated={"tasks": -1})


def test_generated_only_leaves_the_written_tasks_out():
    only = coding(split="train", tiers=["easy"], generated={"tasks": 5, "only": True})
    mixed = coding(split="train", tiers=["easy"], generated={"tasks": 5})
    assert sorted(only.runnable) == generated(mixed)
    with pytest.raises(UsageError, match="config env.args.generated.tasks: Field required"):
        coding(generated={"only": True})
    with pytest.raises(UsageError, match="config env.args.split: Input should be 'all'"):
        coding(split="held-out", generated={"tasks": 2, "only": True})


def test_generated_kinds_narrows_the_generated_tasks_to_those_named():
    train = coding(split="train", generated={"tasks": 6, "kinds": ["edit", "make-dir"]})
    kinds = [name.rsplit("-", 1)[0] for name in generated(train)]
    assert sorted(kinds) == ["generated-edit"] * 3 + ["generated-make-dir"] * 3
    drawn = coding(split="train", generated={"tasks": 2 * len(KINDS)})
    assert "generated-implement-described" not in {n.rsplit("-", 1)[0] for n in generated(drawn)}
    with pytest.raises(UsageError, match=r"kinds: unknown kinds \['paint'\]: name one or more"):
        coding(split="train", generated={"tasks": 2, "kinds": ["edit", "paint"]})
    with pytest.raises(UsageError, match="generated.kinds: List should have at least 1 item"):
        coding(split="train", generated={"tasks": 2, "kinds": []})


@pytest.mark.parametrize(
    ("args", "moved"),
    [
        ({"generated": 5}, "generated = N moved to generated.tasks = N"),
        ({"generated_seed": 1}, "generated_seed moved to generated.seed"),
        ({"generated_kinds": ["edit"]}, "generated_kinds moved to generated.kinds"),
        ({"generated_only": True}, "generated_only moved to generated.only"),
    ],
)
def test_the_generated_arguments_before_their_section_say_where_they_went(args, moved):
    with pytest.raises(UsageError, match=f"^config env.args: {moved}$"):
        coding(**args)
