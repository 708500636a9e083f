import random

import pytest

from reinforge.envs import Finished, load_environment
from reinforge.envs.builtin.tictactoe import (
    EMPTY,
    Board,
    best_moves,
    free_cells,
    opponent_move,
    outcome,
    parse_move,
    place,
    render,
    to_move,
    value,
    winner,
)
from reinforge.errors import UsageError
from reinforge.types import Message

from .scripted import ScriptedClient, episode_of


def board_of(rows: str) -> Board:
    """'XO.X.....' style, '.' for a free cell."""
    return tuple(" " if c == "." else c for c in rows)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("XXXOO....", "X"),
        ("XO.XO.X..", "X"),
        ("OX.XO.X.O", "O"),
        ("X.OXO.O..", "O"),
        ("XOXXOOOXX", None),
        (".........", None),
    ],
)
def test_winner(rows, expected):
    assert winner(board_of(rows)) == expected


def test_render_numbers_the_free_cells():
    assert render(board_of("X...O....")) == (
        " X | 2 | 3\n---+---+---\n 4 | O | 6\n---+---+---\n 7 | 8 | 9"
    )


def test_perfect_play_is_a_draw_and_minimax_takes_wins_and_blocks():
    assert value(EMPTY) == 0
    assert best_moves(board_of("XX.OO....")) == [3]  # X wins at once
    assert best_moves(board_of("XX..O....")) == [3]  # O must block
    assert best_moves(board_of("XX.O.....")) == [3]  # lost anyway, O still blocks


@pytest.mark.parametrize("minimax_mark", ["X", "O"])
def test_minimax_never_loses_to_random(minimax_mark):
    for game in range(40):
        board = EMPTY
        while winner(board) is None and free_cells(board):
            kind = "minimax" if to_move(board) == minimax_mark else "random"
            board = place(board, opponent_move(board, kind, game), to_move(board))
        assert winner(board) in (minimax_mark, None)


def test_opponent_is_deterministic_per_seed_and_position():
    board = board_of("X........")
    moves = {opponent_move(board, "random", 7) for _ in range(5)}
    assert len(moves) == 1
    assert len({opponent_move(board, "random", seed) for seed in range(30)}) > 1


@pytest.mark.parametrize(
    ("text", "move"),
    [("5", 5), ("I take cell 7.", 7), ("<think>maybe 1</think> 3", 3), ("center", None)],
)
def test_parse_move(text, move):
    assert parse_move(text) == move


def test_tasks():
    env = load_environment("tictactoe", play_as="alternate", opponent="minimax")
    tasks = env.tasks(6, seed=2)
    assert tasks == env.tasks(6, seed=2) and tasks != env.tasks(6, seed=3)
    assert [t.id for t in tasks] == [f"tictactoe-2-{i}" for i in range(6)]
    assert [t.info["mark"] for t in tasks] == ["X", "O"] * 3
    for task in tasks:
        opened = task.info["board"].count("X")
        assert opened == (task.info["mark"] == "O")
        assert f"You are {task.info['mark']}" in task.prompt[0]["content"]


def test_bad_knobs_are_usage_errors():
    with pytest.raises(UsageError, match="opponent"):
        load_environment("tictactoe", opponent="perfect")
    with pytest.raises(UsageError, match="play_as"):
        load_environment("tictactoe", play_as="Z")


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("1", "cell 1 is not a free cell"),
        ("10", "cell 10 is not a free cell"),
        ("the middle one", "no cell number in the reply"),
    ],
)
async def test_an_illegal_move_ends_the_game_at_zero(reply, reason):
    env = load_environment("tictactoe")
    task = env.tasks(1)[0]
    state = {**env.setup(task), "board": list(board_of("X...O...."))}
    episode = episode_of(task, reply, state=state)
    assert isinstance(await env.respond(episode), Finished)
    assert episode.state["outcome"] == "illegal" and episode.state["reason"] == reason
    assert outcome(episode) == 0.0


@pytest.mark.parametrize(
    ("result", "reward"),
    [("win", 1.0), ("draw", 0.5), ("loss", 0.0), ("illegal", 0.0), (None, 0.0)],
)
def test_outcome_reward(result, reward):
    task = load_environment("tictactoe").tasks(1)[0]
    assert outcome(episode_of(task, "5", state={"outcome": result})) == reward


def shown_board(messages: list[Message]) -> Board:
    """The board in the last user message, read back as the model would see it."""
    text = messages[-1]["content"]
    rows = [line for line in text.splitlines() if line.count("|") == 2]
    cells = [cell.strip() for row in rows for cell in row.split("|")]
    return tuple(cell if cell in "XO" else " " for cell in cells)


def minimax_player(messages: list[Message]) -> str:
    return f"I play {best_moves(shown_board(messages))[0]}."


async def test_rollout_perfect_agent_never_loses_to_random():
    env = load_environment("tictactoe", opponent="random", play_as="alternate")
    for task in env.tasks(8, seed=0):
        episode = await env.rollout(ScriptedClient(minimax_player), task)
        assert episode.state["outcome"] in ("win", "draw") and not episode.truncated
        final = tuple(episode.state["board"])
        assert winner(final) is not None or not free_cells(final)
        (scores,) = await env.rubric.score([episode])
        assert scores.total == outcome(episode)


async def test_rollout_random_agent_never_beats_minimax():
    env = load_environment("tictactoe", opponent="minimax", play_as="alternate")
    rng = random.Random(0)
    outcomes = []
    for task in env.tasks(10, seed=1):
        agent = ScriptedClient(lambda messages: str(rng.choice(free_cells(shown_board(messages)))))
        episode = await env.rollout(agent, task)
        outcomes.append(episode.state["outcome"])
        assert 1 <= episode.turns <= 5
    assert "win" not in outcomes and "loss" in outcomes


async def test_rollout_turns_show_the_opponent_reply():
    env = load_environment("tictactoe", opponent="minimax")
    task = env.tasks(1, seed=4)[0]
    client = ScriptedClient(minimax_player)
    episode = await env.rollout(client, task)
    feedback = [m["content"] for m in episode.messages[2:] if m["role"] == "user"]
    assert feedback and all(text.startswith("I played ") for text in feedback)
    assert episode.state["outcome"] == "draw"  # perfect against perfect
    assert len(episode.state["moves"]) == 9 and sorted(episode.state["moves"]) == list(range(1, 10))
