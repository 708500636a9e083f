"""The trainer over several ranks: FSDP2 (`fully_shard`) shards the weights, gradients and
optimizer state, and each rank runs its share of every batch's micro-batches.

Every rank holds the whole batch (token ids and masks, small beside the model) and plans
the same micro-batches as one process would; rank r takes micro-batches r, r + W, r + 2W...
Aggregation weights come from the whole batch's mask on every rank, so the token-mean
divisor (or the sequence count, or the constant norm) is the global one with nothing to
all-reduce, and each rank's loss is exactly its part of the one-process loss. FSDP then sums
the ranks' gradients (its default divides by the world size: that would shrink them) and
the step is that of one process, to float rounding in the order of the sums. Pinned by
`test_two_ranks_step_as_one_process`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from transformers import PreTrainedModel

from reinforge.errors import UsageError
from reinforge.policy.models import quiet_progress
from reinforge.train.batching import TrainBatch
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.logprobs import SelectiveLogprobs
from reinforge.train.trainable import is_adapter
from reinforge.train.trainer import Trainer


class ShardedTrainer(Trainer):
    """The Trainer on one rank of a process group of `config.world_size` processes (as
    `run_on_ranks` starts them, or torchrun); every rank builds it from the same model and
    calls `step` with the same batch.

    Each decoder layer is an FSDP unit, and the module computing the log-probs is the root
    unit, holding the embedding, final norm and head (tied or not). A separate KL reference
    is sharded the same way. LoRA models are refused: not sharded yet.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        config: TrainerConfig,
        optim: OptimConfig,
        total_steps: int,
        reference: PreTrainedModel | None = None,
    ) -> None:
        if not dist.is_initialized() or dist.get_world_size() != config.world_size:
            raise ValueError(
                f"a sharded trainer runs in a process group of world_size "
                f"{config.world_size}: start the ranks with run_on_ranks or torchrun"
            )
        if is_adapter(model):
            raise ValueError("LoRA models are not sharded yet: train them with world_size 1")
        self.rank = dist.get_rank()
        self.world_size = config.world_size
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        super().__init__(model, config, optim, total_steps, reference)

    def _logprob_module(self, model: PreTrainedModel) -> SelectiveLogprobs:
        module = SelectiveLogprobs(model.to(self.device))
        layers = getattr(model.get_decoder(), "layers", None)
        if layers is None:
            raise ValueError(f"{type(model).__name__}: no decoder `layers` to shard by")
        for layer in layers:
            fully_shard(layer, mesh=self._mesh)
        fully_shard(module, mesh=self._mesh)
        for unit in module.modules():
            if isinstance(unit, FSDPModule):
                # The loss is already this rank's part of the whole batch's: sum, not mean.
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        return module

    def _accumulate(self, batch: TrainBatch, plan: list[list[int]]) -> dict[str, float]:
        """This rank's micro-batches of `plan`, then the loss and metrics summed over ranks.

        Every rank runs as many forward/backward passes, since each one is a round of FSDP
        collectives: a rank with a micro-batch fewer runs the batch's shortest row once more
        with zero weights, which adds nothing to the gradient or the metrics.
        """
        batch = batch.to(self.device)
        mine = plan[self.rank :: self.world_size]
        totals = super()._accumulate(batch, mine)
        rounds = -(-len(plan) // self.world_size)  # ceil
        for _ in range(rounds - len(mine)):
            idle = batch.select(plan[-1][-1:])
            zeros = torch.zeros(idle.target_mask.shape, device=self.device)  # (1, t)
            for name, value in self._backward(idle, zeros, share=0.0).items():
                totals[name] = totals.get(name, 0.0) + value
        names = sorted(totals)  # the same order on every rank
        summed = torch.tensor([totals[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return {**totals, **dict(zip(names, summed.tolist(), strict=True))}

    def save_model(self, folder: Path) -> None:
        """The complete model in Hugging Face format in `folder`, gathered to rank 0 and
        written by it alone; every rank must call it, and returns once it is written."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights: dict[str, Any] = get_model_state_dict(self.model, options=options)
        if self.rank == 0:
            with quiet_progress():
                self.model.save_pretrained(folder, state_dict=weights)
        dist.barrier()


def require_one_process(config: TrainerConfig) -> None:
    """The RL and SFT loops step one trainer in their own process so far: refuse a sharded
    config there, naming what does run sharded, rather than train on one rank."""
    if config.world_size > 1:
        raise UsageError(
            f"trainer.world_size = {config.world_size}: reinforge train and reinforge sft "
            "train in one process so far; sharded training (FSDP2) runs from Python: "
            "reinforge.train.sharded.ShardedTrainer on ranks that "
            "reinforge.train.ranks.run_on_ranks starts (docs/scale.md)"
        )
