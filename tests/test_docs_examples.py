"""The environments of docs/environments.md and README.md, and the SFT data of docs/sft.md,
as a user meets them.

The doc quotes the example files byte for byte; each example, loaded through the registry
as `reinforge eval PATH` loads it, plays whole episodes from a script (no model) to the
reward and status the doc promises; the multi-turn one runs through the real CLI; and the
hand-written SFT data is kept and rendered as the doc says.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from reinforge.commands.config_args import key_values
from reinforge.envs import Environment, Episode, Reward, Rubric
from reinforge.envs.config import EnvConfig
from reinforge.envs.registry import load_configured, load_environment
from reinforge.errors import UsageError
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_group
from reinforge.types import Status, Task, Trajectory

from .commands import ROOT, reinforge_here
from .envs.scripted import Script, ScriptedClient

DOC = ROOT / "docs" / "environments.md"
README = ROOT / "README.md"
REVERSE = str(ROOT / "examples" / "reverse_env.py")
GUESS = str(ROOT / "examples" / "guess_env.py")

# A fenced block quoting a file: a line "`examples/NAME.py`:", then ```python ... ```.
QUOTED_FILE = re.compile(
    r"^`(examples/[\w./-]+)`:\n\n?```python\n(.*?)^```$", re.MULTILINE | re.DOTALL
)


class _EpisodeScript(ScriptedClient):
    """A ScriptedClient with the bookkeeping the rollout generator reads from its client."""

    generate_s = 0.0
    turns_s: tuple[float, ...] = ()
    loop_stops = 0

    @property
    def turns(self) -> list[Any]:
        return self.prompts

    def token_record(self) -> tuple[list[int], list[int], list[float], list[int]]:
        return [], [], [], []


class ScriptedPolicy:
    """Stands in for the policy client: every rollout plays `script`."""

    def __init__(self, script: list[str | Script]) -> None:
        self.script = script

    def episode(self, max_total_tokens: int | None, seed: int | None) -> _EpisodeScript:
        return _EpisodeScript(self.script)


async def play(env: Environment, task: Task, script: list[str | Script]) -> Trajectory:
    """One rollout of `task` through the generator that eval and training use: the status
    and reward are the ones a real run would record."""
    group = await generate_group(
        env, task, ScriptedPolicy(script), RolloutConfig(), 1, None, asyncio.Semaphore(1)
    )
    (trajectory,) = group.trajectories
    return trajectory


def compare(number: Any) -> str:
    payload = {"name": "compare", "arguments": {"number": number}}
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


# --- the doc and the files ---------------------------------------------------------------


def test_the_doc_quotes_the_example_files_exactly():
    quoted = QUOTED_FILE.findall(DOC.read_text(encoding="utf-8"))
    assert sorted(path for path, _ in quoted) == [
        "examples/guess_env.py",
        "examples/reverse_env.py",
    ]
    for path, code in quoted:
        assert code == (ROOT / path).read_text(encoding="utf-8"), f"{path} differs from the doc"


async def test_readme_minimal_example_plays_an_episode(tmp_path):
    section = README.read_text(encoding="utf-8").split("## Writing an environment", 1)[1]
    section = section.split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None and "docs/environments.md" in section
    path = tmp_path / "echo_env.py"
    path.write_text(code.group(1), encoding="utf-8")
    env = load_environment(str(path))
    task = env.tasks(1, seed=3)[0]
    assert env.tasks(1, seed=3) == [task]
    right = await play(env, task, [f"{task.answer.capitalize()}."])
    assert (right.status, right.reward) == (Status.OK, 1.0)


# --- examples/reverse_env.py: single turn -------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "rewards", "total"),
    [
        ("<answer>{}</answer>", {"reversed_correctly": 1.0, "used_answer_tags": 1.0}, 1.1),
        ("{}", {"reversed_correctly": 1.0, "used_answer_tags": 0.0}, 1.0),
        ("<answer>nope</answer>", {"reversed_correctly": 0.0, "used_answer_tags": 1.0}, 0.1),
    ],
)
async def test_reverse_scores_one_reply(reply, rewards, total):
    env = load_environment(REVERSE)
    task = env.tasks(1, seed=0)[0]
    trajectory = await play(env, task, [reply.format(task.answer)])
    assert trajectory.status == Status.OK and trajectory.turns == 1
    assert trajectory.rewards == rewards and trajectory.reward == pytest.approx(total)


# --- examples/guess_env.py: multi-turn with a tool ----------------------------------------


async def test_guess_compare_then_the_right_answer():
    env = load_environment(GUESS)
    task = env.tasks(1, seed=0)[0]
    secret = task.answer
    trajectory = await play(env, task, [compare(secret), f"<answer>{secret}</answer>"])
    assert trajectory.status == Status.OK and trajectory.turns == 2
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[2]["content"] == f"{secret} is the secret number."
    assert trajectory.rewards == {"found": 1.0, "first_try": 1.0}
    assert trajectory.reward == pytest.approx(1.2)
    assert trajectory.info == {"compared": [secret], "answers": [secret], "solved": True}


async def test_guess_the_episode_shown_in_the_doc():
    """The transcript of docs/environments.md: a tool error goes back to the model and is
    counted, a wrong answer gets feedback, the right one finishes."""
    env = load_environment(GUESS)
    task = env.tasks(1)[0].model_copy(update={"answer": 31})
    script = [compare(50), compare("fifty"), "<answer>25</answer>", "<answer>31</answer>"]
    trajectory = await play(env, task, script)
    assert trajectory.status == Status.OK and trajectory.turns == 4
    assert trajectory.tool_errors == 1
    contents = [(m["role"], m["content"]) for m in trajectory.messages]
    assert contents[2] == ("tool", "The secret number is lower than 50.")
    assert contents[4][0] == "tool"
    assert contents[4][1].startswith("Error: invalid arguments for compare: 1 validation error")
    assert contents[5:] == [
        ("assistant", "<answer>25</answer>"),
        ("user", "25 is wrong. Tries left: 2."),
        ("assistant", "<answer>31</answer>"),
    ]
    assert trajectory.rewards == {"found": 1.0, "first_try": 0.0} and trajectory.reward == 1.0
    assert trajectory.info == {"compared": [50], "answers": [25, 31], "solved": True}


async def test_guess_out_of_tries_is_finished_and_scores_zero():
    env = load_environment(GUESS, high=10, tries=2)
    task = env.tasks(1, seed=2)[0]
    wrong = task.answer % 10 + 1
    trajectory = await play(env, task, [f"<answer>{wrong}</answer>"] * 2)
    assert (trajectory.status, trajectory.reward, trajectory.turns) == (Status.OK, 0.0, 2)


async def test_guess_never_answering_ends_truncated_and_is_still_scored():
    env = load_configured(EnvConfig(name=GUESS, max_turns=3))
    task = env.tasks(1)[0]
    trajectory = await play(env, task, ["I do not know."] * 3)
    assert (trajectory.status, trajectory.reward, trajectory.turns) == (Status.TRUNCATED, 0.0, 3)
    assert trajectory.messages[-1] == {"role": "user", "content": "Answer as <answer>N</answer>."}


def broken(episode: Episode) -> float:
    return 1 / 0


async def test_a_reward_that_raises_makes_the_rollout_an_error_with_file_and_line():
    env = load_environment(GUESS)
    env.rubric = Rubric(Reward(broken))
    task = env.tasks(1)[0]
    trajectory = await play(env, task, [f"<answer>{task.answer}</answer>"])
    assert trajectory.status == Status.ERROR
    assert trajectory.reward is None and trajectory.rewards == {}
    assert trajectory.error.startswith("reward 'broken' raised ZeroDivisionError: division by zero")
    assert f"({__file__}:" in trajectory.error
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant"]  # kept


# --- loader arguments ---------------------------------------------------------------------


def test_loader_arguments_and_how_env_args_are_parsed():
    args = key_values(
        ["high=10", "tries=2", 'label="a b"', "note=plain text", "on=true", "xs=[1, 2]"],
        "env.args",
        "--env-arg",
    )
    assert args == {
        "env.args.high": 10,
        "env.args.tries": 2,
        "env.args.label": "a b",
        "env.args.note": "plain text",
        "env.args.on": True,
        "env.args.xs": [1, 2],
    }
    env = load_environment(GUESS, high=10, tries=2)
    assert all(1 <= t.answer <= 10 for t in env.tasks(30))
    assert "You have 2 tries." in env.tasks(1)[0].prompt[0]["content"]
    with pytest.raises(UsageError, match="^config env.args.high: Input should be greater"):
        load_environment(GUESS, high=1)
    with pytest.raises(UsageError, match="^config env.args.bogus: unknown key$"):
        load_environment(GUESS, bogus=1)
    with pytest.raises(UsageError, match="^config env.args.max_turns: moved to env.max_turns$"):
        load_environment(GUESS, max_turns=3)


# --- the real CLI -------------------------------------------------------------------------


def test_guess_env_runs_under_reinforge_eval(tmp_path):
    """The real command on the tiny random model (noise for replies): the file loads,
    `--max-turns` reaches the harness, every episode plays and is scored."""
    out = tmp_path / "eval"
    result = reinforge_here(
        "eval",
        "examples/guess_env.py",
        "--model",
        "tiny-random",
        "--tasks",
        "2",
        "--max-turns",
        "3",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"] == "guess-number"
    assert (summary["rollouts"], summary["errored"]) == (2, 0)
    assert set(summary["status"]) <= {"ok", "truncated"} and summary["turns_mean"] <= 3
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        assert set(json.loads(line)["info"]) == {"compared", "answers", "solved"}


# --- docs/sft.md: the data format ----------------------------------------------------------


SFT_DOC = ROOT / "docs" / "sft.md"


@pytest.mark.parametrize(
    ("overrides", "kept"),
    [
        ({"min_reward": 1.0}, ["add-1", "notes"]),
        ({}, ["add-1", "add-2", "notes", "say-hi"]),
        ({"statuses": ["ok", "truncated"]}, ["add-1", "add-2", "add-3", "notes", "say-hi"]),
    ],
)
def test_sft_doc_example_data_is_read_as_the_doc_says(tmp_path, overrides, kept):
    """The hand-written JSONL of docs/sft.md, through the loader `reinforge sft` uses: the
    filters keep what the doc says, every kept line is rendered from its messages, and the
    tool call is trained as the template's `<tool_call>` block."""
    from reinforge.policy.models import load_tokenizer
    from reinforge.train.config import SFTConfig
    from reinforge.train.sft import load_data

    block = re.search(r"```jsonl\n(.*?)```", SFT_DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert block is not None and len(block.group(1).splitlines()) == 5
    data_file = tmp_path / "data.jsonl"
    data_file.write_text(block.group(1), encoding="utf-8")
    tokenizer = load_tokenizer("tiny-random")
    data = load_data(SFTConfig(data=[data_file], **overrides), tokenizer)
    assert data.read == 5 and data.rendered == len(kept)
    names = [example.name.split("#")[0].removeprefix("trajectory ") for example in data.examples]
    assert names == kept
    (notes,) = [e for e in data.examples if e.name.startswith("trajectory notes#")]
    trained_ids = [t for t, m in zip(notes.token_ids, notes.loss_mask, strict=True) if m]
    trained = tokenizer.decode(trained_ids)
    assert trained.startswith("<tool_call>\n") and trained.endswith("It says hello.<|im_end|>")
