"""The sharded trainer (FSDP2 over gloo, on CPU) against one process on real parts: two
ranks give the same loss, metrics and updated weights on the same batch, and write one
Hugging Face checkpoint that loads with world size 1; in bf16 they step as one rank in
bf16; rank 1 never loads the model; a stuck or dead rank ends the run with an error, not a
hang; a checkpoint of two ranks resumes on one and on two, and one of one process on two."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
)
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from reinforge.policy.models import load_model, load_tokenizer
from reinforge.train import sharded as sharded_module
from reinforge.train.algorithm import AlgorithmConfig, PPOClipLoss
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.checkpoints import OPTIMIZER, TRAINER_STATE, write_checkpoint
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.ranks import LocalRanks, RankFailed, run_on_ranks
from reinforge.train.sharded import RankTrainer, ShardedTrainer, TrainerRanks, build_sharded
from reinforge.train.token_weights import SequenceMean, TruncatedIS
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
    assert micro_batches(batch, 16) == [[0], [1, 2], [3]]
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


def _mixed_on_rank(
    config: TrainerConfig, batch: TrainBatch, folder: Path
) -> tuple[list[dict[str, float]], dict[str, torch.dtype]]:
    """STEPS steps of `config` on this rank, the model saved to `folder`; the metrics, and
    the dtype of the weight a decoder layer and the head compute with."""
    model, _ = load_model("tiny-random")
    reference = load_model("tiny-random")[0].requires_grad_(False)
    trainer = ShardedTrainer(model, config, OPTIM, total_steps=STEPS, reference=reference)
    seen: dict[str, torch.dtype] = {}

    def note_layer(unit: torch.nn.Module, _: object) -> None:
        seen["model.layers.0.mlp.up_proj"] = unit.weight.dtype

    def note_head(unit: torch.nn.Module, _: object) -> None:
        # The head is applied through its weight, inside the root unit's forward, which
        # has gathered it by the time this hook runs (it was registered after FSDP's).
        weight = unit.model.get_output_embeddings().weight
        assert not isinstance(weight, DTensor), "the root unit's weights are not gathered"
        seen["lm_head"] = weight.dtype

    trainer.model.get_submodule("model.layers.0.mlp.up_proj").register_forward_pre_hook(note_layer)
    trainer._logprobs.register_forward_pre_hook(note_head)
    metrics = [trainer.step(batch).model_dump() for _ in range(STEPS)]
    trainer.save_model(folder)
    return metrics, seen


def test_two_ranks_in_bf16_step_as_one_rank_in_bf16(tmp_path):
    """`mixed_precision = "bfloat16"`: the decoder layers gather and compute in bf16 and the
    head in fp32, and two ranks step as one rank of the same policy (which no config asks
    for: in one process `precision` is the key) to bf16 rounding.

    Why these tolerances: both compute the same bf16 products of the same bf16 weights, and
    differ only in the order of fp32 sums (the reduce over ranks, and kernels split over
    half the threads). Such an order moves a sum by ~1e-7 relative, which flips a value's
    bf16 rounding only near a rounding midpoint: one bf16 ulp, 2^-8 relative, of a few
    values. So a metric may differ by a few bf16 ulps of itself (rel 2^-8 x 4), and, the
    KL and clip fractions starting at 0, by as much in absolute terms on the scale of
    their terms. A weight moves at most ~lr per Adam step in either run, and two runs can
    only disagree where bf16 noise flips a gradient's sign: at most 2 lr per step."""
    batch = _batch()
    two = CASES["token_mean_kl"].model_copy(
        update={"world_size": 2, "mixed_precision": "bfloat16", "collective_timeout_s": 120}
    )
    one = two.model_copy(update={"world_size": 1})  # unvalidated: one rank of FSDP
    got, dtypes = run_on_ranks(two, _mixed_on_rank, two, batch, tmp_path / "two")
    want, _ = run_on_ranks(one, _mixed_on_rank, one, batch, tmp_path / "one")
    assert dtypes == {"model.layers.0.mlp.up_proj": torch.bfloat16, "lm_head": torch.float32}
    for step_got, step_want in zip(got, want, strict=True):
        # ...but a token whose ratio lies within bf16 rounding of a clip bound may count on
        # either side: a fraction may differ by one token
        fractions = {k for k in step_want if k.endswith("_fraction")}
        one_token = 1.0 / step_want["trained_tokens"]
        for key in fractions:
            assert step_got[key] == pytest.approx(step_want[key], abs=one_token), key
        others = {k: v for k, v in step_want.items() if k not in fractions}
        assert {k: step_got[k] for k in others} == pytest.approx(others, rel=4 * 2**-8, abs=1e-4)
    assert got[1]["kl"] != 0.0
    two_model = AutoModelForCausalLM.from_pretrained(tmp_path / "two")
    one_model = AutoModelForCausalLM.from_pretrained(tmp_path / "one")
    initial = load_model("tiny-random")[0]
    for name, param in one_model.named_parameters():
        moved = two_model.get_parameter(name)
        torch.testing.assert_close(moved, param, atol=2 * STEPS * OPTIM.lr, rtol=0.0)
        assert not torch.equal(moved, initial.get_parameter(name))  # every parameter trained


