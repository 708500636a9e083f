"""The sharded trainer (FSDP2 over gloo, on CPU) against one process on real parts: two
ranks give the same loss, metrics and updated weights on the same batch, and write one
Hugging Face checkpoint that loads with world size 1; a stuck or dead rank ends the run with
an error, not a hang; a checkpoint of one process resumes on two ranks, and theirs on one."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from reinforge.policy.models import load_model
from reinforge.train.algorithm import AlgorithmConfig, PPOClipLoss
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.ranks import LocalRanks, RankFailed, run_on_ranks
from reinforge.train.sharded import RankTrainer, ShardedTrainer
from reinforge.train.token_weights import SequenceMean, TruncatedIS
from reinforge.train.trainer import Trainer, TrainerSpec
from reinforge.types import Trajectory

from .rank_faults import answer_then_die, leave

VOCAB = 49152
UNIFORM = -math.log(VOCAB)
"""About the log-prob the untrained tiny model gives any token: importance ratios near 1."""
OPTIM = OptimConfig(lr=1e-3)
STEPS = 2  # the second step runs on Adam's state and, with a KL, on a moved policy
CASES = {
    # the token-mean divisor is the whole batch's; the KL reference is sharded too
    "token_mean_kl": TrainerConfig(
        micro_batch_tokens=16, algorithm=AlgorithmConfig(loss=PPOClipLoss(kl_coef=0.1))
    ),
    # each rank's sequences are divided by the whole batch's sequence count
    "sequence_mean": TrainerConfig(
        micro_batch_tokens=16,
        algorithm=AlgorithmConfig(loss=PPOClipLoss(aggregation=SequenceMean())),
    ),
    # the first pass's reference and proximal log-probs, kept per micro-batch on each rank
    # (the idle pass's too), anchor the second update
    "two_updates_tis_kl": TrainerConfig(
        micro_batch_tokens=16,
        updates_per_batch=2,
        algorithm=AlgorithmConfig(loss=PPOClipLoss(kl_coef=0.1, correction=TruncatedIS())),
    ),
}


def _batch() -> TrainBatch:
    """Rows of 12, 8, 7 and 4 tokens, the first with a tool result (mask 0) between two
    sampled turns. Under a 16-token budget they plan as [12], [8, 7], [4]: rank 0 takes
    two micro-batches, rank 1 one and an idle pass."""
    generator = torch.Generator().manual_seed(0)
    masks = [
        [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1, 1],
        [0, 0, 1, 1],
    ]
    trajectories = [
        Trajectory(
            task_id="t",
            group_id="t",
            index=i,
            token_ids=torch.randint(3, VOCAB, (len(mask),), generator=generator).tolist(),
            loss_mask=mask,
            logprobs=[UNIFORM] * sum(mask),
        )
        for i, mask in enumerate(masks)
    ]
    return TrainBatch.from_trajectories(trajectories, [1.0, -1.0, 0.5, -0.5])


def _train(
    kind: type[Trainer], config: TrainerConfig, batch: TrainBatch
) -> tuple[Trainer, list[dict[str, float]]]:
    model, _ = load_model("tiny-random")
    reference = None
    if config.algorithm.loss.needs_reference:
        reference = load_model("tiny-random")[0].requires_grad_(False)
    trainer = kind(model, config, OPTIM, total_steps=STEPS, reference=reference)
    return trainer, [trainer.step(batch).model_dump() for _ in range(STEPS)]


def _on_rank(
    configs: dict[str, TrainerConfig], batch: TrainBatch, folder: Path
) -> dict[str, list[dict[str, float]]]:
    """Every case on this rank, each model saved to `folder / case`; the metrics."""
    metrics = {}
    for name, config in configs.items():
        trainer, metrics[name] = _train(ShardedTrainer, config, batch)
        assert isinstance(trainer, ShardedTrainer)
        trainer.save_model(folder / name)
    return metrics


def test_two_ranks_step_as_one_process(tmp_path):
    batch = _batch()
    assert micro_batches(batch.lengths, 16) == [[0], [1, 2], [3]]
    sharded = {name: c.model_copy(update={"world_size": 2}) for name, c in CASES.items()}
    launch = TrainerConfig(world_size=2, collective_timeout_s=120)
    on_ranks = run_on_ranks(launch, _on_rank, sharded, batch, tmp_path)

    initial = dict(load_model("tiny-random")[0].named_parameters())
    for name, config in CASES.items():
        trainer, expected = _train(Trainer, config, batch)
        # grad_norm is of the summed gradients before clipping: it pins their scale, which
        # Adam's update hides (FSDP's default mean would halve it and move no weight).
        for got, want in zip(on_ranks[name], expected, strict=True):
            assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
        assert expected[1]["kl" if "kl" in name else "loss"] != 0.0
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / name)
        assert saved.config.architectures == ["LlamaForCausalLM"]
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == [
            "config.json",
            "generation_config.json",
            "model.safetensors",
        ]
        for param_name, param in trainer.model.named_parameters():
            # Adam moves each weight by about lr * g / |g|: where a gradient is ~0, summing in
            # another order moves a few weights by a fraction of lr (4.5e-5 seen), the rest
            # agree to 1e-6.
            torch.testing.assert_close(
                saved.get_parameter(param_name), param, atol=OPTIM.lr / 10, rtol=0.0
            )
            assert not torch.equal(param, initial[param_name])  # every parameter trained


def test_a_stuck_rank_times_out_the_others():
    config = TrainerConfig(world_size=2, collective_timeout_s=2)
    with pytest.raises(RankFailed, match="trainer rank 0: .*Timed out"):
        run_on_ranks(config, leave, "stuck")


def test_a_dead_rank_ends_the_run_with_an_error():
    config = TrainerConfig(world_size=2, collective_timeout_s=2)
    # whichever comes first: rank 1 seen gone, or rank 0's collective failing for it
    with pytest.raises(RankFailed, match=r"trainer rank 1 died \(exit code 1\)|trainer rank 0"):
        run_on_ranks(config, leave, "dies")


def test_a_rank_that_dies_as_its_answer_is_read_ends_the_run_with_an_error():
    config = TrainerConfig(world_size=2, collective_timeout_s=2)
    with pytest.raises(RankFailed, match=r"trainer rank 1 died \(exit code 1\)"):
        run_on_ranks(config, answer_then_die)


def _resume_on_rank(
    config: TrainerConfig, model: Path, state: dict, batch: TrainBatch, folder: Path
) -> tuple[dict[str, float], dict]:
    """From a one-process trainer's checkpoint (`model`, `state`): one step on this rank,
    the model saved to `folder`; the step's metrics and the whole trainer state after it."""
    resumed = AutoModelForCausalLM.from_pretrained(model)
    trainer = ShardedTrainer(resumed, config, OPTIM, total_steps=STEPS)
    trainer.load_state_dict(state)
    metrics = trainer.step(batch).model_dump()
    trainer.save_model(folder)
    return metrics, trainer.state_dict()


