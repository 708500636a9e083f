"""The trainer's config sections: optimizer, trainer options, LoRA, SFT data, and the
algorithm (`train/algorithm.py`). Unknown keys are rejected when the config is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from reinforge.train.algorithm import AlgorithmConfig, Keep, TruncatedConfig
from reinforge.train.token_weights import ConstantNorm
from reinforge.types import Section, Status


class OptimConfig(Section):
    """AdamW over the trainable parameters."""

    lr: float = Field(1e-5, gt=0.0)
    """Learning rate after warm-up."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW's decoupled weight decay."""
    warmup_steps: int = Field(0, ge=0)
    """Steps over which the learning rate rises linearly from lr / warmup_steps to lr."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or cosine decay to 0 at the last step."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Gradients are scaled so their global norm is at most this."""


class LoRAConfig(Section):
    """Low-rank adapters through PEFT: only the adapters train, the base stays frozen."""

    rank: int = Field(16, ge=1)
    """Rank of each adapter's low-rank update."""
    alpha: float = Field(32.0, gt=0.0)
    """The update is scaled by alpha / rank."""
    target_modules: str | list[str] = "all-linear"
    """PEFT's module selection: "all-linear" (every linear layer but the LM head) or names,
    `lm_head` not among them (the trainer applies the head as a plain linear layer)."""

    @field_validator("target_modules")
    @classmethod
    def _not_the_head(cls, names: str | list[str]) -> str | list[str]:
        if isinstance(names, list) and "lm_head" in names:
            raise ValueError("the LM head cannot take an adapter: leave lm_head out")
        return names


class TrainerConfig(Section):
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    micro_batch_tokens: int = Field(1024, ge=1)
    """Token budget of one forward/backward: rows x longest row, a prefix all its rows share
    counted once (a group's prompt runs once for its rollouts, except under
    `gradient_checkpointing`); gradients accumulate. Activations grow with it (~1.4 MB per
    token for SmolLM2-135M in fp32); on a CPU 1024 was both leaner and faster than 4096
    (benchmarks/train_step.py)."""
    precision: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: the decoder's matmuls run in bf16 under autocast (AMX on recent x86 CPUs,
    tensor cores on GPUs); weights, gradients, optimizer state, the LM head and the
    log-softmax stay float32."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward: less memory, more compute."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters instead of every weight; None: full fine-tuning."""
    truncated: TruncatedConfig = Field(default_factory=Keep)
    """A completion cut off by a token or turn limit, or stopped in a loop
    (`rollout.sampling.stop_loops`): keep (train on it with its reward), mask (it still
    counts in its group's baseline but is left out of the loss, DAPO's overlong filtering)
    or penalize (its reward becomes `reward`). A kind alone may be a string:
    `truncated = "mask"`."""
    uniform_groups: Literal["skip", "count"] = "skip"
    """A group whose rewards are all equal trains nothing either way (its advantages are
    0). skip: a step's loss averages over the groups that vary, so a step that found one
    moves the weights as far as one that found `rollout.tasks_per_step`. count: the
    advantages are scaled by the share of the step's groups that vary, as if the uniform
    ones were in the batch with advantage 0 (GRPO's batch), so a step that found little
    signal moves little; groups set aside by `loop.uniform_redraws` do not count."""
    updates_per_batch: int = Field(1, ge=1)
    """Optimizer steps on each batch, every one over all of it (GRPO's iterations mu, PPO's
    epochs): more learning from each rollout, at the cost of that many passes of forward
    and backward. After the first, the PPO ratio measures how far the batch has moved the
    policy and the clip stops the tokens it has moved far enough; the KL reference's
    log-probs and a correction's proximal ones are those of the first pass. The schedule
    advances once per batch, and the run's engines get the weights of the last update:
    one policy version per batch. An engine sharing the trainer's weights stops decoding
    from the first update to the last; the time split counts that as training."""
    world_size: int = Field(1, ge=1)
    """Processes (ranks) training one model, each holding a shard of its weights, gradients
    and optimizer state (FSDP2) and running its share of each batch's micro-batches; gloo
    on CPU, NCCL with one GPU per rank. Placed by `cluster`; with more than one, the run's
    engines are processes too. A checkpoint resumes on any world size (docs/scale.md)."""
    mixed_precision: Literal["float32", "bfloat16"] = "float32"
    """A sharded trainer's (`world_size` > 1) FSDP policy. bfloat16: each decoder layer's
    weights are gathered and computed with in bf16 (half the all-gather bytes) and its
    gradients reduced over ranks in float32; the weights the ranks keep, the optimizer
    state, and the embedding, final norm and LM head stay float32, as the log-softmax
    needs. Apart from `precision` (autocast), which may be set too."""
    collective_timeout_s: float = Field(600.0, gt=0.0)
    """How long a rank waits in a collective for the others before it fails, so a dead or
    stuck rank ends the run with an error instead of a hang. Long enough for the slowest
    step, and for rank 0 saving a checkpoint while the others wait."""

    @model_validator(mode="after")
    def _mixed_precision_is_fsdps(self) -> Self:
        if self.mixed_precision != "float32" and self.world_size == 1:
            raise ValueError(
                f'trainer.mixed_precision is "{self.mixed_precision}", a sharded trainer\'s '
                "policy: it needs trainer.world_size > 1 (in one process, trainer.precision "
                "runs the decoder in bf16)"
            )
        return self

    def for_budget(self, max_sampled_tokens: int) -> Self:
        """This config with a constant-norm aggregation that names no constant given the
        environment's generation budget, so the value is derived, not asked for twice."""
        aggregation = self.algorithm.loss.aggregation
        if not isinstance(aggregation, ConstantNorm) or aggregation.max_tokens is not None:
            return self
        loss = self.algorithm.loss.model_copy(
            update={"aggregation": ConstantNorm(max_tokens=max_sampled_tokens)}
        )
        algorithm = self.algorithm.model_copy(update={"loss": loss})
        return self.model_copy(update={"algorithm": algorithm})


class SFTConfig(Section):
    """`reinforge sft`: supervised warm-up on stored trajectories. The model, optimizer,
    trainer and run sections apply as in RL; `run.steps` is derived from the data."""

    data: list[Path] = Field(default_factory=list)
    """Trajectory JSONL files, or folders: a `reinforge eval` output (trajectories.jsonl)
    or a training run (trajectories/*.jsonl)."""
    min_reward: float | None = None
    """Keep only trajectories whose reward is at least this; None keeps every reward."""
    statuses: list[Status] = Field(default_factory=lambda: [Status.OK])
    """Keep only trajectories that ended so; a truncated one teaches an unfinished answer."""
    epochs: int = Field(1, ge=1)
    """Passes over the kept trajectories, each in a new order drawn from run.seed."""
    batch_size: int = Field(32, ge=1)
    """Trajectories per optimizer step."""

    @field_validator("data", mode="before")
    @classmethod
    def _one_path(cls, value: Any) -> Any:
        """`sft.data=runs/eval-arith` on the command line is one path, not a list."""
        return [value] if isinstance(value, str | Path) else value
