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
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import PreTrainedModel

from reinforge.policy.models import quiet_progress, resolve_device
from reinforge.train.batching import TrainBatch
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.logprobs import SelectiveLogprobs
from reinforge.train.ranks import Ranks
from reinforge.train.trainable import is_adapter
from reinforge.train.trainer import Trainer, TrainerSpec, TrainStats, build_trainer


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
        device = resolve_device("auto")  # this rank's own GPU (`join_group` set it), or the CPU
        self._mesh = init_device_mesh(device.type, (self.world_size,))
        super().__init__(model.to(device), config, optim, total_steps, reference)

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
        mine = plan[self.rank :: self.world_size]
        totals = super()._accumulate(batch, mine)
        rounds = -(-len(plan) // self.world_size)  # ceil
        for _ in range(rounds - len(mine)):
            rows = plan[-1][-1:]
            idle = batch.select(rows)
            zeros = torch.zeros(idle.target_mask.shape, device=self.device)  # (1, t)
            for name, value in self._backward(idle, rows, zeros, share=0.0).items():
                totals[name] = totals.get(name, 0.0) + value
        names = sorted(totals)  # the same order on every rank
        summed = torch.tensor([totals[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return {**totals, **dict(zip(names, summed.tolist(), strict=True))}

    def save_model(self, folder: Path) -> None:
        """The complete model in Hugging Face format in `folder`, gathered to rank 0 and
        written by it alone; every rank must call it, and returns once it is written."""
        weights = self._gathered()
        if self.rank == 0:
            with quiet_progress():
                self.model.save_pretrained(folder, state_dict=weights)
        dist.barrier()

    def write_weights(self, path: Path) -> None:
        """The complete weights as one safetensors file for the engines, gathered to rank 0
        and written by it alone, under the names a one-process trainer writes them."""
        weights = self._gathered()
        if self.rank == 0:
            names = [name for name, _ in self.model.named_parameters()]  # no tied duplicate
            save_file({name: weights[name].contiguous() for name in names}, path)
        dist.barrier()

    def _gathered(self) -> dict[str, Any]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def _saved(self, value: Any) -> Any:
        """An optimizer state entry as a one-process trainer's checkpoint holds it: a
        sharded tensor gathered whole (a collective: every rank must call `state_dict`),
        on the CPU. So a checkpoint resumes on any world size."""
        return super()._saved(value.full_tensor() if isinstance(value, DTensor) else value)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A `state_dict` of any world size (1 included): each rank keeps its shard."""
        optimizer = state["optimizer"]
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        sharded = {
            index: {key: _shard_like(value, params[index]) for key, value in entry.items()}
            for index, entry in optimizer["state"].items()
        }
        super().load_state_dict({**state, "optimizer": {**optimizer, "state": sharded}})


def _shard_like(value: Any, param: torch.Tensor) -> Any:
    """This rank's shard of a whole optimizer state entry of `param`, cut as FSDP cut
    `param`; scalars (Adam's step) whole. Copies, never views: the optimizer updates its
    state in place, and a state handed between processes may be shared memory (ranks
    incrementing one shared step would each see the other's steps)."""
    if not isinstance(value, torch.Tensor):
        return value
    if not isinstance(param, DTensor) or value.shape != param.shape:
        return value.clone()
    whole = value.to(param.device, copy=True)
    return distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)


class RankTrainer:
    """The object each rank holds (`Ranks`' factory): a `ShardedTrainer` that the driving
    process calls, every rank at once."""

    def __init__(self, rank: int, spec: TrainerSpec) -> None:
        self.rank = rank
        self.trainer = build_trainer(ShardedTrainer, spec)

    def step(self, batch: TrainBatch) -> TrainStats:
        return self.trainer.step(batch)

    def write_weights(self, path: Path) -> None:
        self.trainer.write_weights(path)

    def save_model(self, folder: Path) -> None:
        self.trainer.save_model(folder)

    def state_dict(self) -> dict[str, Any] | None:
        """Every rank gathers (a collective); rank 0 alone answers, as only its answer is
        kept: a whole optimizer state sent back by every rank would be W times the bytes."""
        state = self.trainer.state_dict()
        return state if self.rank == 0 else None


class TrainerRanks:
    """A sharded trainer, driven from the run's process: each call runs on every rank (a
    round of collectives) and answers with rank 0's result, which is the whole batch's."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def step(self, batch: TrainBatch) -> TrainStats:
        return self.ranks.call("step", batch)[0]

    def write_weights(self, path: Path) -> None:
        self.ranks.call("write_weights", path)

    def save_model(self, folder: Path) -> None:
        self.ranks.call("save_model", folder)

    def state_dict(self) -> dict[str, Any]:
        return self.ranks.call("state_dict")[0]

    def close(self) -> None:
        self.ranks.stop()
