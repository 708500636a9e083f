"""Wordle: guess a hidden 5-letter word in six tries, with per-letter feedback each turn.

A guess is any 5 letters, not only a listed word, so the small list of targets never
rejects a real English word; a reply with no 5-letter word is invalid, told why, and still
uses up a guess (otherwise stalling would be free).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

from pydantic import Field

from reinforge.envs.environment import Continue, Environment, Finished, Harness, Step
from reinforge.envs.episode import Episode
from reinforge.envs.parsers import strip_think
from reinforge.envs.rubric import Reward, Rubric
from reinforge.types import Section, Task

WORDS = tuple(
    """
about above actor acute adult after again agent agree ahead alarm album alert alike alive allow
alone along alter among angel anger angle angry apart apple apply arena argue arise array aside
asset audio avoid award aware badly baker basic basis beach begin being below bench birth black
blade blame blank blind block blood board boost booth bound brain brand bread break breed brief
bring broad brown build built buyer cabin cable candy carry catch cause chain chair chart chase
cheap check chest chief child chose civil claim class clean clear click climb clock close cloud
coach coast could count court cover craft crash cream crime cross crowd crown curve cycle daily
dance dated dealt death delay depth dirty doubt dozen draft drama drawn dream dress drink drive
drove dying eager early earth eight elite empty enemy enjoy enter entry equal error event every
exact exist extra faith false fault fiber field fifth fifty fight final first fixed flash fleet
floor fluid focus force forth forty forum found frame frank fresh front fruit fully funny giant
given glass globe grace grade grand grant grass great green gross group grown guard guess guest
guide happy heart heavy horse hotel house human ideal image index inner input issue joint judge
knife known label large laser later laugh layer learn lease least leave legal lemon level light
limit local logic loose lower lucky lunch magic major maker march match maybe mayor meant media
metal might minor minus mixed model money month moral motor mount mouse mouth movie music never
newly night noise north novel nurse occur ocean offer often order other outer owner paint panel
paper party peace phase phone photo piano piece pilot pitch place plain plane plant plate point
pound power press price pride prime print prior prize proof proud prove queen quick quiet quite
radio raise range rapid ratio reach ready refer right river robot rough round route royal rural
scale scene scope score sense serve seven shall shape share sharp sheep sheet shelf shell shift
shirt shock shoot short shown sight since sixth sixty skill sleep slide small smart smile smoke
solid solve sorry sound south space spare speak speed spend spent split sport staff stage stand
start state steam steel stick still stock stone stood store storm story strip stuck study stuff
style sugar suite super sweet table taken taste teach teeth thank theme there thick thing think
third those three threw throw tight timer title today topic total touch tower track trade train
treat trend trial tried truck truly trust truth twice under union unity until upper upset urban
usage usual valid value video visit vital voice waste watch water wheel where which while white
whole whose woman women world worry worse worst worth would wound write wrong wrote young youth
""".split()
)
"""Common English words, the hidden targets."""

GREEN, YELLOW, GRAY = "G", "Y", "."
_WORD = re.compile(r"\b[a-zA-Z]{5}\b")
_RULES = (
    "Let's play Wordle. Guess my secret 5-letter English word in {guesses} tries.\n"
    "After each guess I show one mark per letter: G = right letter, right place; "
    "Y = in the word, wrong place; . = not in the word.\n"
    "Reply with one 5-letter word."
)


def feedback(guess: str, target: str) -> str:
    """Marks as Wordle gives them: a repeated letter is yellow only as often as the target
    still holds it after the greens are counted."""
    guess, target = guess.lower(), target.lower()
    marks = [GREEN if g == t else GRAY for g, t in zip(guess, target, strict=True)]
    unmatched = Counter(t for t, mark in zip(target, marks, strict=True) if mark != GREEN)
    for i, letter in enumerate(guess):
        if marks[i] == GRAY and unmatched[letter] > 0:
            marks[i] = YELLOW
            unmatched[letter] -= 1
    return " ".join(marks)


def parse_guess(text: str) -> str | None:
    """The first 5-letter word in the reply, so "CRANE" and "crane." both count."""
    found = _WORD.search(strip_think(text))
    return found.group().lower() if found else None


def solved(episode: Episode) -> float:
    return float(episode.state.get("solved", False))


def speed(episode: Episode) -> float:
    """1 for a first-guess solve down to 1/max for the last guess: rewards using the
    feedback well rather than guessing on."""
    if not episode.state.get("solved"):
        return 0.0
    limit = episode.state["max_guesses"]
    return (limit + 1 - len(episode.state["guesses"])) / limit


class Wordle(Environment):
    name = "wordle"

    def __init__(self, max_guesses: int, harness: Harness, rubric: Rubric) -> None:
        super().__init__(harness, rubric)
        self.max_guesses = max_guesses

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        prompt = _RULES.format(guesses=self.max_guesses)
        return [
            Task(
                id=f"wordle-{seed}-{i}",
                prompt=[{"role": "user", "content": prompt}],
                answer=rng.choice(WORDS),
            )
            for i in range(n)
        ]

    def setup(self, task: Task) -> dict[str, Any]:
        """`guesses` holds every reply's guess (None when invalid), `feedback` its marks."""
        return {
            "target": task.answer,
            "max_guesses": self.max_guesses,
            "guesses": [],
            "feedback": [],
            "solved": False,
        }

    async def respond(self, episode: Episode) -> Step:
        state = episode.state
        guess = parse_guess(episode.completion)
        state["guesses"].append(guess)
        if guess is None:
            state["feedback"].append(None)
            message = "That is not a guess: reply with one word of exactly 5 letters."
        else:
            marks = feedback(guess, state["target"])
            state["feedback"].append(marks)
            state["solved"] = guess == state["target"]
            message = f"{' '.join(guess.upper())}\n{marks}"
        left = self.max_guesses - len(state["guesses"])
        if state["solved"] or left == 0:
            return Finished()
        plural = "guess" if left == 1 else "guesses"
        return Continue([{"role": "user", "content": f"{message}\n{left} {plural} left."}])


class Args(Section):
    max_guesses: int = Field(6, ge=1)
    """Guesses per game, and the turns of the harness: a game ends at the last one."""
    speed_weight: float = 0.2
    """Weight of the `speed` term: 1 for a first-guess solve down to 1/max_guesses."""
    system_prompt: str | None = None
    """None leaves the chat template's own default system prompt."""


def load_environment(args: Args) -> Wordle:
    harness = Harness(
        system_prompt=args.system_prompt, max_turns=args.max_guesses, max_tokens_per_turn=48
    )
    rubric = Rubric(Reward(solved, 1.0), Reward(speed, args.speed_weight), pass_threshold=1.0)
    return Wordle(args.max_guesses, harness, rubric)
