"""The sharded trainer (FSDP2 over gloo, on CPU) against one process on real parts: two
ranks give the same loss, metrics and updated weights on the same batch, and write one
Hugging Face checkpoint that loads with world size 1; a stuck or dead rank ends the run with
an error, not a hang; a checkpoint of one process resumes on two ranks, and theirs on one."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from transformers import AutoModelForCausalLM

from reinforge.policy.models import load_model, load_tokenizer
from reinforge.train.algorithm import AlgorithmConfig, PPOClipLoss, SequenceMean, TruncatedIS
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.checkpoints import OPTIMIZER, write_checkpoint
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.ranks import LocalRanks, RankFailed, run_on_ranks
from reinforge.train.sharded import RankTrainer, ShardedTrainer, TrainerRanks, build_sharded
from reinforge.train.trainer import PolicyTrainer, Trainer, TrainerSpec, build_trainer
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


def _checkpoint(trainer: PolicyTrainer, run_dir: Path) -> Path:
    """Step 1's checkpoint of `run_dir`, as a run writes it."""
    state = {"step": 1, **trainer.state_dict()}
    tokenizer = load_tokenizer("tiny-random")
    return write_checkpoint(
        run_dir, 1, trainer.save_model, trainer.save_optimizer, tokenizer, state
    )


def _optimizer_state(trainer: Trainer) -> dict[str, object]:
    """The whole optimizer state by parameter name, as a one-process trainer holds it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(trainer.model, trainer.optimizer, options=options)


def _saved_optimizer(checkpoint: Path, tmp_path: Path) -> dict[str, object]:
    """A checkpoint's optimizer state, read from its files alone, whole."""
    whole = tmp_path / f"{checkpoint.parent.parent.name}.pt"
    dcp_to_torch_save(checkpoint / OPTIMIZER, whole)
    return torch.load(whole, weights_only=False)["optimizer"]


def _resumed_on_rank(
    specs: list[TrainerSpec], batch: TrainBatch
) -> list[tuple[dict[str, object], dict[str, float], dict[str, torch.Tensor]]]:
    """Each spec's checkpoint resumed on this rank: the whole optimizer state as loaded,
    the next step's metrics and the weights after it."""
    results = []
    for spec in specs:
        trainer = build_sharded(spec)
        state = copy.deepcopy(_optimizer_state(trainer))  # the live tensors move on
        metrics = trainer.step(batch).model_dump()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        results.append((state, metrics, get_model_state_dict(trainer.model, options=options)))
    return results


def _assert_same_state(got: dict, want: dict) -> None:
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for name, entry in want["state"].items():
        assert entry.keys() == got["state"][name].keys()
        for key, value in entry.items():
            assert torch.equal(got["state"][name][key], value), (name, key)


def test_a_checkpoint_resumes_on_another_world_size(tmp_path):
    """Two ranks step once and checkpoint, each rank writing its shard of the optimizer
    state; one process and two ranks resume from it and load exactly the saved state, and
    their next step is the uninterrupted run's: exactly, on two ranks again; to the float
    rounding of summing over ranks, on one. The same the other way round: a one-process
    checkpoint resumed on two ranks. fp32, with a sharded KL reference."""
    config, batch = CASES["token_mean_kl"], _batch()
    sharded = config.model_copy(update={"world_size": 2, "collective_timeout_s": 120})
    one_spec = TrainerSpec("tiny-random", config, OPTIM, total_steps=STEPS)
    two_spec = replace(one_spec, config=sharded)

    two = TrainerRanks(LocalRanks(sharded, RankTrainer, two_spec))
    try:
        two.step(batch)
        from_two = _checkpoint(two, tmp_path / "two")
        two_next = two.step(batch).model_dump()
        two.save_model(tmp_path / "two_uninterrupted")
    finally:
        two.close()
    # each rank wrote its own half of the moments, none the whole
    shards = sorted((from_two / OPTIMIZER).glob("*.distcp"))
    assert [p.name for p in shards] == ["__0_0.distcp", "__1_0.distcp"]
    moments = 2 * 4 * sum(p.numel() for p in load_model("tiny-random")[0].parameters())
    for shard in shards:
        assert 0.45 * moments < shard.stat().st_size < 0.55 * moments + 100_000

    one = build_trainer(Trainer, one_spec)
    one.step(batch)
    from_one = _checkpoint(one, tmp_path / "one")
    one_state = copy.deepcopy(_optimizer_state(one))  # the live tensors move on
    one_next = one.step(batch).model_dump()

    # two ranks -> one process
    resumed = build_trainer(Trainer, replace(one_spec, checkpoint=from_two))
    _assert_same_state(_optimizer_state(resumed), _saved_optimizer(from_two, tmp_path))
    assert resumed.step(batch).model_dump() == pytest.approx(two_next, rel=1e-4, abs=1e-6)
    uninterrupted = AutoModelForCausalLM.from_pretrained(tmp_path / "two_uninterrupted")
    for name, param in resumed.model.named_parameters():
        torch.testing.assert_close(
            param, uninterrupted.get_parameter(name), atol=OPTIM.lr / 10, rtol=0
        )

    # two ranks -> two ranks, and one process -> two ranks
    on_two = [replace(two_spec, checkpoint=from_two), replace(two_spec, checkpoint=from_one)]
    (state_22, next_22, weights_22), (state_12, next_12, weights_12) = run_on_ranks(
        sharded, _resumed_on_rank, on_two, batch
    )
    _assert_same_state(state_22, _saved_optimizer(from_two, tmp_path))
    assert next_22 == two_next
    for name, param in uninterrupted.named_parameters():
        assert torch.equal(weights_22[name], param), name
    _assert_same_state(state_12, one_state)
    assert next_12 == pytest.approx(one_next, rel=1e-4, abs=1e-6)
    for name, param in one.model.named_parameters():
        torch.testing.assert_close(weights_12[name], param, atol=OPTIM.lr / 10, rtol=0)