def _built_on_rank(spec: TrainerSpec) -> dict[str, object]:
    """`build_sharded` on this rank, rank 1 unable to load any model and watched as it
    takes its weights; what rank 1 saw, and the whole weights the ranks hold."""
    watched: dict[str, object] = {"loads": []}
    if dist.get_rank() == 1:

        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"rank 1 loaded a model: {args}")

        def loading(model: torch.nn.Module, weights: dict, options: object) -> object:
            params = dict(model.named_parameters())
            watched["loads"].append(
                {
                    "given": len(weights),
                    "sharded": all(isinstance(p, DTensor) for p in params.values()),
                    "held": sum(p.to_local().numel() for p in params.values()),
                    "whole": sum(p.numel() for p in params.values()),
                }
            )
            return set_model_state_dict(model, weights, options=options)

        sharded_module.load_trainable = sharded_module.load_model = refuse
        sharded_module.set_model_state_dict = loading
    trainer = build_sharded(spec)
    watched["buffers"] = {n: b.clone() for n, b in trainer.model.named_buffers()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    whole = get_model_state_dict(trainer.model, options=options)
    from_rank_1 = [watched]
    dist.broadcast_object_list(from_rank_1, src=1)
    return {"rank_1": from_rank_1[0], "rank_0_buffers": watched["buffers"], "whole": whole}


def test_rank_1_never_holds_the_whole_model():
    """Rank 1 loads no model: it builds the policy and the KL reference on the meta device,
    shards them, and only then takes its half of rank 0's weights (broadcast a tensor at a
    time), rotary buffers included, so that the ranks hold exactly the loaded model."""
    config = CASES["token_mean_kl"].model_copy(
        update={"world_size": 2, "collective_timeout_s": 120}
    )
    spec = TrainerSpec("tiny-random", config, OPTIM, total_steps=STEPS)
    built = run_on_ranks(config, _built_on_rank, spec)
    loaded = load_model("tiny-random")[0]
    whole = sum(p.numel() for p in loaded.parameters())
    half = sum(-(-p.shape[0] // 2) * p[0].numel() for p in loaded.parameters())  # rows cut in 2
    loads = built["rank_1"]["loads"]
    assert len(loads) == 2  # the policy and the reference
    for load in loads:
        assert load["given"] == 0 and load["sharded"] and load["whole"] == whole
        assert load["held"] <= half
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(built["whole"][name], tensor), name
    for name, buffer in built["rank_0_buffers"].items():
        assert torch.equal(built["rank_1"]["buffers"][name], buffer), name
        assert torch.equal(buffer, loaded.get_buffer(name)), name


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


class _Elsewhere(LocalRanks):
    """Ranks taken for ones off the driver's node, as Ray actors may be: what they write
    for the driver must come back by value, and a checkpoint must reach them so."""

    here = False


def test_ranks_off_the_drivers_node_send_what_they_write_and_resume_by_value(tmp_path):
    """The weights, a checkpoint's model and each rank's optimizer shard sent back by
    value are what the ranks write by path; a checkpoint the driver reads and sends
    resumes the ranks where they were, as one read by path does."""
    config = TrainerConfig(world_size=2, collective_timeout_s=120)
    spec = TrainerSpec("tiny-random", config, OPTIM, total_steps=3)
    batch = _batch()
    next_steps = {}
    for where, ranks in (("here", LocalRanks), ("there", _Elsewhere)):
        trainer = TrainerRanks(ranks(config, RankTrainer, spec))
        try:
            trainer.step(batch)
            _checkpoint(trainer, tmp_path / where)
            trainer.write_weights(tmp_path / f"{where}.safetensors")
            next_steps[where] = trainer.step(batch).model_dump()
        finally:
            trainer.close()
    here, there = (tmp_path / w / "checkpoints" / "step_00001" for w in ("here", "there"))
    files = sorted(p.relative_to(here) for p in here.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(there) for p in there.rglob("*") if p.is_file())
    assert {OPTIMIZER + "/__0_0.distcp", OPTIMIZER + "/__1_0.distcp"} <= set(map(str, files))
    for name in files:
        if name.parts[0] != OPTIMIZER and name.name != TRAINER_STATE:  # RNG states differ
            assert (here / name).read_bytes() == (there / name).read_bytes(), name
    _assert_same_state(_saved_optimizer(there, tmp_path), _saved_optimizer(here, tmp_path))
    weights = load_file(tmp_path / "here.safetensors")
    assert weights.keys() == load_file(tmp_path / "there.safetensors").keys()
    for name, tensor in load_file(tmp_path / "there.safetensors").items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)

    for ranks in (LocalRanks, _Elsewhere):
        resumed = TrainerRanks(ranks(config, RankTrainer, spec))
        try:
            resumed.resume(there)
            assert resumed.step(batch).model_dump() == pytest.approx(next_steps["there"])
        finally:
            resumed.close()
