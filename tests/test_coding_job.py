"""The agentic main job's parts on real sandboxes and the real tokenizer: the tiers and the
fixed train/test split of the coding set, oracle transcripts as SFT data, a run directory
as a model spec, and `examples/coding.toml` on the tiny model."""

from __future__ import annotations

import json
import shutil

import pytest

from reinforge.config import Config, load_config
from reinforge.envs.builtin.coding import TASKS
from reinforge.envs.config import EnvConfig
from reinforge.envs.registry import load_configured, load_environment
from reinforge.errors import UsageError
from reinforge.policy.models import load_tokenizer, model_folder
from reinforge.rollout.store import read_trajectories
from reinforge.sandbox.reaper import default_state_dir, owner_alive
from reinforge.train.config import SFTConfig
from reinforge.train.sft import load_data

from .commands import ROOT, reinforge_here
from .envs.scripted import ScriptedClient
from .test_sandbox_env import call

EASY = {
    p.name
    for p in TASKS.iterdir()
    if 'difficulty = "easy"' in (p / "task.toml").read_text(encoding="utf-8")
}


def test_the_split_is_fixed_and_disjoint_and_tiers_select_by_difficulty():
    train = load_environment(str(TASKS), tiers=["easy"], split="train")
    test = load_environment(str(TASKS), tiers=["easy"], split="test")
    assert set(train.runnable) | set(test.runnable) == EASY
    assert not set(train.runnable) & set(test.runnable)
    assert 0 < len(test.runnable) < len(train.runnable)
    again = load_environment(str(TASKS), split="test", test_fraction=0.25)
    assert set(test.runnable) <= set(again.runnable)  # a tier filter never moves a task
    whole = load_environment(str(TASKS))
    assert len(whole.runnable) > len(EASY)  # medium and hard tiers exist


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "dev"}, "config env.args.split: Input should be 'all', 'train' or 'test'"),
        ({"test_fraction": 1.0}, "config env.args.test_fraction: Input should be less than 1"),
        ({"tiers": ["impossible"]}, "no task of tiers ['impossible'] in split 'all'"),
    ],
)
def test_bad_selections_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_environment(str(TASKS), **kwargs)


