"""Tic-tac-toe against a random or a minimax-optimal opponent: a small multi-turn game.

The board travels in `episode.state`; each agent turn is answered with the opponent's
move and the new board. The opponent's choices are random only among its candidate moves
and are seeded by the task and the position, so every rollout of a task meets the same
opponent and a replay is exact, with no generator to keep in the (JSON) state.
"""

from __future__ import annotations

import random
import re
from functools import cache
from typing import Any, Literal

from reinforge.envs.environment import Continue, Environment, Finished, Harness, Step
from reinforge.envs.episode import Episode
from reinforge.envs.parsers import strip_think
from reinforge.envs.rubric import Reward, Rubric
from reinforge.types import Section, Task

Board = tuple[str, ...]
"""Nine cells, row by row, each "X", "O" or " "."""

EMPTY: Board = (" ",) * 9
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
Opponent = Literal["random", "minimax"]
PlayAs = Literal["X", "O", "alternate"]
OUTCOME_REWARD = {"win": 1.0, "draw": 0.5, "loss": 0.0, "illegal": 0.0}
_INTEGER = re.compile(r"\d+")


def winner(board: Board) -> str | None:
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return None


def free_cells(board: Board) -> list[int]:
    """Free cells as the 1-9 numbers the player sees."""
    return [i + 1 for i, cell in enumerate(board) if cell == " "]


def place(board: Board, cell: int, mark: str) -> Board:
    return board[: cell - 1] + (mark,) + board[cell:]


def other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def to_move(board: Board) -> str:
    return "X" if board.count("X") == board.count("O") else "O"


@cache
def value(board: Board) -> int:
    """The game's value for the player to move under perfect play: positive a win, 0 a draw,
    negative a loss, larger the sooner, so a lost player still blocks and a winner finishes."""
    cells = free_cells(board)
    if winner(board) is not None:
        return -(1 + len(cells))  # the previous player just won
    if not cells:
        return 0
    mark = to_move(board)
    return max(-value(place(board, cell, mark)) for cell in cells)


def best_moves(board: Board) -> list[int]:
    mark = to_move(board)
    return [c for c in free_cells(board) if -value(place(board, c, mark)) == value(board)]


def opponent_move(board: Board, opponent: Opponent, seed: int) -> int:
    """Random among the opponent's candidates, seeded by task and position."""
    candidates = best_moves(board) if opponent == "minimax" else free_cells(board)
    return random.Random(f"{seed}:{''.join(board)}").choice(candidates)


def parse_move(text: str) -> int | None:
    """The first number written: forgiving of prose, yet listing every cell is no hedge."""
    found = _INTEGER.search(strip_think(text))
    return int(found.group()) if found else None


def render(board: Board) -> str:
    """Free cells show their number, so the move to type is on the board."""
    rows = []
    for r in range(3):
        cells = [
            board[3 * r + i] if board[3 * r + i] != " " else str(3 * r + i + 1) for i in range(3)
        ]
        rows.append(" " + " | ".join(cells))
    return "\n---+---+---\n".join(rows)


def opening(mark: str, board: Board) -> str:
    first = "You move first." if mark == "X" else "I played first."
    return (
        f"Let's play tic-tac-toe. You are {mark}. {first} "
        f"The free cells show their numbers.\n\n{render(board)}\n\n"
        "Your move: reply with the number of a free cell."
    )


def outcome(episode: Episode) -> float:
    """Win 1, draw 0.5; a loss, an illegal move or an unfinished game 0."""
    return OUTCOME_REWARD.get(episode.state.get("outcome") or "", 0.0)


class TicTacToe(Environment):
    name = "tictactoe"

    def __init__(
        self, opponent: Opponent, play_as: PlayAs, harness: Harness, rubric: Rubric
    ) -> None:
        super().__init__(harness, rubric)
        self.opponent = opponent
        self.play_as = play_as

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            mark = self.play_as if self.play_as != "alternate" else "XO"[i % 2]
            game_seed = rng.getrandbits(32)
            board = (
                EMPTY
                if mark == "X"
                else place(EMPTY, opponent_move(EMPTY, self.opponent, game_seed), "X")
            )
            tasks.append(
                Task(
                    id=f"tictactoe-{seed}-{i}",
                    prompt=[{"role": "user", "content": opening(mark, board)}],
                    info={
                        "mark": mark,
                        "seed": game_seed,
                        "board": list(board),
                        "opponent": self.opponent,
                    },
                )
            )
        return tasks

    def setup(self, task: Task) -> dict[str, Any]:
        """`moves`: the cells played in this episode, the agent's and the opponent's in turn."""
        return {
            "board": list(task.info["board"]),
            "mark": task.info["mark"],
            "moves": [],
            "outcome": None,
            "reason": None,
        }

    async def respond(self, episode: Episode) -> Step:
        state = episode.state
        board: Board = tuple(state["board"])
        mark = state["mark"]
        cell = parse_move(episode.completion)
        if cell is None or cell not in free_cells(board):
            state["outcome"] = "illegal"
            state["reason"] = (
                "no cell number in the reply" if cell is None else f"cell {cell} is not a free cell"
            )
            return Finished()
        board = place(board, cell, mark)
        state["moves"].append(cell)
        reply = None
        if not self._over(state, board):
            reply = opponent_move(board, self.opponent, episode.task.info["seed"])
            board = place(board, reply, other(mark))
            state["moves"].append(reply)
            self._over(state, board)
        state["board"] = list(board)
        if state["outcome"] is not None:
            return Finished()
        feedback = f"I played {reply}.\n\n{render(board)}\n\nYour move:"
        return Continue([{"role": "user", "content": feedback}])

    @staticmethod
    def _over(state: dict[str, Any], board: Board) -> bool:
        """Record the outcome from the agent's side if the game has ended."""
        won = winner(board)
        if won is not None:
            state["outcome"] = "win" if won == state["mark"] else "loss"
        elif not free_cells(board):
            state["outcome"] = "draw"
        return state["outcome"] is not None


class Args(Section):
    opponent: Opponent = "random"
    """random: any free cell; minimax: a best move, random among equally good ones."""
    play_as: PlayAs = "X"
    """The agent's mark; alternate gives even-numbered tasks X and odd-numbered ones O."""
    system_prompt: str | None = None
    """None leaves the chat template's own default system prompt."""


def load_environment(args: Args) -> TicTacToe:
    # X moves at most 5 times and O 4, and the game answers Finished on its last move
    harness = Harness(system_prompt=args.system_prompt, max_turns=5, max_tokens_per_turn=48)
    rubric = Rubric(Reward(outcome), pass_threshold=1.0)
    return TicTacToe(args.opponent, args.play_as, harness, rubric)
