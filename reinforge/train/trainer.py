"""The trainer: a batch of scored trajectories in, one or more optimizer steps out.

The algorithm (advantage, loss, aggregation) comes from the typed config; this class only
batches, accumulates over micro-batches, clips and steps, the same for RL and for SFT (whose
loss is one more config). Zero-variance groups (unless a teacher scored them) and errored
rollouts never reach it: `select_for_training` leaves them out.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from pydantic import ConfigDict
from safetensors.torch import save_file
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from transformers import PreTrainedModel

from reinforge.policy.config import ModelConfig
from reinforge.policy.models import load_model, resolve_device
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.checkpoints import OPTIMIZER, load_trainer_state
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.distill import DistillConfig
from reinforge.train.logprobs import SelectiveLogprobs
from reinforge.train.losses import masked_mean
from reinforge.train.memory import release_freed_memory
from reinforge.train.trainable import (
    full_weights,
    is_adapter,
    load_trainable,
    reference_context,
    save_model,
)
from reinforge.types import Group, Record, Status, Trajectory


class TrainStats(Record):
    """One batch's optimizer steps: the trainer's numbers, and beside them the loss's own
    (named by the loss: `PolicyMetrics.scalars`, `LikelihoodMetrics.scalars`), since the
    loss is configurable. Each is averaged over the step's trained tokens, then over its
    `updates_per_batch` passes."""

    model_config = ConfigDict(extra="allow")

    loss: float
    entropy: float
    """Mean entropy of the policy's next-token distribution over the trained tokens."""
    grad_norm: float
    """Before clipping."""
    lr: float
    """The rate of the step that follows."""
    trained_tokens: float


@dataclass
class Selection:
    """The trajectories that train this step, their advantages, and what was left out."""

    trajectories: list[Trajectory] = field(default_factory=list)
    advantages: list[float | list[float]] = field(default_factory=list)
    """One per trajectory, or one per sampled token of a taught one (distillation)."""
    zero_variance_groups: int = 0
    masked_truncated: int = 0
    """Truncated completions left out of the loss (`truncated = "mask"`)."""
    scale: float = 1.0
    """What the advantages are multiplied by in the batch: the share of the step's groups
    that vary under `uniform_groups = "count"`, else 1."""

    def batch(self) -> TrainBatch:
        batch = TrainBatch.from_trajectories(self.trajectories, self.advantages)
        if self.scale == 1.0 or batch.advantages is None:
            return batch
        return replace(batch, advantages=batch.advantages * self.scale)  # (B, 1) or (B, T)


def select_for_training(
    groups: list[Group],
    config: TrainerConfig,
    distill: DistillConfig | None = None,
    set_aside: int = 0,
) -> Selection:
    """Errored rollouts are excluded before advantages, so they do not shift
    a group's mean; a group whose rewards are all equal carries no signal and is skipped,
    unless a teacher scored it (`distill`): its tokens' distillation advantages still teach.
    Truncated completions are handled as `config.truncated` says. `set_aside`: how many
    of the uniform groups `loop.uniform_redraws` drew others in place of (they do not
    count in the step's share of groups that vary)."""
    selection = Selection()
    for group in groups:
        usable = [t for t in group.trajectories if trainable(t)]
        taught = distill is not None and bool(usable) and all(t.teacher_logprobs for t in usable)
        if not taught and not rewards_vary(group, config):
            selection.zero_variance_groups += 1
            continue
        # float32: the dtype in which the rubric checks that every reward is finite
        trained_rewards = [config.truncated.training_reward(t) for t in usable]
        rewards = torch.tensor(trained_rewards, dtype=torch.float32)
        advantages = config.algorithm.advantage.compute(rewards)  # (G,)
        for trajectory, advantage in zip(usable, advantages.tolist(), strict=True):
            if not config.truncated.trains(trajectory):
                selection.masked_truncated += 1
                continue
            selection.trajectories.append(trajectory)
            if distill is not None and taught:
                selection.advantages.append(distill.token_advantages(trajectory, advantage))
            else:
                selection.advantages.append(advantage)
    if config.uniform_groups == "count" and len(groups) > set_aside:
        varying = len(groups) - selection.zero_variance_groups
        selection.scale = varying / (len(groups) - set_aside)
    return selection


