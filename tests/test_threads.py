"""The intra-op thread count: the CPUs a process may use, its cgroup's quota included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from reinforge.policy import threads
from reinforge.policy.cgroups import cgroup_folders


def plant_quota(root: Path, v2: str, v1: tuple[str, str]) -> None:
    """The quota files where this process's own cgroup lines point, under `root`."""
    for folder, unified in cgroup_folders("cpu", root):
        folder.mkdir(parents=True, exist_ok=True)
        if unified:
            (folder / "cpu.max").write_text(v2 + "\n")
        else:
            (folder / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
            (folder / "cpu.cfs_period_us").write_text(v1[1] + "\n")


def test_a_cgroup_quota_is_read_in_either_cgroup_version(tmp_path):
    plant_quota(tmp_path, "150000 100000", ("150000", "100000"))
    assert threads.cgroup_cpu_quota(tmp_path) == 1.5
    unlimited = tmp_path / "unlimited"
    plant_quota(unlimited, "max 100000", ("-1", "100000"))
    assert threads.cgroup_cpu_quota(unlimited) is None
    assert threads.cgroup_cpu_quota(tmp_path / "absent") is None


def test_the_quota_caps_the_affinity(monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: 0.5)
    assert threads.usable_cpus() == 1  # half a CPU's time still runs one thread
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: cpus + 8.0)
    assert threads.usable_cpus() == cpus
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: None)
    assert threads.usable_cpus() == cpus


def test_apply_threads_sets_torch_and_says_what_it_chose(monkeypatch):
    # Recorded, not set: an in-process vLLM engine (earlier tests) makes torch's setter a
    # no-op for the rest of the process; the subprocess below checks the real effect.
    asked: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    assert threads.apply_threads(1) == "threads: 1 (model.threads)"
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: 1.0)
    assert "cgroup quota 1 CPUs" in threads.apply_threads(None)
    assert asked == [1, 1]


def test_torch_runs_the_threads_chosen():
    script = (
        "import torch; from reinforge.policy.threads import apply_threads; "
        "apply_threads(1); print(torch.get_num_threads())"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "1", done.stderr
