"""The trainer: one optimizer step from scored trajectories.

The algorithm (advantage, loss, aggregation) comes from the typed config; this class only
batches, accumulates over micro-batches, clips and steps. Zero-variance groups and errored
rollouts never reach it: `select_for_training` leaves them out and counts them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from reinforge.config import OptimConfig, TrainerConfig
from reinforge.train.batching import TrainBatch, micro_batches
from reinforge.train.logprobs import selective_logprobs
from reinforge.train.losses import masked_mean
from reinforge.types import Group, Status, Trajectory


@dataclass
class Selection:
    """The trajectories that train this step, their advantages, and what was left out."""

    trajectories: list[Trajectory] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    zero_variance_groups: int = 0
    errored: int = 0


def select_for_training(groups: list[Group], config: TrainerConfig) -> Selection:
    """Errored rollouts are excluded (and counted) before advantages, so they do not shift
    a group's mean; a group whose rewards are all equal carries no signal and is skipped."""
    selection = Selection()
    for group in groups:
        usable = [
            t
            for t in group.trajectories
            if t.status in (Status.OK, Status.TRUNCATED) and t.logprobs
        ]
        selection.errored += len(group.trajectories) - len(usable)
        rewards = [t.reward for t in usable]
        if len(usable) < 2 or max(rewards) == min(rewards):
            selection.zero_variance_groups += 1
            continue
        advantages = config.algorithm.advantage.compute(torch.tensor(rewards))  # (G,)
        selection.trajectories.extend(usable)
        selection.advantages.extend(advantages.tolist())
    return selection


class Trainer:
    def __init__(
        self, model: PreTrainedModel, config: TrainerConfig, optim: OptimConfig, total_steps: int
    ) -> None:
        self.model = model
        self.config = config
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optim.lr,
            weight_decay=optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _schedule(optim, total_steps)
        )
        self.grad_clip = optim.grad_clip

    def step(self, selection: Selection) -> dict[str, float]:
        """One optimizer step over the selected trajectories; returns metrics."""
        loss_config = self.config.algorithm.loss
        batch = TrainBatch.from_trajectories(selection.trajectories, selection.advantages)
        weights = loss_config.aggregation.weights(batch.target_mask)  # (B, T)
        lengths = batch.lengths
        self.model.train()
        totals = {"loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "ratio": 0.0}
        tokens = float(batch.target_mask.sum())
        for rows in micro_batches(lengths, self.config.micro_batch_tokens):
            part = batch.select(rows)
            logp, entropy = selective_logprobs(
                self.model,
                part.input_ids,
                part.attention_mask,
                part.target_mask,
                part.targets,
                with_entropy=True,
            )  # (b, t), (b, t)
            part_weights = weights[rows][:, : part.width]  # (b, t)
            loss, metrics = loss_config.compute(
                logp,
                part.behaviour_logprobs,
                part.advantages,
                part.target_mask,
                weights=part_weights,
            )
            loss.backward()
            share = float(part.target_mask.sum()) / max(tokens, 1.0)
            totals["loss"] += loss.item()
            totals["clip_fraction"] += float(metrics.clip_fraction) * share
            totals["ratio"] += float(metrics.mean_ratio) * share
            assert entropy is not None
            totals["entropy"] += float(masked_mean(entropy, part.target_mask)) * share
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return {
            **totals,
            "grad_norm": float(grad_norm),
            "lr": self.scheduler.get_last_lr()[0],
            "trained_tokens": tokens,
        }

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs besides the weights: optimizer, schedule and RNG state."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])


def _schedule(optim: OptimConfig, total_steps: int):  # noqa: ANN202 - a LambdaLR factor
    def factor(step: int) -> float:
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(total_steps - optim.warmup_steps, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor
