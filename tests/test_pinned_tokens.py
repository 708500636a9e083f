"""The tokens a run samples, pinned: changes to structure must not change what is sampled.

Each case trains 3 steps on tiny-random from scratch and compares a digest of every sampled
token per step with the digests recorded when the case was pinned. The main job samples
only (its random-model rewards are all 0, so every group has zero variance and nothing
trains); the length environment trains every step, so its later steps also pin the
trainer's updates and the weight sync. A random model's next-token distribution is nearly
flat, so rounding differences between CPUs move each token's cumulative probability by far
less than a draw could notice: the digests hold on any x86 CPU.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from .commands import ROOT, run_here, tiny_train

PINNED = {
    "main job": ["1133816deae868d5", "8fdbd0796e3fbed4", "0bcc65d02258af60"],
    "length env": ["df78faa0ebcf07d2", "0d541be6420b7300", "037daa5aa8016d76"],
}


def _argv(case: str, run_dir: Path) -> list[str]:
    if case == "main job":
        main_job = str(ROOT / "examples" / "arithmetic.toml")
        return [
            sys.executable,
            "-m",
            "reinforge",
            "train",
            main_job,
            "model.name=tiny-random",
            "run.steps=3",
            f"run.dir={run_dir}",
            "run.name=r",
        ]
    return tiny_train(run_dir, "run.steps=3")


def step_digests(run_dir: Path) -> list[str]:
    digests = []
    for path in sorted((run_dir / "r" / "trajectories").glob("step_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        tokens = sorted((r["task_id"], r["index"], r["token_ids"]) for r in rows)
        digests.append(hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16])
    return digests


@pytest.mark.parametrize("case", list(PINNED))
def test_the_first_three_steps_sample_the_pinned_tokens(tmp_path, case):
    result = run_here(_argv(case, tmp_path))
    assert result.returncode == 0, result.stderr
    assert step_digests(tmp_path) == PINNED[case]
