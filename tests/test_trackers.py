"""Experiment trackers get what metrics.jsonl gets: each tracker's own files, read back."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from reinforge.orchestrate.metrics import EngineLoad
from reinforge.orchestrate.trackers import numbers
from reinforge.rollout.summary import summarize
from reinforge.types import Record

from .commands import tiny_train

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("trackio")


def test_numbers_are_the_records_by_path_without_text():
    summary = summarize([], 1.0).model_copy(
        update={"rewards": {"correct": 0.5}, "first_error": "boom"}
    )
    flat = numbers(summary)
    assert flat["rewards/correct"] == 0.5 and flat["reward_mean"] == 0.0
    assert "first_error" not in flat and all(isinstance(v, float) for v in flat.values())


class Engines(Record):
    engines: list[EngineLoad]


def test_numbers_of_a_list_are_by_index():
    load = EngineLoad(requests=3, sampled_tokens=24, tokens_per_s=12.0, in_flight=1)
    flat = numbers(Engines(engines=[load, load.model_copy(update={"requests": 5})]))
    assert flat["engines/0/requests"] == 3.0 and flat["engines/1/requests"] == 5.0


def test_a_run_logs_every_step_to_wandb_mlflow_and_trackio(tmp_path, monkeypatch):
    settings = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri(),
        "MLFLOW_ALLOW_FILE_STORE": "true",  # a file store, so the test needs no server
        "TRACKIO_DIR": str(tmp_path / "trackio"),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "wandb").mkdir()
    argv = tiny_train(tmp_path, 'run.trackers=["wandb", "mlflow", "trackio"]', "run.project=p")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    expected = {row["step"]: row["train"]["loss"] for row in map(json.loads, lines)}
    assert list(expected) == [1, 2]

    assert _wandb_history(tmp_path / "wandb", "train/loss") == expected
    assert _mlflow_history(tmp_path / "mlruns", "train/loss") == pytest.approx(expected)
    assert _trackio_history(tmp_path / "trackio", "train/loss") == pytest.approx(expected)


def test_a_tracker_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unknown-scheme://nowhere")
    argv = tiny_train(tmp_path, 'run.trackers=["mlflow"]')
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert "run.trackers: mlflow did not start" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()  # nothing to resume from, nothing in the way


def _wandb_history(directory: Path, key: str) -> dict[int, float]:
    """W&B's offline run file: a LevelDB-style log (32 KiB blocks of records, each with a
    7-byte header: crc, length, kind; kinds 2-4 are the pieces of a split record) after a
    7-byte file header, each record a `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    (path,) = directory.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    position, records, pending = 7, [], b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == kind == 0:
            break
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    history = {}
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            if key in items:
                history[items["_step"]] = items[key]
    return history


def _mlflow_history(directory: Path, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=directory.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    assert run.info.run_name == "r" and run.data.params["env.name"].endswith("length_env.py")
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}


def _trackio_history(directory: Path, key: str) -> dict[int, float]:
    import sqlite3

    with sqlite3.connect(directory / "p.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics WHERE run_name = 'r'").fetchall()
    return {step: json.loads(metrics)[key] for step, metrics in rows}
