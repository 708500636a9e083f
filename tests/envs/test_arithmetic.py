import re

import pytest

from reinforge.envs import load_environment
from reinforge.envs.builtin.arithmetic import correct, format_reward
from reinforge.envs.builtin.calculator import evaluate
from reinforge.errors import UsageError

from .scripted import ScriptedClient, episode_of


def test_tasks_are_fixed_by_seed():
    env = load_environment("arithmetic")
    assert env.tasks(20, seed=3) == env.tasks(20, seed=3)
    assert env.tasks(20, seed=3) != env.tasks(20, seed=4)
    ids = [t.id for t in env.tasks(20, seed=3)]
    assert ids[0] == "arithmetic-3-0" and len(set(ids)) == 20


def test_level_one_is_the_trl_baseline_prompt():
    for task in load_environment("arithmetic").tasks(50, seed=0):
        (message,) = task.prompt
        match = re.fullmatch(
            r"What is (\d+) ([+-]) (\d+)\? Answer with just the number\.", message["content"]
        )
        assert message["role"] == "user" and match
        assert int(match[1]) <= 99 and int(match[3]) <= 99


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_answers_match_the_expression(difficulty):
    for task in load_environment("arithmetic", difficulty=difficulty).tasks(50, seed=1):
        assert task.answer == evaluate(task.info["expression"])  # precedence at level 4


def test_higher_levels_are_harder():
    expressions = [
        t.info["expression"] for t in load_environment("arithmetic", difficulty=4).tasks(30, seed=0)
    ]
    assert all(len(e.split()) == 5 for e in expressions)
    level_3 = [
        t.info["expression"] for t in load_environment("arithmetic", difficulty=3).tasks(60, seed=0)
    ]
    assert any(re.search(r"\d{3}", e) for e in level_3) and any("*" in e for e in level_3)


@pytest.mark.parametrize(
    ("text", "right", "bare"),
    [
        ("85", 1, 1),
        ("85.", 1, 1),
        ("37 + 48 = 85", 1, 0),
        ("The answer is 85, I think.", 1, 0),
        ("<think>37 + 48</think>85", 1, 1),
        ("84", 0, 1),
        ("eighty-five", 0, 0),
        ("", 0, 0),
    ],
)
def test_rewards(text, right, bare):
    task = load_environment("arithmetic").tasks(1)[0].model_copy(update={"answer": 85})
    episode = episode_of(task, text)
    assert (correct(episode), format_reward(episode)) == (right, bare)


def test_negative_answers_count():
    task = load_environment("arithmetic").tasks(1)[0].model_copy(update={"answer": -11})
    assert correct(episode_of(task, "-11")) == 1.0


def test_system_prompt_knob():
    env = load_environment("arithmetic")
    task = env.tasks(1)[0]
    assert [m["role"] for m in env.harness.initial_messages(task)] == ["user"]
    custom = load_environment("arithmetic", system_prompt="Be brief.")
    assert custom.harness.initial_messages(task)[0] == {"role": "system", "content": "Be brief."}


def test_bad_difficulty_is_a_usage_error():
    with pytest.raises(UsageError, match="difficulty"):
        load_environment("arithmetic", difficulty=7)


async def test_rollout_scores_a_right_answer():
    env = load_environment("arithmetic", difficulty=2)
    task = env.tasks(1, seed=5)[0]
    client = ScriptedClient([str(task.answer)])
    right = await env.rollout(client, task)
    assert client.prompts == [task.prompt]  # no system prompt: the template's default applies
    wrong = await env.rollout(ScriptedClient([f"It is {task.answer + 1}"]), task)
    scores = await env.rubric.score([right, wrong])
    assert scores[0].rewards == {"correct": 1.0, "format": 1.0}
    assert scores[0].total == pytest.approx(1.1) and scores[0].total >= env.rubric.pass_threshold
    assert scores[1].total == 0.0
    assert right.turns == 1 and not right.truncated
