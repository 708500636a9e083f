"""The doom-loop rule on hand-worked sequences (words stand in for tokens), its rates in
the summary every eval and training step reports, and its penalty term."""

from __future__ import annotations

from reinforge.envs.episode import Episode
from reinforge.envs.recipes.config import RecipesConfig
from reinforge.envs.recipes.loops import loops, repeated_ngram_share
from reinforge.envs.registry import load_configured
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import SamplingConfig
from reinforge.policy.repetition import loop_end, tail_loop
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.summary import summarize
from reinforge.types import Group, Status, Task, Trajectory

TASK = Task(id="t", prompt=[{"role": "user", "content": "What is 40 + 2?"}], answer=42)

PROSE = (
    "To add forty and two we start from forty count two more steps along the number line "
    "and arrive at forty two which is the sum the question asks for so the final answer "
    "written as a number is 42"
).split()
"""40 words with no 8-word window twice."""

SENTENCE = "wait let me check that sum again because I may have made a small mistake in it".split()
"""17 distinct words."""


def test_a_repeating_tail_is_a_loop():
    # "wait ... it" four times: 68 words, every one after the first 17 equal to the word
    # 17 before it (51 matches), so 68 // 17 = 4 copies of the 17-word unit, span 68 >= 32.
    assert tail_loop(SENTENCE * 4) == (17, 4)
    assert loops(PROSE + SENTENCE * 4)
    # 40 tokens alternating: period 2, 20 copies (period 1 matches nothing).
    assert tail_loop([7, 8] * 20) == (2, 20)
    assert loops([7, 8] * 20)


def test_short_or_few_repeats_are_not_loops():
    assert tail_loop("no no no no".split()) is None  # 4 copies, but a span of 4 < 32
    assert not loops("no no no no".split())
    assert tail_loop(SENTENCE * 3) is None  # 3 copies < 4
    assert tail_loop(PROSE) is None
    assert not loops(PROSE)
    assert repeated_ngram_share(PROSE) == 0.0  # its 33 8-word windows are all distinct


def test_an_engine_stops_at_the_first_token_whose_tail_loops():
    # [7, 8] x 16 is the first prefix of [7, 8] x 20 that loops: period 2, 16 copies, span
    # 32; at 31 tokens no unit's copies can cover 32.
    assert tail_loop([7, 8] * 16) == (2, 16) and tail_loop(([7, 8] * 16)[:-1]) is None
    assert loop_end([7, 8] * 20, checked=0) == 32  # a step that added all 40 tokens
    assert loop_end([7, 8] * 20, checked=39) == 40  # a step that added the last one
    assert loop_end(PROSE, checked=0) is None
    assert loop_end(SENTENCE * 4, checked=0) == 68  # the fourth copy's last word


def test_a_paragraph_said_three_times_loops_even_if_the_model_then_answers():
    # 51 words of the sentence x3, then 10 new words: 61 words, 54 8-word windows. The window
    # at i repeats the one at i - 17 while it lies inside copies 2-3 (i + 7 <= 50, i <= 43):
    # i = 17..43, 27 repeats; 27 / 54 = 0.5 >= 0.5.
    answer = "so the answer is forty two and that is final".split()
    sequence = SENTENCE * 3 + answer
    assert tail_loop(sequence) is None
    assert repeated_ngram_share(sequence) == 27 / 54
    assert loops(sequence)


def test_loop_rates_in_the_summary():
    looping_turn = [5, 6, 7, 8] * 10  # period 4, 10 copies, span 40
    plain_turn = list(range(100, 140))
    trajectories = [
        _trajectory(Status.OK, [plain_turn]),
        _trajectory(Status.TRUNCATED, [looping_turn]),  # cut while looping
        _trajectory(Status.TRUNCATED, [plain_turn]),  # cut, not by a loop
        _trajectory(Status.OK, [looping_turn, plain_turn]),  # looped, then broke out
    ]
    assert trajectories[3].sampled_turns == [looping_turn, plain_turn]
    summary = summarize([Group(task=TASK, trajectories=trajectories)], 1.0)
    assert summary.loop_rate == 2 / 4
    assert summary.loop_truncation_rate == 1 / 2


