import pytest
import torch

from reinforge.policy.models import load_model
from reinforge.train.algorithm import PPOClipLoss
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.logprobs import selective_logprobs
from reinforge.train.token_weights import ConstantNorm, SequenceMean, TokenMean
from reinforge.types import Trajectory


def trajectory(token_ids: list[int], loss_mask: list[int], logprobs: list[float]) -> Trajectory:
    return Trajectory(
        task_id="t", group_id="g", token_ids=token_ids, loss_mask=loss_mask, logprobs=logprobs
    )


# ---- TrainBatch ----

# Three episodes, by hand. Token ids are 10 + position (20 +, 30 +) so a shift shows.
MULTI_TURN = trajectory(  # prompt 10 11 | sampled 12 13 | tool 14 15 | sampled 16 17
    [10, 11, 12, 13, 14, 15, 16, 17],
    [0, 0, 1, 1, 0, 0, 1, 1],
    [-0.1, -0.2, -0.3, -0.4],
)
TRUNCATED = trajectory([20, 21, 22, 23, 24], [0, 1, 1, 0, 0], [-0.5, -0.6])  # ends on a tool
SHORT = trajectory([30, 31, 32], [0, 0, 1], [-0.7])


def hand_batch() -> TrainBatch:
    return TrainBatch.from_trajectories([MULTI_TURN, TRUNCATED, SHORT], [1.0, -0.5, 0.25])


