"""vLLM's settings on a GPU and on a CPU: its memory is a share of a GPU (a trainer shares
it) or a fixed size of a CPU's, and its context may be cut to leave room for rows."""

from __future__ import annotations

import os

import httpx

from reinforge.policy.config import EngineConfig, VllmConfig
from reinforge.policy.vllm_engine import vllm_args

from .commands import serving
from .conftest import require_vllm


def test_on_a_gpu_vllm_takes_a_share_of_its_memory_and_samples_in_bfloat16():
    args = vllm_args("m", EngineConfig(), gpu=True)
    assert args["gpu_memory_utilization"] == VllmConfig().gpu_memory_utilization < 0.5
    assert "kv_cache_memory_bytes" not in args  # it would override the share
    assert args["dtype"] == "bfloat16"
    assert args["enforce_eager"] is True and args["max_model_len"] is None


def test_on_a_cpu_vllm_takes_a_fixed_cache_and_samples_in_float32():
    config = EngineConfig(vllm=VllmConfig(kv_cache_mib=256, max_model_len=512, compile=True))
    args = vllm_args("m", config, gpu=False)
    assert args["kv_cache_memory_bytes"] == 256 << 20
    assert "gpu_memory_utilization" not in args
    assert args["dtype"] == "float32"
    assert (args["enforce_eager"], args["max_model_len"]) == (False, 512)
    told = vllm_args("m", EngineConfig(dtype="bfloat16"), gpu=False)
    assert told["dtype"] == "bfloat16"


def test_a_shorter_context_reaches_vllm():
    require_vllm()
    from reinforge.policy.vllm_engine import VllmEngine

    config = EngineConfig(vllm=VllmConfig(kv_cache_mib=64, max_model_len=96))
    engine = VllmEngine.from_spec("tiny-random", config)
    try:
        assert engine.max_context == 96
    finally:
        engine.close()


def test_vllm_serves_with_other_threads_than_the_cpus():
    """`model.threads` unlike OpenMP's default count (the CPUs of the affinity): vLLM's
    CPU attention must see torch's count in the engine's thread, or every request fails."""
    require_vllm()
    threads = len(os.sched_getaffinity(0)) + 1
    with serving("--engine", "vllm", f"model.threads={threads}") as url:
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "tiny-random",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
            timeout=120,
        )
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"][0]["token_ids"]) == 4