def test_oracle_transcripts_are_tool_calls_that_render_as_sft_data(tmp_path):
    out = tmp_path / "oracle"
    result = reinforge_here(
        "eval", "coding", "--agent", "oracle", "--tasks", "3", "--env-arg", "split=train",
        "--env-arg", 'tiers=["easy"]', "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert len(trajectories) == 3 and all(t.reward == 1.0 for t in trajectories)
    looked = 0
    for trajectory in trajectories:
        system, user, *look, call, tool, answer = trajectory.messages
        assert system["role"] == "system" and "/app" in system["content"]
        task_dir = TASKS / trajectory.task_id
        if look:  # each file the instruction names that exists, read before the change
            reads, *reports = look
            paths = [json.loads(c["function"]["arguments"])["path"] for c in reads["tool_calls"]]
            assert all(f"`{path}`" in user["content"] for path in paths)
            for path, report in zip(paths, reports, strict=True):
                original = task_dir / "environment" / path.removeprefix("/app/")
                assert report["role"] == "tool" and report["content"] == original.read_text()
            looked += 1
        solve = (task_dir / "solution" / "solve.sh").read_text()
        (tool_call,) = call["tool_calls"]
        assert tool_call["function"]["name"] == "bash"
        command = json.loads(tool_call["function"]["arguments"])["command"]
        assert command == solve.split("\n", 1)[1]  # the script less its #! line
        assert tool["role"] == "tool" and tool["content"].startswith("[exit code 0]")
        assert answer["role"] == "assistant" and "tool_calls" not in answer
        assert [t["function"]["name"] for t in trajectory.tools] == [
            "bash", "read_file", "write_file", "edit",
        ]  # fmt: skip
    assert looked  # the first tasks of the split edit files they name

    tokenizer = load_tokenizer("tiny-random")
    examples = load_data(SFTConfig(data=[out], min_reward=1.0), tokenizer).examples
    assert len(examples) == 3 and all(e.rendered for e in examples)
    for example, trajectory in zip(examples, trajectories, strict=True):
        trained = tokenizer.decode(
            [t for t, m in zip(example.token_ids, example.loss_mask, strict=True) if m]
        )
        assert trained.startswith('<tool_call>\n{"name": "')
        assert '<tool_call>\n{"name": "bash", "arguments": {"command": ' in trained
        assert trained.endswith(trajectory.messages[-1]["content"] + "<|im_end|>")


@pytest.mark.parametrize(
    ("replies", "tool_format"),
    [
        ([call("bash", command="printf done > /app/notes.txt"), "Done."], 1.0),
        (
            [
                '<tool_call>\n{"name": "bash", "arguments": {"command": "a "b""}}\n</tool_call>',
                "Done.",
            ],
            0.0,
        ),
        ([call("bash", command="true"), call("no_such_tool"), "Done."], 0.0),
        (["Done, without a tool."], 0.0),
    ],
)
async def test_the_tool_format_term_pays_for_calls_that_all_parse(replies, tool_format):
    args = {"tiers": ["easy"], "split": "test", "format_weight": 0.25}
    env = load_configured(EnvConfig(name=str(TASKS), args=args, max_turns=3))
    (task,) = [t for t in env.tasks(len(env.runnable)) if t.id == "create-done-file"]
    try:
        episode = await env.rollout(ScriptedClient(replies), task)
        (score,) = await env.rubric.score([episode])
    finally:
        await env.aclose()
    assert score.rewards["tool_format"] == tool_format
    solved = 1.0 if tool_format else 0.0  # only the first script writes the file
    assert score.total == solved + 0.25 * tool_format


def test_a_run_directory_is_a_model_spec_for_its_last_checkpoint(tmp_path):
    tiny = model_folder("tiny-random")
    for step in ("step_00002", "step_00010"):
        shutil.copytree(tiny, tmp_path / "checkpoints" / step)
    (tmp_path / "config.json").write_text('{"run": {"name": "warm"}}')  # the run's config
    assert model_folder(str(tmp_path)) == tmp_path / "checkpoints" / "step_00010"
    assert load_tokenizer(str(tmp_path)).vocab_size == load_tokenizer("tiny-random").vocab_size
    with pytest.raises(UsageError, match="nor a run directory with checkpoints"):
        model_folder(str(tmp_path / "checkpoints"))


def test_the_agentic_main_job_trains_on_the_tiny_model_and_leaves_no_sandbox(tmp_path):
    """`reinforge train examples/coding.toml model.name=tiny-random run.steps=2`: every
    rollout gets a sandbox and a verifier sandbox, and none is left when the run ends."""
    state = default_state_dir()
    before = set(state.iterdir()) if state.is_dir() else set()
    result = reinforge_here(
        "train", "examples/coding.toml", "model.name=tiny-random", "run.steps=2",
        f"run.dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "coding"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    trajectories = read_trajectories(run / "trajectories" / "step_00001.jsonl")
    # the tiny model's groups all score alike, so each step also records the groups it set
    # aside for new tasks (`loop.uniform_redraws`)
    assert rows[0]["redrawn"] > 0
    rollout = load_config(Config, ROOT / "examples" / "coding.toml", []).rollout
    drawn_groups = rollout.tasks_per_step + rows[0]["redrawn"]
    assert len(trajectories) == rollout.rollouts_per_task * drawn_groups
    drawn = {t.info["harbor_task"] for t in trajectories}
    assert all(name in EASY or name.startswith("generated-") for name in drawn), drawn
    assert all(t.messages[0]["role"] == "system" for t in trajectories)
    # other runs on the host may hold sandboxes of their own: theirs have live owners
    left = (set(state.iterdir()) if state.is_dir() else set()) - before
    assert not [path for path in left if not owner_alive(path.name)], left
