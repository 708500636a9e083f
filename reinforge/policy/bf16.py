"""Whether this machine's CPU multiplies bfloat16 natively.

Where it does not (x86 without AVX-512 BF16 or AMX, such as AVX2-only EPYCs), torch
emulates bf16 matmuls, and a forward and backward of SmolLM2-135M under bf16 autocast took
19.7x its float32 time (`benchmarks/README.md`, "bf16 on a CPU without bf16"). A config
measured on a host with native bf16 is slowed by it on one without, silently; a command
says so in its first lines.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NATIVE = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""cpuinfo flags of native bf16 arithmetic: AVX-512 BF16 and AMX on x86, Arm's BF16."""


def native_bf16(cpuinfo: Path = CPUINFO) -> bool | None:
    """Whether the CPU's flags name a native bf16 extension; None where they cannot be
    read (not Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):  # x86, Arm
            return not NATIVE.isdisjoint(value.split())
    return None


def bf16_warning(keys: dict[str, str], cpuinfo: Path = CPUINFO) -> str | None:
    """The line to print when a key set to "bfloat16" (`keys`: name -> value) would compute
    on this machine's CPU without native bf16; None otherwise, and on a machine with a GPU
    (where "auto" and the trainer compute)."""
    import torch

    asked = [name for name, value in keys.items() if value == "bfloat16"]
    if not asked or torch.cuda.is_available() or native_bf16(cpuinfo) is not False:
        return None
    return (
        f"note: {' and '.join(asked)} = bfloat16, but this CPU has no native bf16 (no "
        "AVX-512 BF16 or AMX): its bf16 matmuls are emulated and run many times slower "
        "than float32 here; set float32 where this machine computes"
    )