def test_a_checkpoint_resumes_on_another_world_size(tmp_path):
    """One process steps once and checkpoints; two ranks resume from it and step again,
    as the one process does: the same step, and a state the one process loads back."""
    config, batch = CASES["sequence_mean"], _batch()
    model, _ = load_model("tiny-random")
    one = Trainer(model, config, OPTIM, total_steps=STEPS)
    one.step(batch)
    one.save_model(tmp_path / "step1")
    state = copy.deepcopy(one.state_dict())  # the live optimizer's tensors move on
    expected = one.step(batch).model_dump()

    sharded = config.model_copy(update={"world_size": 2, "collective_timeout_s": 120})
    metrics, resharded = run_on_ranks(
        sharded, _resume_on_rank, sharded, tmp_path / "step1", state, batch, tmp_path / "step2"
    )
    assert metrics == pytest.approx(expected, rel=1e-4, abs=1e-6)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "step2")
    for name, param in one.model.named_parameters():
        torch.testing.assert_close(saved.get_parameter(name), param, atol=OPTIM.lr / 10, rtol=0)

    # the two ranks' state is a one-process state: the same entries, whole, loadable
    wanted = one.state_dict()["optimizer"]
    assert resharded["optimizer"]["param_groups"] == wanted["param_groups"]
    assert resharded["optimizer"]["state"].keys() == wanted["state"].keys()
    for index, entry in wanted["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(resharded["optimizer"]["state"][index][key], value)
    Trainer(saved, config, OPTIM, total_steps=STEPS).load_state_dict(resharded)


def test_only_rank_0_sends_the_optimizer_state_back():
    """Every rank gathers the state (a collective), but a checkpoint keeps rank 0's: the
    others' copies would cross the process boundary, W times the bytes, for nothing."""
    config = TrainerConfig(world_size=2, collective_timeout_s=120)
    spec = TrainerSpec("tiny-random", config, OPTIM, total_steps=STEPS)
    ranks = LocalRanks(config, RankTrainer, spec)
    try:
        ranks.call("step", _batch())
        zero, one = ranks.call("state_dict")
    finally:
        ranks.stop()
    assert one is None
    moments = [entry["exp_avg"] for entry in zero["optimizer"]["state"].values()]
    parameters = load_model("tiny-random")[0].parameters()
    assert sorted(m.numel() for m in moments) == sorted(p.numel() for p in parameters)  # whole
