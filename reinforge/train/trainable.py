"""The trainer's model: full weights or LoRA adapters, and what the sampler and the KL term
need from it.

With LoRA only the adapters train, so the frozen base doubles as the KL reference (adapters
switched off). A checkpoint is always a complete Hugging Face model (adapters merged), so
transformers and vLLM load it with nothing else; a LoRA run also keeps its adapter, in PEFT's
format, under `adapter/` to resume from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.policy.models import load_model, quiet_progress
from reinforge.train.config import TrainerConfig

ADAPTER = "adapter"


def load_trainable(
    spec: str, config: TrainerConfig, checkpoint: Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model to train, in float32 and eval mode, from `spec` or a run's `checkpoint`.

    A LoRA run resumes from `spec`'s base and the checkpoint's adapter: merging is not
    exactly undone by unmerging, and the base must stay the one the adapter was trained on.
    """
    with_lora = config.lora is not None
    model, tokenizer = load_model(str(checkpoint) if checkpoint and not with_lora else spec)
    if config.lora is not None:
        if checkpoint is not None:
            model = PeftModel.from_pretrained(model, checkpoint / ADAPTER, is_trainable=True)
        else:
            lora = LoraConfig(
                r=config.lora.rank,
                lora_alpha=config.lora.alpha,
                target_modules=config.lora.target_modules,
                lora_dropout=0.0,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.eval()
    return model, tokenizer  # type: ignore[return-value]


def save_model(model: PreTrainedModel, folder: Path) -> None:
    """The complete model in Hugging Face format; for LoRA, merged, plus `adapter/`."""
    with quiet_progress():  # a per-shard progress bar would break the training console
        if not isinstance(model, PeftModel):
            model.save_pretrained(folder)
            return
        model.save_pretrained(folder / ADAPTER)
        base = model.get_base_model()
        base.config.save_pretrained(folder)
        if base.generation_config is not None:
            base.generation_config.save_pretrained(folder)
        with full_weights(model) as weights:
            tensors = {name: tensor.detach().contiguous() for name, tensor in weights.items()}
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@contextmanager
def full_weights(model: PreTrainedModel) -> Iterator[Mapping[str, torch.Tensor]]:
    """The model's complete weights under the plain model's parameter names, for a sampler
    that holds its own copy: LoRA adapters are merged in for the duration of the block."""
    if not isinstance(model, PeftModel):
        yield dict(model.named_parameters())
        return
    model.merge_adapter()
    try:
        base = model.get_base_model()
        yield {
            name.replace(".base_layer.", "."): param
            for name, param in base.named_parameters()
            if "lora_" not in name
        }
    finally:
        model.unmerge_adapter()


def reference_context(model: PreTrainedModel) -> AbstractContextManager[object]:
    """Within it, a LoRA model computes as its frozen base: the KL reference for free."""
    return model.disable_adapter() if isinstance(model, PeftModel) else nullcontext()


def is_adapter(model: PreTrainedModel) -> bool:
    return isinstance(model, PeftModel)
