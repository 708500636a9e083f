"""benchmarks/gpu_check.py fails loudly: an engine whose seeds do not repeat or whose
recorded log-probs are off, or a trainer whose loss climbs, turns its check's line to FAIL
and the exit code to 1; the same checks pass on the real engine and trainer (tiny-random,
CPU), so the faults are what fails them."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import gpu_check
from reinforge.policy.config import EngineConfig, ModelConfig
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import Completion
from reinforge.policy.models import resolve_device
from reinforge.policy.sampling import SamplingParams
from reinforge.train.trainer import Trainer, build_trainer

TINY = gpu_check.Sizes(
    sampled_tokens=8,
    decode_tokens=8,
    concurrent=4,
    long_prompts=3,
    longest_prompt=60,
    long_tokens=4,
    train_rows=4,
    train_tokens=16,
    train_steps=3,
)
MODEL = ModelConfig(name="tiny-random", device="cpu")


class UnseededEngine(Engine):
    """Drops each request's seed: the same seed no longer gives the same tokens."""

    def submit(self, prompt_ids, params: SamplingParams, on_tokens=None) -> Future[Completion]:
        return super().submit(prompt_ids, replace(params, seed=None), on_tokens)


class ShiftedLogprobsEngine(Engine):
    """Records each sampled token's log-prob 0.01 off the distribution it came from."""

    def submit(self, prompt_ids, params: SamplingParams, on_tokens=None) -> Future[Completion]:
        completion = super().submit(prompt_ids, params, on_tokens).result()
        shifted: Future[Completion] = Future()
        shifted.set_result(replace(completion, logprobs=[x - 0.01 for x in completion.logprobs]))
        return shifted


def engine_checks(kind: type[Engine]) -> dict[str, dict]:
    engine = kind.from_spec(MODEL.name, EngineConfig(), resolve_device(MODEL.device))
    try:
        return gpu_check.engine_checks(engine, TINY)
    finally:
        engine.close()


def test_engine_checks_pass_on_the_engine_and_fail_on_its_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    honest = engine_checks(Engine)
    timed = {"decode"}  # passes on speeds, which a test does not assert
    assert all(check["passed"] for name, check in honest.items() if name not in timed), honest

    unseeded = engine_checks(UnseededEngine)
    assert not unseeded["sampling"]["passed"]
    shifted = engine_checks(ShiftedLogprobsEngine)
    assert not shifted["log-probs"]["passed"]
    assert shifted["log-probs"]["max_abs_diff"] == pytest.approx(0.01, abs=1e-3)
    assert not shifted["long batch"]["passed"]

    checks = {f"{name} float32": check for name, check in honest.items()}
    checks["sampling unseeded"] = unseeded["sampling"]
    checks["log-probs shifted"] = shifted["log-probs"]
    out = tmp_path / "gpu_check.json"
    assert gpu_check.report({"checks": checks}, out) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "PASS sampling float32: prompts=4, tokens=32" in lines
    assert any(line.startswith("FAIL sampling unseeded:") for line in lines)
    assert any(line.startswith("FAIL log-probs shifted: tokens=") for line in lines)
    assert lines[-1] == f"gpu_check: FAILED; results in {out}"
    assert '"passed": false' in out.read_text(encoding="utf-8")


def train_check(maximize: bool) -> dict:
    trainer = build_trainer(Trainer, gpu_check.trainer_spec(MODEL, "float32"))
    for group in trainer.optimizer.param_groups:
        group["maximize"] = maximize  # a sign error: each step climbs the loss
    batch = gpu_check.synthetic_batch(trainer.model.config.vocab_size, TINY)
    return gpu_check.train_check(trainer, gpu_check.on_policy(trainer.model, batch), 3)


def test_train_check_fails_when_the_loss_climbs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    falling = train_check(maximize=False)
    assert falling["passed"] and falling["weights_changed"], falling
    climbing = train_check(maximize=True)
    assert climbing["last_loss"] > climbing["first_loss"]
    assert climbing["weights_changed"] and not climbing["passed"]

    out = tmp_path / "gpu_check.json"
    assert gpu_check.report({"checks": {"train float32": falling}}, out) == 0
    assert gpu_check.report({"checks": {"train float32": climbing}}, out) == 1
    assert "FAIL train float32: first_loss=" in capsys.readouterr().out


def test_the_defaults_check_passes_on_the_defaults_and_fails_on_another_dtype():
    defaults = gpu_check.defaults_check(MODEL, TINY)
    assert defaults["passed"], defaults
    assert defaults["dtype"] == "float32" and defaults["long_request_failed_alone"]
    assert "engine.kv_memory_fraction" in defaults["long_request_error"]
    told = gpu_check.defaults_check(MODEL, TINY, EngineConfig(dtype="bfloat16"))
    assert told["dtype"] == "bfloat16" and not told["passed"]  # not what a CPU defaults to
