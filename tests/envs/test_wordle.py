import pytest

from reinforge.envs import Continue, Finished, load_environment
from reinforge.envs.builtin.wordle import WORDS, feedback, parse_guess, solved, speed

from .scripted import ScriptedClient, episode_of


@pytest.mark.parametrize(
    ("guess", "target", "marks"),
    [
        ("crane", "crane", "G G G G G"),
        ("crane", "moist", ". . . . ."),
        ("nacre", "crane", "Y Y Y Y G"),
        # repeated letters: greens are counted first, then yellows left to right
        ("bobby", "abbey", "Y . G . G"),  # 3rd B is green, 1st takes the one B left
        ("geese", "those", ". . . G G"),  # the only E is green; the others are gray
        ("eerie", "sheep", "Y Y . . ."),  # two Es in the target: two yellows, no third
        ("tatty", "toast", "G Y Y . ."),
        ("kebab", "abbey", ". Y G Y Y"),
        ("CRANE", "crane", "G G G G G"),
    ],
)
def test_feedback(guess, target, marks):
    assert feedback(guess, target) == marks


@pytest.mark.parametrize(
    ("text", "guess"),
    [
        ("crane", "crane"),
        ("SLATE", "slate"),
        ("crane.", "crane"),
        ("Guess: crane", "guess"),  # a known trap: "Guess" is a 5-letter word and comes first
        ("I pick stone", "stone"),
        ("<think>maybe plumb</think> irate", "irate"),
        ("no", None),
    ],
)
def test_parse_guess_takes_the_first_five_letter_word(text, guess):
    assert parse_guess(text) == guess


def test_word_list():
    assert len(WORDS) >= 300 and len(set(WORDS)) == len(WORDS)
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in WORDS)


def test_tasks_are_fixed_by_seed():
    env = load_environment("wordle")
    tasks = env.tasks(30, seed=9)
    assert tasks == env.tasks(30, seed=9) and tasks != env.tasks(30, seed=10)
    assert [t.id for t in tasks] == [f"wordle-9-{i}" for i in range(30)]
    assert all(t.answer in WORDS for t in tasks) and len({t.answer for t in tasks}) > 20
    assert all(t.answer not in t.prompt[0]["content"] for t in tasks)


async def test_invalid_reply_uses_a_guess_and_says_why():
    env = load_environment("wordle")
    task = env.tasks(1)[0]
    episode = episode_of(task, "ok", state=env.setup(task))
    step = await env.respond(episode)
    assert isinstance(step, Continue)
    assert "exactly 5 letters" in step.messages[0]["content"]
    assert "5 guesses left" in step.messages[0]["content"]
    assert episode.state["guesses"] == [None]


async def test_feedback_message_and_the_last_guess():
    env = load_environment("wordle", max_guesses=2)
    task = env.tasks(1)[0].model_copy(update={"answer": "crane"})
    episode = episode_of(task, "nacre", state=env.setup(task))
    step = await env.respond(episode)
    assert step == Continue([{"role": "user", "content": "N A C R E\nY Y Y Y G\n1 guess left."}])
    episode.messages.append({"role": "assistant", "content": "trace"})
    assert isinstance(await env.respond(episode), Finished)
    assert episode.state["solved"] is False and solved(episode) == speed(episode) == 0.0


@pytest.mark.parametrize(("guesses", "bonus"), [(1, 1.0), (3, 4 / 6), (6, 1 / 6)])
def test_speed(guesses, bonus):
    task = load_environment("wordle").tasks(1)[0]
    state = {"solved": True, "max_guesses": 6, "guesses": ["x"] * guesses}
    assert speed(episode_of(task, "x", state=state)) == pytest.approx(bonus)


async def test_rollout_solves_on_the_third_guess():
    env = load_environment("wordle")
    task = env.tasks(1, seed=2)[0]
    client = ScriptedClient(["hm", "Hello", task.answer.upper()])
    episode = await env.rollout(client, task)
    assert episode.turns == 3 and not episode.truncated
    assert episode.state["guesses"] == [None, "hello", task.answer]
    (scores,) = await env.rubric.score([episode])
    assert scores.rewards == {"solved": 1.0, "speed": pytest.approx(4 / 6)}
    assert scores.total >= env.rubric.pass_threshold


async def test_rollout_out_of_guesses():
    env = load_environment("wordle")
    task = env.tasks(1, seed=2)[0]
    wrong = next(w for w in WORDS if w != task.answer)
    episode = await env.rollout(ScriptedClient([wrong] * 6), task)
    assert episode.turns == 6 and not episode.truncated and not episode.state["solved"]
    (scores,) = await env.rubric.score([episode])
    assert scores.total == 0.0
    assert episode.state["feedback"] == [feedback(wrong, task.answer)] * 6
