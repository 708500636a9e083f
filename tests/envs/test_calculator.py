import json

import pytest

from reinforge.envs import Tool, load_environment
from reinforge.envs.builtin.calculator import calculate, correct, evaluate, final_number, used_tool
from reinforge.envs.config import EnvConfig
from reinforge.envs.registry import load_configured
from reinforge.types import Message

from .scripted import ScriptedClient, episode_of


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 ** 3 ** 2", 512),  # right-associative
        ("-3 ** 2", -9),  # ** binds tighter than unary minus
        ("10 - 4 - 3", 3),  # left-associative
        ("7 / 2", 3.5),
        ("1.5 * 2", 3.0),
        ("+5 - -5", 10),
        (" 17*23 ", 391),
    ],
)
def test_evaluate(expression, result):
    assert evaluate(expression) == result


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "x + 1",
        "(1).real",
        "abs(-1)",
        "True + 1",
        "'a' * 3",
        "[1, 2]",
        "1 if 1 else 2",
        "(lambda: 1)()",
        "7 // 2",
        "7 % 2",
        "2 +",
        "9 ** 9 ** 9",
        "10.0 ** 400",
        "(-8) ** 0.5",
        "1" * 201,
    ],
)
def test_evaluate_rejects_everything_else(expression):
    with pytest.raises(ValueError):
        evaluate(expression)


@pytest.mark.parametrize(
    ("expression", "shown"),
    [("17 * 23", "391"), ("6 / 3", "2"), ("1 / 4", "0.25"), ("2 / 3", "0.6666666667")],
)
def test_calculate_shows_whole_numbers_without_a_point(expression, shown):
    assert calculate(expression) == shown


async def test_the_tool_turns_bad_input_into_error_results():
    tool = Tool(calculate)
    assert (await tool.call({"expression": "2 * 21"})).content == "42"
    for expression in ["__import__('os')", "1 / 0"]:
        result = await tool.call(json.dumps({"expression": expression}))
        assert result.error and result.content.startswith("Error:")


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("<answer>391</answer>", 391),
        ("So it is 391 pencils.", 391),
        ("<answer>1,680</answer> (I used 1680 / 2 = 840)", 1680),
        ("<answer>391.0</answer>", 391),
        ("<answer>-5</answer>", -5),
        ("no idea", None),
    ],
)
def test_final_number(text, number):
    assert final_number(text) == number


def test_tasks_are_fixed_by_seed():
    env = load_environment("calculator")
    tasks = env.tasks(40, seed=1)
    assert tasks == env.tasks(40, seed=1) and tasks != env.tasks(40, seed=2)
    assert [t.id for t in tasks] == [f"calculator-1-{i}" for i in range(40)]
    assert all(isinstance(t.answer, int) and t.answer > 0 for t in tasks)
    assert len({t.info["problem"] for t in tasks}) == 6


def tool_call(expression: str) -> str:
    payload = {"name": "calculate", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


def answer_with_last_tool_result(messages: list[Message]) -> str:
    return f"<answer>{messages[-1]['content']}</answer>"


async def test_rollout_with_a_tool_call_then_an_answer():
    env = load_environment("calculator")
    task = env.tasks(1, seed=0)[0]
    answer = f"The answer is <answer>{task.answer}</answer>"
    episode = await env.rollout(ScriptedClient([tool_call("1 + 1"), answer]), task)
    assert [m["role"] for m in episode.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert episode.messages[3]["content"] == "2" and episode.messages[3]["name"] == "calculate"
    assert (episode.tool_calls, episode.tool_errors, episode.turns) == (1, 0, 2)
    (scores,) = await env.rubric.score([episode])
    assert scores.rewards == {"correct": 1.0, "used_tool": 1.0}
    assert scores.total == pytest.approx(1.1)


async def test_rollout_reports_a_hostile_expression_to_the_model():
    env = load_environment("calculator")
    task = env.tasks(1, seed=3)[0]
    client = ScriptedClient(
        [
            tool_call("__import__('os').system('true')"),
            tool_call("6*7"),
            answer_with_last_tool_result,
        ]
    )
    episode = await env.rollout(client, task)
    assert episode.messages[3]["content"].startswith("Error:")
    assert (episode.tool_calls, episode.tool_errors) == (2, 1)
    assert episode.completion == "<answer>42</answer>"
    assert used_tool(episode) == 1.0


async def test_an_episode_that_never_answers_scores_zero():
    env = load_configured(EnvConfig(name="calculator", max_turns=2))
    task = env.tasks(1, seed=0)[0]
    episode = await env.rollout(ScriptedClient([tool_call(str(task.answer))] * 2), task)
    assert episode.truncated and episode.messages[-1]["role"] == "tool"
    assert correct(episode) == 0.0


def test_correct_reads_the_final_message():
    task = load_environment("calculator").tasks(1)[0]
    assert correct(episode_of(task, f"<answer>{task.answer}</answer>")) == 1.0
    assert correct(episode_of(task, f"<answer>{task.answer + 1}</answer> {task.answer}")) == 0.0