async def test_the_loop_penalty_is_a_term_on_top_of_the_environments_rubric():
    env = load_configured(
        RecipesConfig(name="arithmetic", args={"format_weight": 0.0}, loop_penalty=0.5)
    )
    looped = _episode("42", [[1, 2] * 20])
    clean = _episode("42", [list(range(40))])
    scores = await env.rubric.score([looped, clean])
    # correct 1 x 1 + format 0 x 1 + looping 1 x -0.5 = 0.5; the clean one 1
    assert [s.rewards["looping"] for s in scores] == [1.0, 0.0]  # type: ignore[union-attr]
    assert [s.total for s in scores] == [0.5, 1.0]  # type: ignore[union-attr]
    plain = load_configured(RecipesConfig(name="arithmetic"))
    assert [t.key for t in plain.rubric.terms] == ["correct", "format"]  # no penalty: no term


async def test_greedy_tiny_random_loops_and_sampled_does_not(tiny_engine):
    """The real engine: greedy decoding of the seeded random model writes newline after
    newline until the limit cuts it (a doom loop); sampling at temperature 1 from its
    near-uniform distribution over 49k tokens repeats nothing."""
    env = load_configured(
        RecipesConfig(name="arithmetic", loop_penalty=0.5, max_tokens_per_turn=48, args={})
    )
    rates = {}
    for temperature in (0.0, 1.0):
        client = PolicyClient.for_engine(tiny_engine, SamplingConfig(temperature=temperature))
        groups = await generate_groups(env, env.tasks(2), client, RolloutConfig(), 2, 0)
        summary = summarize(groups, 1.0)
        rates[temperature] = (
            summary.loop_rate,
            summary.loop_truncation_rate,
            summary.rewards["looping"],
        )
    # greedy: every rollout loops and is truncated by it; sampled: none loops (and a rollout
    # truncated without a loop, if any, counts 0 in the truncation rate)
    assert rates == {0.0: (1.0, 1.0, 1.0), 1.0: (0.0, 0.0, 0.0)}


async def test_a_loop_the_engine_stops_ends_truncated_and_counts(tiny_engine):
    """`stop_loops` on the same greedy rollouts: each turn ends at its first looping token,
    a prefix of the turn sampled without it; the episode is truncated, loops by the rule
    (so the penalty applies) and says it was stopped."""
    env = load_configured(
        RecipesConfig(name="arithmetic", loop_penalty=0.5, max_tokens_per_turn=64, args={})
    )
    runs = {}
    for stop_loops in (False, True):
        sampling = SamplingConfig(temperature=0.0, stop_loops=stop_loops)
        client = PolicyClient.for_engine(tiny_engine, sampling)
        runs[stop_loops] = await generate_groups(env, env.tasks(2), client, RolloutConfig(), 2, 0)
    summary = summarize(runs[True], 1.0)
    rates = (summary.loop_rate, summary.loop_truncation_rate, summary.rewards["looping"])
    assert rates == (1.0, 1.0, 1.0)
    for unstopped, stopped in zip(_rollouts(runs[False]), _rollouts(runs[True]), strict=True):
        (whole,), (turn,) = unstopped.sampled_turns, stopped.sampled_turns
        assert unstopped.status == stopped.status == Status.TRUNCATED
        assert len(turn) < len(whole) == 64 and whole[: len(turn)] == turn
        assert stopped.info["loop_stops"] == 1 and "loop_stops" not in unstopped.info


def _rollouts(groups: list[Group]) -> list[Trajectory]:
    return [t for group in groups for t in group.trajectories]


def _episode(text: str, sampled: list[list[int]]) -> Episode:
    messages = [*TASK.prompt, {"role": "assistant", "content": text}]
    return Episode(TASK, messages, turns=1, sampled_token_ids=sampled)


def _trajectory(status: Status, turns: list[list[int]]) -> Trajectory:
    token_ids: list[int] = []
    mask: list[int] = []
    for turn in turns:
        token_ids += [1, 2, 3] + turn  # a prompt or environment message, then the turn
        mask += [0, 0, 0] + [1] * len(turn)
    return Trajectory(
        task_id="t", group_id="t", token_ids=token_ids, loss_mask=mask, status=status, reward=0.0
    )
