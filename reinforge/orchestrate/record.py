"""What a run leaves on disk: resolved config, metrics per step, trajectories, checkpoints.

`runs/<name>/config.json`, `metrics.jsonl` (one line per step, flushed),
`trajectories/step_00000.jsonl`, and `checkpoints/step_00010/` in Hugging Face format
(loadable by transformers and by vLLM).
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.rollout.summary import SCORED
from reinforge.train.trainer import Selection
from reinforge.types import Group


class RunRecorder:
    def __init__(self, config: Config, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.directory = config.run_dir
        (self.directory / "trajectories").mkdir(parents=True, exist_ok=True)
        (self.directory / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
        self._metrics = (self.directory / "metrics.jsonl").open("a", encoding="utf-8")

    def record(
        self, step: int, groups: list[Group], metrics: dict[str, Any], model: PreTrainedModel
    ) -> None:
        path = self.directory / "trajectories" / f"step_{step:05d}.jsonl"
        with path.open("w", encoding="utf-8") as out:
            for trajectory in (t for g in groups for t in g.trajectories):
                out.write(trajectory.model_dump_json() + "\n")
        self._metrics.write(json.dumps(metrics) + "\n")
        self._metrics.flush()
        done = step + 1
        if done % self.config.run.checkpoint_every == 0 or done == self.config.run.steps:
            checkpoint = self.directory / "checkpoints" / f"step_{done:05d}"
            model.save_pretrained(checkpoint)
            self.tokenizer.save_pretrained(checkpoint)

    def close(self) -> None:
        self._metrics.close()


def step_metrics(
    step: int,
    groups: list[Group],
    selection: Selection,
    trained: dict[str, float],
    rollout_s: float,
    train_s: float,
    sync_s: float,
    policy_version: int,
) -> dict[str, Any]:
    trajectories = [t for g in groups for t in g.trajectories]
    scored = [t for t in trajectories if t.status in SCORED]
    rewards = [t.reward for t in scored]
    terms = sorted({name for t in scored for name in t.rewards})
    lengths = [t.completion_tokens for t in trajectories]
    sampled = sum(lengths)
    total_s = rollout_s + train_s + sync_s
    return {
        "step": step,
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "rewards": {k: statistics.fmean(t.rewards.get(k, 0.0) for t in scored) for k in terms},
        "pass_rate": statistics.fmean(t.reward >= 1.0 for t in scored) if scored else 0.0,
        "completion_tokens_mean": statistics.fmean(lengths) if lengths else 0.0,
        "truncation_rate": statistics.fmean(t.status == "truncated" for t in trajectories),
        "zero_variance_groups": selection.zero_variance_groups,
        "errors": selection.errored,
        **trained,
        "policy_version": policy_version,
        "time": {"rollout_s": rollout_s, "train_s": train_s, "sync_s": sync_s, "total_s": total_s},
        "tokens_per_s": {
            "rollout": sampled / rollout_s if rollout_s else 0.0,
            "train": trained.get("trained_tokens", 0.0) / train_s if train_s else 0.0,
        },
    }
