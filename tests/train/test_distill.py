"""On-policy distillation's arithmetic, by hand: the per-token advantage, where the batch
puts it, which groups train, and how teachers are routed to tasks."""

from __future__ import annotations

import pytest
import torch

from reinforge.errors import UsageError
from reinforge.orchestrate.teachers import Teachers
from reinforge.policy.config import EngineConfig, ModelConfig
from reinforge.policy.models import load_tokenizer
from reinforge.policy.teacher import Teacher
from reinforge.train.batching import TrainBatch
from reinforge.train.config import TrainerConfig
from reinforge.train.distill import DistillConfig, TeacherConfig, distill_advantages
from reinforge.train.trainer import select_for_training
from reinforge.types import Group, Task, Trajectory

TEACHER = [-1.0, -0.5, -2.0]
STUDENT = [-1.5, -0.5, -1.0]


def test_distill_advantages_of_a_hand_made_three_token_example():
    # teacher - student = [-1.0 + 1.5, -0.5 + 0.5, -2.0 + 1.0] = [0.5, 0.0, -1.0]
    # coef 0.5: [0.25, 0.0, -0.5]; plus reward_weight 2 x rl advantage 0.25 = 0.5 on each:
    # [0.75, 0.5, 0.0]. The token the teacher likes more gains, the one it likes less
    # loses, the one they agree on keeps the reward's share alone.
    mixed = distill_advantages(
        torch.tensor(TEACHER), torch.tensor(STUDENT), 0.25, coef=0.5, reward_weight=2.0
    )
    assert mixed.tolist() == [0.75, 0.5, 0.0]
    # Pure distillation: the negative reverse KL per token, whatever the reward.
    pure = distill_advantages(
        torch.tensor(TEACHER), torch.tensor(STUDENT), 0.25, coef=1.0, reward_weight=0.0
    )
    assert pure.tolist() == [0.5, 0.0, -1.0]
    with pytest.raises(ValueError, match="one per sampled token"):
        distill_advantages(
            torch.tensor(TEACHER[:2]), torch.tensor(STUDENT), 0.0, coef=1, reward_weight=0
        )


def _trajectory(index: int, reward: float, teacher: list[float] | None = None) -> Trajectory:
    """Five tokens, the last three sampled with the log-probs STUDENT."""
    return Trajectory(
        task_id="t",
        group_id=f"g{index // 2}",
        index=index,
        token_ids=[7, 8, 9, 10, 11],
        loss_mask=[0, 0, 1, 1, 1],
        logprobs=STUDENT,
        policy_versions=[0, 0, 0],
        teacher_logprobs=teacher or [],
        reward=reward,
    )


def test_per_token_advantages_sit_where_their_tokens_are_predicted():
    # Position t predicts token t + 1: tokens 2, 3, 4 are sampled, so positions 1, 2, 3 hold
    # their advantages; a one-number row spreads its number over its own positions.
    short = Trajectory(
        task_id="u", group_id="h", token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[-1.0, -1.0]
    )
    batch = TrainBatch.from_trajectories([_trajectory(0, 1.0), short], [[0.75, 0.5, 0.0], 0.25])
    assert batch.advantages is not None
    assert batch.advantages.tolist() == [[0.0, 0.75, 0.5, 0.0, 0.0], [0.25, 0.25, 0.0, 0.0, 0.0]]
    assert TrainBatch.from_trajectories([short], [0.25]).advantages.shape == (1, 1)
    with pytest.raises(ValueError, match="2 advantages for 3 sampled tokens"):
        TrainBatch.from_trajectories([_trajectory(0, 1.0)], [[0.1, 0.2]])


def test_a_taught_group_of_equal_rewards_trains_and_an_untaught_one_is_skipped():
    distill = DistillConfig(
        teachers=[TeacherConfig(model="tiny-random")], coef=0.5, reward_weight=2.0
    )
    taught = Group(
        task=Task(id="t", prompt=[]),
        trajectories=[_trajectory(0, 1.0, TEACHER), _trajectory(1, 1.0, TEACHER)],
    )
    untaught = Group(
        task=Task(id="t", prompt=[]), trajectories=[_trajectory(2, 1.0), _trajectory(3, 1.0)]
    )
    selection = select_for_training([taught, untaught], TrainerConfig(), distill)
    # Equal rewards: the RL advantage is 0, so each token keeps coef x (teacher - student).
    assert selection.advantages == [[0.25, 0.0, -0.5], [0.25, 0.0, -0.5]]
    assert selection.zero_variance_groups == 1
    assert select_for_training([taught], TrainerConfig()).zero_variance_groups == 1

    varied = Group(
        task=Task(id="t", prompt=[]),
        trajectories=[_trajectory(0, 1.0, TEACHER), _trajectory(1, 0.0, TEACHER)],
    )
    # GRPO of [1, 0]: (r - 0.5) / (std 0.7071 + 1e-4) = +-0.70701; times reward_weight 2.
    first, second = select_for_training([varied], TrainerConfig(), distill).advantages
    assert first == pytest.approx([0.25 + 1.41402, 1.41402, -0.5 + 1.41402], abs=1e-4)
    assert second == pytest.approx([0.25 - 1.41402, -1.41402, -0.5 - 1.41402], abs=1e-4)


def test_teachers_are_routed_by_environment_then_tag_and_the_first_match_wins():
    math, code, anyone = object(), object(), object()
    teachers = Teachers(
        [
            (TeacherConfig(model="m", route="arithmetic"), math),  # type: ignore[list-item]
            (TeacherConfig(model="c", route="coding"), code),  # type: ignore[list-item]
        ],
        environment="wordle",
    )
    assert teachers.teacher_of(Task(id="a", prompt=[], info={"tags": ["coding"]})) is code
    assert teachers.teacher_of(Task(id="b", prompt=[], info={"tags": "arithmetic"})) is math
    assert teachers.teacher_of(Task(id="c", prompt=[])) is None  # trains on reward alone
    teachers = Teachers(
        [
            (TeacherConfig(model="m", route="wordle"), math),  # type: ignore[list-item]
            (TeacherConfig(model="a"), anyone),  # type: ignore[list-item]
        ],
        environment="wordle",
    )
    assert teachers.teacher_of(Task(id="d", prompt=[], info={"tags": ["coding"]})) is math


async def test_a_teacher_of_another_vocabulary_is_refused_in_one_line():
    teacher = await Teacher.open("tiny-random", ModelConfig(), EngineConfig(), None)
    try:
        same = load_tokenizer("tiny-random")
        await teacher.check_vocabulary(same)
        scores = await teacher.logprobs([1, 2, 3, 4])
        assert len(scores) == 3 and all(s < 0 for s in scores)
        bigger = load_tokenizer("tiny-random")
        bigger.add_tokens(["<not-in-the-teacher>"])
        with pytest.raises(UsageError, match="is the teacher's vocabulary the student's"):
            await teacher.check_vocabulary(bigger)
    finally:
        await teacher.aclose()
