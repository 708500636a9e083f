"""How many intra-op threads this process's torch runs: one home for the choice.

torch takes the CPUs of the process's affinity, but not its cgroup's CPU quota: a
container limited to 2 CPUs on a 64-core host would run 64 threads on 2 CPUs' time, each
matmul waiting at its barrier for threads that are not scheduled. The same happens, less
badly, when a process shares its CPUs with other busy ones (`benchmarks/threads.py`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from reinforge.policy.bf16 import bf16_warning
from reinforge.policy.cgroups import CGROUP_ROOT, cgroup_folders, read


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the process's cgroup may use (`cpu.max` in cgroup v2, the CFS
    quota in v1), or None without a limit."""
    for folder, v2 in cgroup_folders("cpu", root):
        if v2:  # quota / period, or "max"
            limit = read(folder / "cpu.max")
            if limit is not None and not limit.startswith("max"):
                quota, period = limit.split()
                return int(quota) / int(period)
        else:
            quota_text, period_text = (
                read(folder / "cpu.cfs_quota_us"),
                read(folder / "cpu.cfs_period_us"),
            )
            if quota_text and period_text and int(quota_text) > 0:
                return int(quota_text) / int(period_text)
    return None


def apply_threads(asked: int | None) -> str:
    """Set torch's intra-op threads to `asked` (`model.threads`), or to every CPU the
    process may use; returns the line a command starts with, saying what it chose."""
    import torch

    if asked is not None:
        torch.set_num_threads(asked)
        return f"threads: {asked} (model.threads)"
    cpus, quota = len(os.sched_getaffinity(0)), cgroup_cpu_quota()
    threads = usable_cpus()
    torch.set_num_threads(threads)
    limit = f", cgroup quota {quota:g} CPUs" if quota is not None else ""
    return f"threads: {threads} ({cpus} CPUs in the affinity{limit}; model.threads sets it)"


def prepare_cpu(asked: int | None, bf16_keys: dict[str, str]) -> list[str]:
    """Set the threads (`apply_threads`); the lines a command that computes on this CPU
    starts with: the threads chosen, and the note of `bf16_warning` for `bf16_keys`
    (name -> value) where one is due."""
    note = bf16_warning(bf16_keys)
    return [apply_threads(asked), *([note] if note else [])]
