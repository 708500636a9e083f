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

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import PreTrainedModel

from reinforge.policy.models import quiet_progress, resolve_device
from reinforge.train.batching import TrainBatch
from reinforge.train.checkpoints import load_model_weights, load_trainer_state
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
        weights = self.weights()
        if weights is not None:
            save_file(weights, path)
        dist.barrier()

    def weights(self) -> dict[str, torch.Tensor] | None:
        """The complete weights on the CPU, under the names a one-process trainer writes
        them, on rank 0; None on the others. Every rank must call it (a gather)."""
        weights = self._gathered()
        if self.rank != 0:
            return None
        names = [name for name, _ in self.model.named_parameters()]  # no tied duplicate
        return {name: weights[name].contiguous() for name in names}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Complete weights (a checkpoint's, which may lack a tied duplicate), each rank
        keeping its shard; every rank must call it with the same weights."""
        options = StateDictOptions(full_state_dict=True, strict=False)
        missing, unexpected = set_model_state_dict(self.model, weights, options=options)
        tied = {name for name in missing if name not in dict(self.model.named_parameters())}
        if set(missing) - tied or unexpected:
            raise ValueError(
                f"the weights do not fit the model: missing {sorted(set(missing) - tied)}, "
                f"unexpected {sorted(unexpected)}"
            )

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

    def weights(self) -> dict[str, torch.Tensor] | None:
        return self.trainer.weights()

    def save_model(self, folder: Path) -> None:
        self.trainer.save_model(folder)

    def model_files(self) -> dict[str, bytes] | None:
        """The checkpoint's model as `save_model` writes it, written by rank 0 in a folder
        of its own node and sent back as bytes (by their paths in the folder); None on the
        other ranks. For a rank 0 that may not see the driver's files."""
        with tempfile.TemporaryDirectory(prefix="reinforge-model-") as name:
            folder = Path(name)
            self.trainer.save_model(folder)
            if self.rank != 0:
                return None
            files = (path for path in folder.rglob("*") if path.is_file())
            return {str(path.relative_to(folder)): path.read_bytes() for path in files}

    def resume(self, weights: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        """A checkpoint's weights and trainer state, read by the driver and sent by value:
        a rank need not see the run directory."""
        self.trainer.load_weights(weights)
        self.trainer.load_state_dict(state)

    def state_dict(self) -> dict[str, Any] | None:
        """Every rank gathers (a collective); rank 0 alone answers, as only its answer is
        kept: a whole optimizer state sent back by every rank would be W times the bytes."""
        state = self.trainer.state_dict()
        return state if self.rank == 0 else None


class TrainerRanks:
    """A sharded trainer, driven from the run's process: each call runs on every rank (a
    round of collectives) and answers with rank 0's result, which is the whole batch's.

    Files of the driver's node (the engines' weights file, a checkpoint) are written by
    rank 0 by their paths when it runs on the driver's node, else it sends their contents
    and the driver writes them; a checkpoint to resume from is read by the driver and sent
    to every rank. So ranks on other machines need no storage shared with the driver."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def step(self, batch: TrainBatch) -> TrainStats:
        return self.ranks.call("step", batch)[0]

    def write_weights(self, path: Path) -> None:
        if self.ranks.rank0_here:
            self.ranks.call("write_weights", path)
        else:
            save_file(self.weights(), path)

    def weights(self) -> dict[str, torch.Tensor]:
        """The complete weights, sent by rank 0."""
        return self.ranks.call("weights")[0]

    def save_model(self, folder: Path) -> None:
        if self.ranks.rank0_here:
            self.ranks.call("save_model", folder)
            return
        for name, content in self.ranks.call("model_files")[0].items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)

    def resume(self, checkpoint: Path) -> None:
        """Every rank takes `checkpoint`'s weights and trainer state, read here once."""
        self.ranks.call("resume", load_model_weights(checkpoint), load_trainer_state(checkpoint))

    def state_dict(self) -> dict[str, Any]:
        return self.ranks.call("state_dict")[0]

    def close(self) -> None:
        self.ranks.stop()