def rewards_vary(group: Group, config: TrainerConfig) -> bool:
    """Whether two or more of the group's trainable rollouts have different rewards: what
    a group that no teacher scored needs for any advantage to be nonzero."""
    rewards = [config.truncated.training_reward(t) for t in group.trajectories if trainable(t)]
    return len(rewards) >= 2 and max(rewards) != min(rewards)


def trainable(trajectory: Trajectory) -> bool:
    """Whether a rollout may take part in the gradient: scored, with sampled tokens."""
    return trajectory.status in (Status.OK, Status.TRUNCATED) and bool(trajectory.logprobs)


class _FirstPass(NamedTuple):
    """What a micro-batch's first pass leaves for the batch's later updates."""

    ref_logp: Tensor | None
    """(b, t): the KL reference's log-probs; None without a KL term."""
    proximal_logp: Tensor
    """(b, t), detached: the trainer's own, the anchor of an off-policy correction."""


class PolicyTrainer(Protocol):
    """What the loop and the run's checkpoints need of a trainer: the `Trainer` in the
    run's process, or `TrainerRanks` driving a sharded one in other processes."""

    def step(self, batch: TrainBatch) -> TrainStats: ...

    def write_weights(self, path: Path) -> None: ...

    def save_model(self, folder: Path) -> None: ...

    def save_optimizer(self, folder: Path) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Trainer:
    """AdamW over the trainable parameters, micro-batched forward/backward,
    `config.updates_per_batch` steps per call.

    `reference` is the frozen model of the KL term, needed when the loss has `kl_coef > 0`;
    a LoRA model needs none (its base, adapters off, is the reference). The trainer
    computes where `model` is (`build_trainer` puts it and the reference on `model.device`)
    and moves each batch there.
    """

    sharded: ClassVar[bool] = False
    """Whether it is one rank of several, which save and load the optimizer state together."""

    def __init__(
        self,
        model: PreTrainedModel,
        config: TrainerConfig,
        optim: OptimConfig,
        total_steps: int,
        reference: PreTrainedModel | None = None,
    ) -> None:
        self.model = model
        self.device = model.device
        self.config = config
        self.loss = config.algorithm.loss
        if self.loss.needs_reference and reference is None and not is_adapter(model):
            raise ValueError("the loss has kl_coef > 0: pass the frozen reference model")
        # Made before the optimizer: a sharded trainer's modules hold sharded parameters.
        self._logprobs = self._logprob_module(model)
        self._ref_logprobs = (
            self._logprobs if reference is None else self._logprob_module(reference)
        )
        # Fused: one kernel over all parameters, where torch's default on CPU loops over
        # them (the main job's optimizer step, its `time.sync_s`: 0.21 s against 0.48-0.60).
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            fused=True,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _schedule(optim, total_steps)
        )
        self.grad_clip = optim.grad_clip
        self._first_pass: dict[tuple[int, ...], _FirstPass] = {}
        """Per micro-batch (its rows), during a step: what its first pass computed."""

    def step(self, batch: TrainBatch) -> TrainStats:
        """`config.updates_per_batch` optimizer steps over the whole batch, each accumulated
        over micro-batches; the schedule advances once. Whoever reads the model's tensors
        meanwhile guards its reads with the optimizer's step hooks
        (`orchestrate.weight_sync.SharedWeights`): the trainer knows nothing of readers."""
        plan = micro_batches(batch, self.config.micro_batch_tokens, self._share_prefix)
        batch = batch.to(self.device)
        self.model.train()
        self._first_pass = {}
        passes = [self._gradients(batch, plan)]
        for _ in range(self.config.updates_per_batch - 1):
            self._optimizer_step()
            passes.append(self._gradients(batch, plan))
        self._optimizer_step()
        self.scheduler.step()
        self._first_pass = {}  # a batch's log-probs, not kept past its step
        self.model.eval()
        release_freed_memory()  # the step's activations, freed but kept by the allocator
        return TrainStats(
            **{name: sum(p[name] for p in passes) / len(passes) for name in passes[0]},
            lr=self.scheduler.get_last_lr()[0],
            trained_tokens=float(batch.target_mask.sum()),
        )

    def _gradients(self, batch: TrainBatch, plan: list[list[int]]) -> dict[str, float]:
        """One pass of forward and backward over the batch, its gradients clipped; its loss,
        metrics and grad norm (before clipping)."""
        totals = self._accumulate(batch, plan)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        return {**totals, "grad_norm": float(grad_norm)}

    def _optimizer_step(self) -> None:
        self.optimizer.step()
        # The fused step writes the parameters without bumping their version counters, as
        # torch's own in-place ops do: bumped here, a reader that tells a change by them
        # (the engine's laid-out weights, `policy.decode`) sees the step.
        for group in self.optimizer.param_groups:
            torch.autograd.graph.increment_version(group["params"])
        self.optimizer.zero_grad(set_to_none=True)

    def _accumulate(self, batch: TrainBatch, plan: list[list[int]]) -> dict[str, float]:
        """Forward and backward of the micro-batches `plan` lists (rows of `batch`), their
        gradients adding up; returns their loss and metrics, each micro-batch's metrics
        weighted by its share of the batch's trained tokens.

        Weights and shares are the whole batch's, so any subset of its micro-batches gives
        exactly its part of the whole batch's loss and gradient: what lets ranks split them.
        """
        weights = self.loss.aggregation.weights(batch.target_mask)  # (B, T)
        tokens = float(batch.target_mask.sum())
        totals: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
        for rows in plan:
            part = batch.select(rows)
            share = float(part.target_mask.sum()) / max(tokens, 1.0)
            done = self._backward(part, rows, weights[rows][:, : part.width], share)
            for name, value in done.items():
                totals[name] = totals.get(name, 0.0) + value
        return totals

    def _backward(
        self, part: TrainBatch, rows: list[int], weights: Tensor, share: float
    ) -> dict[str, float]:
        """Forward and backward of one micro-batch, the batch's `rows`; returns its loss and
        its metrics times `share`. weights: (b, t), its rows of the whole batch's
        aggregation weights.

        The first pass over the batch keeps what stays fixed over its updates: the
        reference's log-probs (for the KL) and its own, detached, as the proximal policy of
        an off-policy correction."""
        key = tuple(rows)
        first = self._first_pass.get(key)
        ref_logp = self._reference_logprobs(part) if first is None else first.ref_logp
        with self._autocast():
            logp, entropy = self._logprobs(part, with_entropy=True, share_prefix=self._share_prefix)
        if first is None:
            first = self._first_pass[key] = _FirstPass(ref_logp, logp.detach())
        loss, metrics = self.loss.batch_loss(
            logp, part, weights=weights, ref_logp=ref_logp, proximal_logp=first.proximal_logp
        )
        loss.backward()
        assert entropy is not None
        return {
            "loss": loss.item(),
            "entropy": float(masked_mean(entropy, part.target_mask)) * share,
            **{name: value * share for name, value in metrics.scalars().items()},
        }

    def _logprob_module(self, model: PreTrainedModel) -> SelectiveLogprobs:
        """What the step calls for `model`'s log-probs; a sharded trainer shards it here."""
        return SelectiveLogprobs(model)

    def _autocast(self) -> torch.autocast:
        return torch.autocast(
            self.device.type,
            dtype=torch.bfloat16,
            enabled=self.config.precision == "bfloat16",
        )

    def _reference_logprobs(self, part: TrainBatch) -> Tensor | None:
        """The frozen reference's log-probs of this micro-batch, when the loss has a KL."""
        if not self.loss.needs_reference:
            return None
        with torch.no_grad(), reference_context(self.model), self._autocast():
            logp, _ = self._ref_logprobs(part, share_prefix=self._share_prefix)
        return logp  # (b, t)

    @property
    def _share_prefix(self) -> bool:
        """Whether a micro-batch's shared prefix runs once: not where layers are
        recomputed in backward, which would drop the prefix's keys and values."""
        return not self.config.gradient_checkpointing

    def write_weights(self, path: Path) -> None:
        """The complete weights (LoRA merged) as one safetensors file, under the plain
        model's parameter names: what an engine holding its own copy loads."""
        with full_weights(self.model) as weights:
            save_file({name: t.detach().cpu().contiguous() for name, t in weights.items()}, path)

    def save_model(self, folder: Path) -> None:
        """The complete model in Hugging Face format (a checkpoint's weights)."""
        save_model(self.model, folder)

    def close(self) -> None:
        """Nothing to release in one process; a trainer over ranks stops them here."""

    def save_optimizer(self, folder: Path) -> None:
        """The optimizer state in `folder`, a torch.distributed.checkpoint keyed by parameter
        name: a sharded trainer's ranks each write their own shard (every rank must call it)
        and a trainer of any world size loads it, each taking its own shard of the saved
        tensors (`load_optimizer`)."""
        state = get_optimizer_state_dict(self.model, self.optimizer)
        with _one_process_quiet():
            dcp.save({"optimizer": state}, checkpoint_id=folder, no_dist=not self.sharded)

    def load_optimizer(self, folder: Path) -> None:
        """The optimizer state `save_optimizer` wrote, by a trainer of any world size."""
        state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}
        with _one_process_quiet():
            dcp.load(state, checkpoint_id=folder, no_dist=not self.sharded)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs besides the weights and the optimizer state: schedule and RNG
        state."""
        return {"scheduler": self.scheduler.state_dict(), "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])


@contextmanager
def _one_process_quiet() -> Iterator[None]:
    """Without its warning that no process group exists: one process is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


