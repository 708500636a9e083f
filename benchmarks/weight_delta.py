"""What a delta push (`policy/weight_delta.py`) would send between two checkpoints of one
run, e.g. two consecutive steps: the share of elements that changed, of 4 KiB blocks that
hold a change, and the bytes of the deltas against the full buckets, in fp32 and bf16.

    python benchmarks/weight_delta.py RUN/checkpoints/step_00003 RUN/checkpoints/step_00004
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from reinforge.policy.weight_buckets import pack
from reinforge.policy.weight_delta import as_words, element_bytes, encode

BLOCK_BYTES = 4096


def compare(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], dtype: torch.dtype) -> str:
    elements = changed = blocks = changed_blocks = full = sent = 0
    for a, b in zip(pack(old, dtype), pack(new, dtype), strict=True):
        word = element_bytes(b)
        differs = as_words(a.data, word) != as_words(b.data, word)
        elements += differs.size
        changed += int(np.count_nonzero(differs))
        per_block = BLOCK_BYTES // word
        whole = differs[: differs.size // per_block * per_block].reshape(-1, per_block)
        blocks += whole.shape[0]
        changed_blocks += int(np.count_nonzero(whole.any(axis=1)))
        delta = encode(a, b, base=0)
        full += b.data.nbytes
        sent += b.data.nbytes if delta is None else delta.nbytes
    return (
        f"{str(dtype).removeprefix('torch.'):9s} elements changed {changed / elements:.2%}, "
        f"4 KiB blocks changed {changed_blocks / blocks:.2%}; "
        f"delta {sent / 2**20:.1f} MiB of {full / 2**20:.1f} MiB ({sent / full:.2%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="a checkpoint folder (its model.safetensors)")
    parser.add_argument("new", type=Path)
    args = parser.parse_args()
    old, new = (load_file(path / "model.safetensors") for path in (args.old, args.new))
    for dtype in (torch.float32, torch.bfloat16):
        print(compare(old, new, dtype))


if __name__ == "__main__":
    main()
