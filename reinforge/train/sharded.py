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

import sys
import tempfile
from dataclasses import dataclass
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
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from reinforge.policy.models import load_model, quiet_progress, resolve_device
from reinforge.train.batching import TrainBatch
from reinforge.train.checkpoints import load_model_weights
from reinforge.train.config import OptimConfig, TrainerConfig
from reinforge.train.logprobs import SelectiveLogprobs
from reinforge.train.ranks import Ranks
from reinforge.train.trainable import is_adapter, load_trainable
from reinforge.train.trainer import Trainer, TrainerSpec, TrainStats, resume


class ShardedTrainer(Trainer):
    """The Trainer on one rank of a process group of `config.world_size` processes (as
    `run_on_ranks` starts them, or torchrun); every rank builds it and calls `step` with the
    same batch.

    Only rank 0's `model` (and `reference`) is read: every rank builds the architecture on
    the meta device, shards it, and takes its shard of rank 0's weights, broadcast one
    tensor at a time; the other ranks may pass a model on the meta device
    (`Architecture.meta_model`), as `build_sharded` does, so that no rank but 0 ever holds
    the whole model.

    Each decoder layer is an FSDP unit, and the module computing the log-probs is the root
    unit, holding the embedding, final norm and head (tied or not). A separate KL reference
    is sharded the same way. LoRA models are refused: not sharded yet.
    """

    sharded = True

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
        self._precision = _policy(config)
        self._units: dict[int, SelectiveLogprobs] = {}
        sharded = self._shard(model, device)
        sharded_reference = None if reference is None else self._shard(reference, device)
        super().__init__(sharded, config, optim, total_steps, sharded_reference)

    def _shard(self, model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
        """A sharded copy of rank 0's `model` on `device`, its log-prob module kept for
        `_logprob_module`. Built on the meta device and sharded before any weight exists,
        then filled from rank 0 (non-persistent buffers, such as rotary frequencies, too)."""
        skeleton = Architecture.of(model).meta_model()
        module = SelectiveLogprobs(skeleton)
        layers = getattr(skeleton.get_decoder(), "layers", None)
        if layers is None:
            raise ValueError(f"{type(model).__name__}: no decoder `layers` to shard by")
        for layer in layers:
            fully_shard(layer, mesh=self._mesh, mp_policy=self._precision)
        # The root unit stays float32: the head's logits must (`logprobs._HeadLogprobs`).
        fully_shard(module, mesh=self._mesh)
        for unit in module.modules():
            if isinstance(unit, FSDPModule):
                # The loss is already this rank's part of the whole batch's: sum, not mean.
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        skeleton.to_empty(device=device)
        weights = model.state_dict() if self.rank == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(skeleton, weights, options=options)
        with torch.no_grad():
            for name, buffer in skeleton.named_buffers():
                if self.rank == 0:
                    buffer.copy_(model.get_buffer(name))
                dist.broadcast(buffer, src=0)
        self._units[id(skeleton)] = module
        return skeleton

    def _logprob_module(self, model: PreTrainedModel) -> SelectiveLogprobs:
        return self._units.pop(id(model))

    @property
    def _share_prefix(self) -> bool:
        """Never: a micro-batch whose prefix runs once calls every layer unit twice, and
        each call is a round of collectives that every rank must run alike."""
        return False

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
        """Complete weights (a checkpoint's, which may lack a tied duplicate) given to rank
        0 and broadcast, each rank keeping its shard; every rank must call it (the others
        with none)."""
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
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


@dataclass(frozen=True)
class Architecture:
    """What a rank needs of a model to shard it before any weight exists, small enough to
    send between ranks: its config, dtype, frozen parameters, mode and gradient
    checkpointing."""

    config: PretrainedConfig
    dtype: torch.dtype
    frozen: frozenset[str]
    checkpointing: bool
    training: bool

    @classmethod
    def of(cls, model: PreTrainedModel) -> Architecture:
        return cls(
            config=model.config,
            dtype=next(model.parameters()).dtype,
            frozen=frozenset(n for n, p in model.named_parameters() if not p.requires_grad),
            checkpointing=model.is_gradient_checkpointing,
            training=model.training,
        )

    def meta_model(self) -> PreTrainedModel:
        """The model on the meta device: no weight allocated."""
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)
        for name in self.frozen:
            model.get_parameter(name).requires_grad_(False)
        if self.checkpointing:
            kwargs = {"use_reentrant": False}  # as `load_trainable` enables it
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return model.train(self.training)


def _policy(config: TrainerConfig) -> MixedPrecisionPolicy:
    """FSDP's policy for the decoder layers: `trainer.mixed_precision` for the weights they
    gather and compute with, float32 for the gradients they reduce."""
    if config.mixed_precision == "float32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def build_sharded(spec: TrainerSpec) -> ShardedTrainer:
    """This rank's `ShardedTrainer` of `spec`: rank 0 alone loads the model (and the KL
    reference) and hands the other ranks its config, from which they build meta skeletons;
    resumed from `spec.checkpoint` when it names one, each rank reading its own shard of
    the optimizer state."""
    if spec.config.lora is not None:
        raise ValueError("LoRA models are not sharded yet: train them with world_size 1")
    needs_reference = spec.config.algorithm.loss.needs_reference
    reference = None
    if dist.get_rank() == 0:
        model, _ = load_trainable(spec.model, spec.config, spec.checkpoint)
        if needs_reference:
            reference = load_model(spec.model, "float32")[0].requires_grad_(False)
        shapes = [Architecture.of(m) if m is not None else None for m in (model, reference)]
    else:
        shapes = [None, None]
    dist.broadcast_object_list(shapes, src=0)
    if dist.get_rank() != 0:
        architecture, of_reference = shapes
        assert architecture is not None
        model = architecture.meta_model()
        reference = None if of_reference is None else of_reference.meta_model()
    trainer = ShardedTrainer(model, spec.config, spec.optim, spec.total_steps, reference)
    if spec.checkpoint is not None:
        resume(trainer, spec.checkpoint)
    return trainer


