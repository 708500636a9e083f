"""The floor of an object-store push across the two hosts of `tests/twohosts.py`: Ray's
own copy of a model's buckets from host A's object store into host B's, timed inside an
actor on host B, beside the driver's put and the actor's lay of the buckets into a memory
file (what `engines.weight_sync = "object_store"` does before its engine copies them in).
No engine runs: what this measures is what any push through Ray's store pays before one.

Each round puts new buckets (the model's, each byte changed), so that no round finds them
on host B already.

    python benchmarks/store_transfer.py [--model smollm2-135m] [--dtype float32]
        [--rounds 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def on_host_a(address: str, model: str, dtype: str, rounds: int) -> list[dict[str, float]]:
    import numpy as np
    import ray
    import torch

    from reinforge.policy.models import load_model
    from reinforge.policy.weight_buckets import Bucket, pack

    weights, _ = load_model(model)
    buckets = pack(weights.state_dict(), getattr(torch, dtype))
    sizes = [bucket.data.nbytes for bucket in buckets]
    del weights
    ray.init(address=address, log_to_driver=False)

    @ray.remote(resources={"host_b": 1}, num_cpus=0)
    class Taker:
        """An engine's actor's part of a push, without the threads that overlap it."""

        def __init__(self) -> None:
            from reinforge.policy.weight_buckets import MemoryFile

            self.memory = MemoryFile()

        def take(self, refs: list[Any], sizes: list[int]) -> tuple[float, float]:
            started = time.perf_counter()
            arrived = ray.get(refs)
            fetched = time.perf_counter()
            with self.memory.holding(sizes) as lay:
                for index, bucket in enumerate(arrived):
                    lay(index, bucket)
            return fetched - started, time.perf_counter() - fetched

    taker = Taker.remote()
    warm = Bucket(buckets[0].entries[:0], np.zeros(8, np.uint8))
    ray.get(taker.take.remote([ray.put(warm)], [8]))  # placed and warm
    rows = []
    for index in range(rounds):
        changed = [Bucket(b.entries, b.data + np.uint8(index + 1)) for b in buckets]
        started = time.perf_counter()
        refs = [ray.put(bucket) for bucket in changed]
        put_s = time.perf_counter() - started
        transfer_s, lay_s = ray.get(taker.take.remote(refs, sizes))
        rows.append({"put_s": put_s, "transfer_s": transfer_s, "lay_s": lay_s})
        print(
            f"round {index}: put {put_s:.2f} s, host A -> B {transfer_s:.2f} s, "
            f"laid in a memory file {lay_s:.2f} s",
            flush=True,
        )
        del refs, changed
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--address", help=argparse.SUPPRESS)  # the run on host A
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.address:
        rows = on_host_a(args.address, args.model, args.dtype, args.rounds)
        args.out.write_text(json.dumps(rows))
        return
    sys.path.insert(0, str(ROOT))
    from tests.twohosts import two_hosts

    out = Path(f"/tmp/store-transfer-{os.getpid()}.json")
    with two_hosts(memory_mib=4096) as hosts:
        print(f"two hosts at {hosts.address} (own /dev/shm each: {hosts.isolated})", flush=True)
        argv = [*sys.argv[1:], "--address", hosts.address, "--out", str(out)]
        subprocess.run(hosts.on_a([sys.executable, __file__, *argv]), check=True, cwd=ROOT)
    rows = json.loads(out.read_text())
    out.unlink()
    summary: dict[str, Any] = {"model": args.model, "dtype": args.dtype}
    for key in ("put_s", "transfer_s", "lay_s"):
        figures = [row[key] for row in rows]
        summary[key] = {"rounds": figures, "median": statistics.median(figures)}
        print(f"{key:11} median {summary[key]['median']:.3f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