def test_train_batch_shifts_masks_targets_and_logprobs_by_hand():
    batch = hand_batch()
    # Right-padded with 0 to the longest row, 8.
    assert batch.input_ids.tolist() == [
        [10, 11, 12, 13, 14, 15, 16, 17],
        [20, 21, 22, 23, 24, 0, 0, 0],
        [30, 31, 32, 0, 0, 0, 0, 0],
    ]
    assert batch.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
    ]
    # Position t is trained iff token t + 1 was sampled: loss_mask shifted left by one.
    # MULTI_TURN's 12 13 and 16 17 are predicted at positions 1 2 and 5 6.
    assert batch.target_mask.int().tolist() == [
        [0, 1, 1, 0, 0, 1, 1, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0, 0, 0],
    ]
    # Token t + 1 at every position that has one, 0 at each row's last token and padding.
    assert batch.targets.tolist() == [
        [11, 12, 13, 14, 15, 16, 17, 0],
        [21, 22, 23, 24, 0, 0, 0, 0],
        [31, 32, 0, 0, 0, 0, 0, 0],
    ]
    # The sampler's log-probs, in order, onto the shifted mask.
    expected = torch.tensor(
        [
            [0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4, 0.0],
            [-0.5, -0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0, -0.7, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    assert batch.behaviour_logprobs.equal(expected)
    assert batch.advantages.tolist() == [[1.0], [-0.5], [0.25]]
    assert batch.target_mask.dtype == torch.bool
    assert batch.behaviour_logprobs.dtype == batch.advantages.dtype == torch.float32
    assert batch.lengths == [8, 5, 3] and batch.width == 8


def test_select_keeps_the_rows_in_order_and_cuts_columns_to_the_longest():
    batch = hand_batch()
    micro = batch.select([2, 1])
    assert micro.width == 5  # TRUNCATED's length; columns 5-7 are padding in both rows
    assert micro.input_ids.tolist() == [[30, 31, 32, 0, 0], [20, 21, 22, 23, 24]]
    assert micro.target_mask.equal(batch.target_mask[[2, 1], :5])
    assert micro.targets.equal(batch.targets[[2, 1], :5])
    assert micro.behaviour_logprobs.equal(batch.behaviour_logprobs[[2, 1], :5])
    assert micro.advantages.tolist() == [[0.25], [-0.5]]
    assert batch.select([2]).input_ids.tolist() == [[30, 31, 32]]
    assert batch.to("cpu").input_ids.equal(batch.input_ids)


@pytest.mark.parametrize(
    ("trajectories", "advantages", "message"),
    [
        ([], [], "no trajectories"),
        ([SHORT], [1.0, 2.0], "one advantage per trajectory"),
        ([SHORT], [float("nan")], "finite"),
        ([trajectory([], [], [])], [0.0], "no tokens"),
        ([trajectory([1, 2], [0], [])], [0.0], "2 token_ids but 1 loss_mask"),
        ([trajectory([1, 2], [0, 2], [-1.0])], [0.0], "only 0 and 1"),
        ([trajectory([1, 2], [1, 0], [-1.0])], [0.0], "first token"),
        ([trajectory([1, 2, 3], [0, 1, 1], [-1.0])], [0.0], "2 sampled tokens .* 1 logprobs"),
        ([trajectory([1, 2], [0, 1], [float("-inf")])], [0.0], "not finite"),
        ([trajectory([1, -100], [0, 1], [-1.0])], [0.0], "negative"),
    ],
)
def test_inconsistent_inputs_are_refused(trajectories, advantages, message):
    with pytest.raises(ValueError, match=message):
        TrainBatch.from_trajectories(trajectories, advantages)


# ---- shared prefixes and micro_batches ----


def of_lengths(lengths: list[int], seed: int = 0) -> TrainBatch:
    """Rows of random tokens, each sampling its last (but a row of one): no two open
    alike."""
    generator = torch.Generator().manual_seed(seed)
    return TrainBatch.from_sequences(
        [torch.randint(1, 49152, (n,), generator=generator).tolist() for n in lengths],
        [[0] * (n - 1) + [int(n > 1)] for n in lengths],
    )


def rollouts(prompt: list[int], rests: list[tuple[list[int], list[int]]]) -> TrainBatch:
    """Rows of one prompt, each followed by its tokens and their loss mask."""
    return TrainBatch.from_sequences(
        [prompt + tokens for tokens, _ in rests], [[0] * len(prompt) + mask for _, mask in rests]
    )


def test_the_shared_prefix_ends_where_rows_differ_or_any_row_trains():
    prompt = [5, 6, 7, 8]
    # Row 1 samples from column 5 (predicted at column 4), row 0 from column 7: column 4
    # trains in row 1, so 4 columns are shared though rows 0 and 1 agree up to column 5.
    batch = rollouts(prompt, [([9, 1, 2, 3], [0, 0, 0, 1]), ([9, 1, 4], [0, 1, 1])])
    assert batch.shared_prefix == 4
    # Rows that differ at column 2 share 2 columns, whatever comes after.
    differing = rollouts([5, 6], [([7, 1, 1], [0, 0, 1]), ([8, 1, 1], [0, 0, 1])])
    assert differing.shared_prefix == 2
    # A row is never all prefix: the shortest keeps one column of its own.
    short = TrainBatch.from_sequences([[5, 6, 7, 8, 9], [5, 6, 7]], [[0, 0, 0, 0, 1], [0, 0, 1]])
    assert short.shared_prefix == 1  # column 1 predicts row 1's sampled token
    assert rollouts(prompt, [([9, 1], [0, 1])]).shared_prefix == 0  # one row: none
    assert of_lengths([6, 6]).shared_prefix == 0
    assert batch.computed_tokens(share_prefix=True) == 4 + 2 * (8 - 4)
    assert batch.computed_tokens(share_prefix=False) == 2 * 8


def test_micro_batches_by_hand():
    # Longest first, ties by index: rows 1 (8), 3 (8), 2 (5), 0 (3), 4 (2). Budget 16:
    # [1, 3] costs 2 x 8 = 16; adding row 2 would cost 3 x 8 = 24, so it starts a group,
    # which takes rows 0 and 4 at 3 x 5 = 15.
    assert micro_batches(of_lengths([3, 8, 5, 8, 2]), token_budget=16) == [[1, 3], [2, 0, 4]]


def test_a_row_over_the_budget_gets_a_micro_batch_of_its_own():
    assert micro_batches(of_lengths([5, 50, 3]), token_budget=20) == [[1], [0, 2]]


def test_rollouts_of_one_prompt_go_together_and_their_prompt_counts_once():
    # Two prompts of 20 tokens, two rollouts each, interleaved in the batch; the rests are
    # 4 tokens long and row 3's 6, so by length the plan would take rows 3 and 0 together.
    first, second = list(range(1, 21)), list(range(101, 121))
    rest = ([1, 2, 3, 4], [0, 1, 1, 1])
    batch = TrainBatch.from_sequences(
        [first + rest[0], second + rest[0], first + rest[0], second + [5, 6, 7, 8, 9, 9]],
        [[0] * 20 + rest[1]] * 3 + [[0] * 20 + [0, 1, 1, 1, 1, 1]],
    )
    # Each prompt's pair: 19 shared columns + 2 x (24 - 19) = 29; and 19 + 2 x 7 = 33.
    assert micro_batches(batch, token_budget=33) == [[0, 2], [1, 3]]  # by their openings
    assert micro_batches(batch, token_budget=33, share_prefix=False) == [[3], [0], [1], [2]]
    # Where sharing saves nothing, the length order stands: here the same four rows' plan.
    assert micro_batches(of_lengths([24, 24, 24, 26]), 33) == [[3], [0], [1], [2]]


LENGTHS = [17, 3, 40, 8, 8, 25, 1, 12, 30, 5, 9, 22]


@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("budget", [1, 30, 64, 100, 1000])
def test_micro_batches_respect_the_budget_and_take_every_row_once(budget, share_prefix):
    # Half the rows open with one 12-token prompt, so both orders are in play.
    batch = of_lengths(LENGTHS)
    prompt = batch.input_ids[0, :12].clone()
    for row in range(0, len(LENGTHS), 2):
        n = min(12, LENGTHS[row] - 1)
        batch.input_ids[row, :n] = prompt[:n]
    groups = micro_batches(batch, budget, share_prefix)
    rows = [row for group in groups for row in group]
    assert sorted(rows) == list(range(len(LENGTHS)))  # every row exactly once
    for group in groups:
        assert len(group) == 1 or batch.select(group).computed_tokens(share_prefix) <= budget
    assert micro_batches(batch, budget, share_prefix) == groups  # deterministic


def test_micro_batches_refuse_a_non_positive_budget():
    with pytest.raises(ValueError, match="token_budget"):
        micro_batches(of_lengths([3]), token_budget=0)


# ---- micro-batch accumulation ----


@pytest.fixture(scope="module")
def tiny_model():
    model, _ = load_model("tiny-random")  # tied head, SmolLM2's 49k vocabulary
    return model


def episode(lengths: list[int], seed: int) -> Trajectory:
    """Alternating prompt/tool and sampled segments of these lengths, random tokens, and
    behaviour log-probs near the random model's (about -log 49152 = -10.8)."""
    generator = torch.Generator().manual_seed(seed)
    mask = [i % 2 for i, n in enumerate(lengths) for _ in range(n)]
    tokens = torch.randint(49152, (len(mask),), generator=generator).tolist()
    logprobs = (-10.8 + 0.6 * torch.rand(sum(mask), generator=generator) - 0.3).tolist()
    return trajectory(tokens, mask, logprobs)


@pytest.mark.parametrize(
    "aggregation", [TokenMean(), SequenceMean(), ConstantNorm(max_tokens=16)], ids=str
)
def test_micro_batch_losses_and_gradients_add_up_to_the_whole_batch(tiny_model, aggregation):
    batch = TrainBatch.from_trajectories(
        [
            episode([4, 3, 2, 5], seed=0),  # 14 tokens, two sampled spans
            episode([6, 2], seed=1),  # 8
            episode([3, 9, 2, 4, 1], seed=2),  # 19
            episode([5, 1], seed=3),  # 6
            episode([2, 7, 3], seed=4),  # 12, ends on a tool
        ],
        advantages=[1.0, -1.0, 0.5, -0.5, 2.0],
    )
    loss_fn = PPOClipLoss(aggregation=aggregation)

    def loss_of(micro: TrainBatch, weights: torch.Tensor | None) -> tuple[torch.Tensor, float]:
        """Backpropagate this micro-batch's loss; return it and its clip fraction."""
        logp, _ = selective_logprobs(
            tiny_model, micro.input_ids, micro.attention_mask, micro.target_mask, micro.targets
        )  # (b, t)
        loss, metrics = loss_fn.compute(
            logp, micro.behaviour_logprobs, micro.advantages, micro.target_mask, weights=weights
        )
        loss.backward()
        return loss.detach(), metrics.clip_fraction.item()

    tiny_model.zero_grad()
    whole, clip_fraction = loss_of(batch, weights=None)
    # The behaviour log-probs sit within +-0.3 of the model's, so some ratios fall outside
    # [0.8, 1.28] and some inside: both branches of the clip are exercised.
    assert 0.0 < clip_fraction < 1.0
    whole_grads = [p.grad.clone() for p in tiny_model.parameters()]

    tiny_model.zero_grad()
    weights = aggregation.weights(batch.target_mask)  # (B, T), of the whole batch
    groups = micro_batches(batch, token_budget=30, share_prefix=False)
    assert groups == [[2], [0, 4], [1, 3]]  # 19 | 2 x 14 | 2 x 8: columns 19, 14 and 8
    total = torch.zeros(())
    for rows in groups:
        micro = batch.select(rows)
        total += loss_of(micro, weights=weights[rows, : micro.width])[0]

    # Equal up to summation order, which differs between CPUs' kernels: the tolerance is
    # a float32 rounding budget scaled to each tensor, far below what a wrong weighting of
    # any row or token would change.
    torch.testing.assert_close(total, whole, atol=1e-5 * float(whole.abs()), rtol=0)
    for param, whole_grad in zip(tiny_model.parameters(), whole_grads, strict=True):
        scale = float(whole_grad.abs().max())
        torch.testing.assert_close(param.grad, whole_grad, atol=1e-4 * scale, rtol=0)
    assert all(grad.abs().sum() > 0 for grad in whole_grads)