class RankTrainer:
    """The object each rank holds (`Ranks`' factory): a `ShardedTrainer` that the driving
    process calls, every rank at once."""

    def __init__(self, rank: int, spec: TrainerSpec) -> None:
        self.rank = rank
        self.trainer = build_sharded(spec)

    def step(self, batch: TrainBatch) -> TrainStats:
        return self.trainer.step(batch)

    def write_weights(self, path: Path) -> None:
        self.trainer.write_weights(path)

    def weights(self) -> dict[str, torch.Tensor] | None:
        return self.trainer.weights()

    def save_model(self, folder: Path) -> None:
        self.trainer.save_model(folder)

    def save_optimizer(self, folder: Path) -> None:
        self.trainer.save_optimizer(folder)

    def model_files(self) -> dict[str, bytes] | None:
        """The checkpoint's model as `save_model` writes it, written by rank 0 in a folder
        of its own node and sent back; None on the other ranks."""
        with tempfile.TemporaryDirectory(prefix="reinforge-model-") as name:
            self.trainer.save_model(Path(name))
            return read_files(Path(name)) if self.rank == 0 else None

    def optimizer_files(self) -> dict[str, bytes]:
        """This rank's shard of the optimizer state (rank 0's with the metadata), written
        in a folder of its own node and sent back."""
        with tempfile.TemporaryDirectory(prefix="reinforge-optimizer-") as name:
            self.trainer.save_optimizer(Path(name))
            return read_files(Path(name))

    def resume(self, checkpoint: Path) -> None:
        """The trainer as `checkpoint` left it: rank 0 reads the weights and broadcasts
        them, each rank reads its part of the optimizer state."""
        self.trainer.load_weights(load_model_weights(checkpoint) if self.rank == 0 else {})
        resume(self.trainer, checkpoint)

    def resume_from_files(self, files: dict[str, bytes]) -> None:
        """`resume` from a checkpoint's files, sent by the driver: a rank need not see the
        run directory."""
        with tempfile.TemporaryDirectory(prefix="reinforge-checkpoint-") as name:
            write_files(Path(name), files)
            self.resume(Path(name))

    def state_dict(self) -> dict[str, Any] | None:
        """Rank 0's alone: the only one kept."""
        return self.trainer.state_dict() if self.rank == 0 else None


class TrainerRanks:
    """A sharded trainer, driven from the run's process: each call runs on every rank (a
    round of collectives) and answers with rank 0's result, which is the whole batch's.

    Where every rank sees a folder as the driver does (`Ranks.sees`: the driver's machine,
    or storage they all mount at the same path), the ranks read and write the driver's
    files there by their paths (the engines' weights file, a checkpoint, each rank its
    own optimizer shard). Elsewhere they send what they write (rank 0 the weights and the
    model, each rank its shard of the optimizer state) and the driver writes it, and a
    checkpoint to resume from is read by the driver and sent to every rank: ranks on other
    machines need no storage shared with the driver, though every node then takes the
    whole checkpoint."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self._told = False

    def step(self, batch: TrainBatch) -> TrainStats:
        return self.ranks.call("step", batch)[0]

    def write_weights(self, path: Path) -> None:
        if self.ranks.sees(path.parent):
            self.ranks.call("write_weights", path)
        else:
            save_file(self.weights(), path)

    def weights(self) -> dict[str, torch.Tensor]:
        """The complete weights, sent by rank 0."""
        return self.ranks.call("weights")[0]

    def save_model(self, folder: Path) -> None:
        if self._sees(folder):
            self.ranks.call("save_model", folder)
        else:
            write_files(folder, self.ranks.call("model_files")[0])

    def save_optimizer(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        if self._sees(folder):
            self.ranks.call("save_optimizer", folder)
            return
        for files in self.ranks.call("optimizer_files"):
            write_files(folder, files)

    def resume(self, checkpoint: Path) -> None:
        """Every rank as `checkpoint` left it."""
        if self._sees(checkpoint):
            self.ranks.call("resume", checkpoint)
        else:
            self.ranks.call("resume_from_files", read_files(checkpoint))

    def _sees(self, folder: Path) -> bool:
        """`Ranks.sees` for a checkpoint's folder, said once on stderr where it is not."""
        sees = self.ranks.sees(folder)
        if not sees and not self._told:
            self._told = True
            print(
                f"reinforge: the trainer ranks do not see {folder.parent}: their "
                "checkpoints go through this process (a run directory on storage every "
                "rank mounts at the same path lets each rank read and write its own)",
                file=sys.stderr,
            )
        return sees

    def state_dict(self) -> dict[str, Any]:
        return self.ranks.call("state_dict")[0]

    def close(self) -> None:
        self.ranks.stop()


def read_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by its path there."""
    files = (path for path in folder.rglob("*") if path.is_file())
    return {str(path.relative_to(folder)): path.read_bytes() for path in files}


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    """`files` (as `read_files` gives them) under `folder`."""
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