AnyTrainer = TypeVar("AnyTrainer", bound=Trainer)


@dataclass(frozen=True)
class TrainerSpec:
    """What a trainer is built from, in the run's process or on each rank: the model (its
    spec, or the checkpoint being resumed), its settings, the run's length, and where it
    computes."""

    model: str
    config: TrainerConfig
    optim: OptimConfig
    total_steps: int
    checkpoint: Path | None = None
    device: str = ModelConfig.model_fields["device"].default
    """`model.device`, resolved where the trainer is built (on each rank)."""


def build_trainer(kind: type[AnyTrainer], spec: TrainerSpec) -> AnyTrainer:
    """A `kind` trainer of `spec`'s model, resumed from its checkpoint when it names one.
    The KL reference is the configured model, not a resumed checkpoint; a LoRA model needs
    none (its base is the reference). Both go to `spec.device`; a sharded trainer's ranks
    each take their own GPU, or the CPU, as auto places them (the config allows no other
    device for them)."""
    device = resolve_device(spec.device)
    model, _ = load_trainable(spec.model, spec.config, spec.checkpoint)
    reference = None
    if spec.config.algorithm.loss.needs_reference and not is_adapter(model):
        reference = load_model(spec.model, "float32")[0].requires_grad_(False).to(device)
    trainer = kind(model.to(device), spec.config, spec.optim, spec.total_steps, reference)
    if spec.checkpoint is not None:
        resume(trainer, spec.checkpoint)
    return trainer


def resume(trainer: Trainer, checkpoint: Path) -> None:
    """`trainer` as `checkpoint` left it: optimizer, schedule and RNG state (its weights are
    the ones it was built from)."""
    trainer.load_optimizer(checkpoint / OPTIMIZER)
    trainer.load_state_dict(load_trainer_state(checkpoint))


def _schedule(optim: OptimConfig, total_steps: int):  # noqa: ANN202 - a LambdaLR factor
    def factor(step: int) -> float:
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(total_steps - optim.warmup_steps, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor
