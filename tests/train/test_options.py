"""Trainer options on real parts (tiny random Llama, real tokenizer, real engine): LoRA,
bf16 autocast, gradient checkpointing, the KL reference, truncation handling, and the
weights a separate sampler receives."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from reinforge.config import Config, load_config
from reinforge.envs.registry import load_environment
from reinforge.errors import ConfigError
from reinforge.orchestrate.weight_sync import SharedWeights
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import EngineConfig, SamplingConfig
from reinforge.policy.engine import Engine
from reinforge.policy.models import load_model, load_tokenizer
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.trainable import full_weights, load_trainable
from reinforge.train.trainer import Trainer, select_for_training
from reinforge.types import Group, Status, Task, Trajectory

from ..commands import LENGTH_ENV, tiny_train


@pytest.fixture
async def batch(tiny_engine) -> TrainBatch:
    """16 sampled completions of the tiny model, every one trained."""
    env = load_environment(LENGTH_ENV)
    client = PolicyClient.for_engine(tiny_engine, SamplingConfig())
    groups = await generate_groups(env, env.tasks(4), client, RolloutConfig(), 4, 1)
    trajectories = [t for g in groups for t in g.trajectories]
    return TrainBatch.from_trajectories(
        trajectories, [1.0 if i % 2 else -1.0 for i in range(len(trajectories))]
    )


def _trainer(*overrides: str, reference: torch.nn.Module | None = None):
    config = load_config(Config, None, ["optim.lr=1e-3", *overrides])
    model, _ = load_trainable("tiny-random", config.trainer)
    trainer = Trainer(model, config.trainer, config.optim, total_steps=4, reference=reference)
    return model, trainer


def test_a_step_bumps_the_version_of_every_trained_parameter(batch):
    """The fused optimizer writes in place without telling torch's version counters; a
    reader that tells a change by them (the engine's laid-out weights) must see the step."""
    model, trainer = _trainer()
    trained = [p for p in model.parameters() if p.requires_grad]
    versions = [p._version for p in trained]
    before = [p.detach().clone() for p in trained]
    trainer.step(batch)
    assert all(p._version > v for p, v in zip(trained, versions, strict=True))
    assert any(not torch.equal(p, b) for p, b in zip(trained, before, strict=True))


def test_lora_trains_the_adapters_and_leaves_the_base_frozen(batch):
    model, trainer = _trainer("trainer.lora.rank=4")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.step(batch)
    trainer.step(batch)  # lora_B starts at 0, so lora_A has no gradient until B moves
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable


def test_an_adapter_on_the_head_is_refused_in_one_line():
    # The trainer applies the head through its weight (`logprobs._HeadLogprobs`), so an
    # adapter there would be skipped without a word; the config refuses it instead.
    with pytest.raises(ConfigError, match="the LM head cannot take an adapter"):
        load_config(Config, None, ['trainer.lora.target_modules=["q_proj", "lm_head"]'])
    config = load_config(Config, None, ['trainer.lora.target_modules=["q_proj"]'])
    assert config.trainer.lora.target_modules == ["q_proj"]


def test_lora_weights_for_a_sampler_are_merged_and_the_adapter_restored(batch):
    model, trainer = _trainer("trainer.lora.rank=4")
    trainer.step(batch)
    trainer.step(batch)  # B != 0 now, so the merge changes the base weights
    plain, _ = load_model("tiny-random")
    with torch.no_grad():
        expected = plain(batch.input_ids, attention_mask=batch.attention_mask).logits
        adapted = model(batch.input_ids, attention_mask=batch.attention_mask).logits
        with full_weights(model) as weights:
            assert set(weights) == set(dict(plain.named_parameters()))
            for name, param in plain.named_parameters():
                param.copy_(weights[name])
        merged = plain(batch.input_ids, attention_mask=batch.attention_mask).logits
        after = model(batch.input_ids, attention_mask=batch.attention_mask).logits
    assert not torch.allclose(expected, adapted, atol=1e-4)  # the adapter does something
    torch.testing.assert_close(merged, adapted, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(after, adapted, atol=1e-5, rtol=1e-5)


def test_gradient_checkpointing_gives_the_same_gradients(batch):
    grads = []
    for flag in ("false", "true"):
        torch.manual_seed(0)
        model, trainer = _trainer(f"trainer.gradient_checkpointing={flag}")
        model.train()
        from reinforge.train.logprobs import selective_logprobs

        logp, _ = selective_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.target_mask, batch.targets
        )
        logp.sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_micro_batchs_shared_prompt_runs_once_but_not_under_checkpointing(batch, checkpointing):
    model, trainer = _trainer(f"trainer.gradient_checkpointing={str(checkpointing).lower()}")
    calls: list[tuple[int, int]] = []  # the decoder's inputs, (rows, columns), in order
    model.get_decoder().register_forward_hook(
        lambda _, args, kwargs, out: calls.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    trainer.step(batch)
    plan = micro_batches(batch, trainer.config.micro_batch_tokens, not checkpointing)
    expected: list[tuple[int, int]] = []
    for rows in plan:
        part = batch.select(rows)
        shared = 0 if checkpointing else part.shared_prefix
        expected += [(1, shared)] if shared else []
        expected.append((len(rows), part.width - shared))
    assert calls == expected
    # The tasks' prompts (the chat template's system turn and the task) run once a plan.
    assert any(shape[0] == 1 for shape in calls) != checkpointing
    assert len(plan) < len(batch.lengths)


def test_a_step_split_into_micro_batches_reports_the_stats_of_one_pass(batch):
    """Each micro-batch's metrics count by its share of the batch's trained tokens: summed
    over the plan they are the whole batch's, whatever the budget."""
    _, whole = _trainer("trainer.micro_batch_tokens=100000")
    _, split = _trainer("trainer.micro_batch_tokens=64")
    assert len(micro_batches(batch, 64)) > 2
    expected = whole.step(batch).model_dump()
    assert expected["entropy"] > 0 and expected["ratio"] > 0
    assert split.step(batch).model_dump() == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_bf16_autocast_trains_with_float32_weights_and_log_probs(batch):
    model, trainer = _trainer('trainer.precision="bfloat16"')
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = trainer.step(batch)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    # the behaviour log-probs came from the fp32 sampler: bf16 matmuls move the ratio a
    # little, the fp32 head keeps it close to 1
    assert 0.9 < metrics.ratio < 1.1 and torch.isfinite(torch.tensor(metrics.loss))


def test_kl_to_the_reference_is_zero_at_the_start_and_grows(batch):
    reference, _ = load_model("tiny-random")
    model, trainer = _trainer(
        "trainer.algorithm.loss.kl_coef=0.1", reference=reference.requires_grad_(False)
    )
    first = trainer.step(batch)
    second = trainer.step(batch)
    assert first.kl == 0.0 and second.kl > 0.0


def test_kl_with_lora_uses_the_base_as_reference(batch):
    _, trainer = _trainer("trainer.lora.rank=4", "trainer.algorithm.loss.kl_coef=0.1")
    first = trainer.step(batch)
    trainer.step(batch)
    assert first.kl == 0.0 and trainer.step(batch).kl > 0.0


def test_kl_without_a_reference_is_refused():
    with pytest.raises(ValueError, match="reference"):
        _trainer("trainer.algorithm.loss.kl_coef=0.1")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_updates_per_batch_behaviour_anchored_are_steps_on_the_same_batch(batch):
    """Against the behaviour policy, two updates of one batch are two steps on it; the
    KL reference's log-probs, kept from the first pass, are what the second would compute."""
    kl = "trainer.algorithm.loss.kl_coef=0.1"
    reference = load_model("tiny-random")[0].requires_grad_(False)
    twice, trainer = _trainer(kl, "trainer.updates_per_batch=2", reference=reference)
    stats = trainer.step(batch)
    once, single = _trainer(kl, reference=reference)
    first, second = single.step(batch), single.step(batch)
    for name, weight in _weights(once).items():
        torch.testing.assert_close(_weights(twice)[name], weight, atol=1e-6, rtol=1e-5)
    # the stats are the two passes' mean; the schedule advanced once
    assert stats.loss == pytest.approx((first.loss + second.loss) / 2, rel=1e-4)
    assert stats.kl == pytest.approx((first.kl + second.kl) / 2, rel=1e-3) and stats.kl > 0
    assert trainer.scheduler.last_epoch == 1 and single.scheduler.last_epoch == 2


def test_later_updates_of_a_batch_keep_the_first_pass_as_the_proximal_policy(batch):
    """Under a correction the anchor is the proximal policy: the first pass's log-probs on
    every update of the batch. Two separate steps re-anchor on their own forward, so the
    second one's ratio is 1 and nothing clips; the second update of one batch is clipped
    around where the batch started."""
    tis = 'trainer.algorithm.loss.correction.kind="tis"'
    _, trainer = _trainer(tis, "trainer.updates_per_batch=2", "optim.lr=1e-2")
    stats = trainer.step(batch)
    _, single = _trainer(tis, "optim.lr=1e-2")
    single.step(batch)
    assert single.step(batch).clip_fraction == 0.0
    assert stats.clip_fraction > 0.0  # the mean of 0 (first pass) and the second's


class _Watching:
    """A shared engine that notes what the weights were as its hold begins and ends."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.stats = SimpleNamespace(sync_s=0.0)
        self.seen: list[tuple[str, dict[str, torch.Tensor]]] = []

    @contextmanager
    def weight_update(self) -> Iterator[int]:
        self.seen.append(("update", _weights(self.model)))
        yield 1
        self.seen.append(("updated", _weights(self.model)))


@pytest.mark.parametrize("updates", [1, 3])
def test_a_shared_engine_decodes_no_weights_between_a_batchs_updates(batch, updates):
    """Held from before the first update to after the last, once: the version names the
    weights after the whole batch."""
    model, trainer = _trainer(f"trainer.updates_per_batch={updates}")
    start = _weights(model)
    engine = _Watching(model)
    sync = SharedWeights(engine)  # type: ignore[arg-type]
    with sync.training(trainer):
        trainer.step(batch)
        assert [event for event, _ in engine.seen] == ["update"]  # still held
    assert [event for event, _ in engine.seen] == ["update", "updated"]
    assert _same(engine.seen[0][1], start)
    assert not _same(engine.seen[1][1], start)
    trainer.step(batch)  # outside the sync's hold the optimizer's hook is gone
    assert len(engine.seen) == 2


def test_a_step_that_raises_ends_the_hold_without_a_new_version(batch, monkeypatch):
    model, trainer = _trainer()
    engine = Engine(model, load_tokenizer("tiny-random"), "tiny-random", EngineConfig())
    try:
        sync = SharedWeights(engine)
        monkeypatch.setattr(trainer.scheduler, "step", _raise)  # after the update
        with pytest.raises(RuntimeError, match="scheduler"), sync.training(trainer):
            trainer.step(batch)
        assert engine.version == 0
        with engine.weight_update():  # the hold was let go
            pass
        assert engine.version == 1
    finally:
        engine.close()


def _raise() -> None:
    raise RuntimeError("scheduler")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[name], b[name]) for name in a)


def _group(*rollouts: tuple[float, Status]) -> Group:
    return Group(
        task=Task(id="t", prompt=[]),
        trajectories=[
            Trajectory(
                task_id="t",
                group_id="t",
                index=i,
                token_ids=[1, 2],
                loss_mask=[0, 1],
                logprobs=[-1.0],
                reward=reward,
                status=status,
            )
            for i, (reward, status) in enumerate(rollouts)
        ],
    )


@pytest.mark.parametrize(
    ("policy", "trained", "advantages"),
    [
        # rewards 1, 0, 1 -> mean 2/3, sample std 0.577
        ("keep", [0, 1, 2], [0.5773, -1.1547, 0.5773]),
        # the truncated one still shapes the baseline, but is not trained on
        ("mask", [0, 1], [0.5773, -1.1547]),
        # its reward becomes -1: rewards 1, 0, -1 -> mean 0, std 1
        ("penalize", [0, 1, 2], [1.0, 0.0, -1.0]),
    ],
)
def test_truncated_completions_follow_the_policy(policy, trained, advantages):
    group = _group((1.0, Status.OK), (0.0, Status.OK), (1.0, Status.TRUNCATED))
    overrides = [f"trainer.truncated.kind={policy}"]
    if policy == "penalize":
        overrides.append("trainer.truncated.reward=-1.0")
    config = load_config(Config, None, overrides).trainer
    selection = select_for_training([group], config)
    assert [t.index for t in selection.trajectories] == trained
    assert selection.advantages == pytest.approx(advantages, abs=1e-3)
    assert selection.masked_truncated == (1 if policy == "mask" else 0)


@pytest.mark.parametrize(
    ("policy", "set_aside", "scale"),
    [
        ("skip", 0, 1.0),
        # 1 of the 4 groups varies: a quarter of the push of a step where all do
        ("count", 0, 0.25),
        # 2 of the 4 are uniform groups set aside for others: 1 varies of the 2 that count
        ("count", 2, 0.5),
    ],
)
def test_uniform_groups_count_scales_a_step_by_its_share_of_groups_that_vary(
    policy, set_aside, scale
):
    varied = _group((1.0, Status.OK), (0.0, Status.OK))
    uniform = [_group((1.0, Status.OK), (1.0, Status.OK)) for _ in range(3)]
    config = load_config(Config, None, [f'trainer.uniform_groups="{policy}"']).trainer
    selection = select_for_training([varied, *uniform], config, set_aside=set_aside)
    # rewards 1, 0 -> mean 0.5, sample std 0.707: advantages +-0.707, then scaled
    assert selection.advantages == pytest.approx([0.7071, -0.7071], abs=1e-3)
    assert selection.scale == scale
    batch = selection.batch()
    assert batch.advantages is not None
    assert batch.advantages.flatten().tolist() == pytest.approx(
        [0.7071 * scale, -0.7071 * scale], abs=1e-3
    )


def _run(tmp_path: Path, *extra: str) -> Path:
    result = subprocess.run(
        tiny_train(tmp_path, *extra), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return tmp_path / "r"


def test_a_lora_run_with_a_bf16_sampler_checkpoints_a_merged_model_and_resumes(tmp_path):
    run = _run(tmp_path, "trainer.lora.rank=4", 'engine.dtype="bfloat16"', "optim.lr=1e-3")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    assert all(r["time"]["sync_s"] > 0 for r in rows)
    checkpoint = run / "checkpoints" / "step_00002"
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(checkpoint)  # a plain model, no peft
    base, _ = load_model("tiny-random")
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    assert any(
        not torch.equal(p, dict(base.named_parameters())[n]) for n, p in merged.named_parameters()
    )
    config = load_config(Config, None, ["trainer.lora.rank=4"])
    resumed, _ = load_trainable("tiny-random", config.trainer, checkpoint)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(resumed(ids).logits, merged(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("updates", [1, 2])
def test_the_fp32_sampler_shares_the_trainers_weights(tmp_path, updates):
    """Whatever the updates per batch, one policy version per step."""
    run = _run(tmp_path, f"trainer.updates_per_batch={updates}")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the second step's rollouts came from the weights the first step trained
    steps = [
        [json.loads(line) for line in (run / "trajectories" / f"step_{s:05d}.jsonl").open()]
        for s in (1, 2)
    ]
    assert {v for t in steps[0] for v in t["policy_versions"]} == {0}
    assert {v for t in steps[1] for v in t["policy_versions"]} == {1}
    assert rows[1]["policy_version"] == 2
