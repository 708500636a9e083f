"""Experiment trackers: each step's metrics line, and the config, also sent to W&B, MLflow
or trackio when `run.trackers` names them.

metrics.jsonl stays the record: a tracker that fails while logging is reported once and
left out for the rest of the run, so a tracker's outage never costs training.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Protocol

from reinforge.errors import UsageError
from reinforge.orchestrate.config import RunConfig
from reinforge.types import Record

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def log(self, step: int, numbers: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def numbers(record: Record) -> dict[str, float]:
    """The record's numbers by path (`train/loss`, `time/train_s`, `rewards/correct`,
    `engines/0/requests`), the grouping trackers draw panels by; text and nulls are left
    out."""
    flat: dict[str, float] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict | list):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, inner in items:
                walk(inner, f"{path}/{key}" if path else str(key))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[path] = float(value)

    walk(record.model_dump(mode="json"), "")
    return flat


def _flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """MLflow takes flat parameters: `trainer.algorithm.loss.kind` and so on."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            flat |= _flat_params(value, name)
        else:
            flat[name] = value
    return flat


class _Wandb:
    def __init__(self, run: RunConfig, config: dict[str, Any]) -> None:
        import wandb

        self._run = wandb.init(project=run.project, name=run.name, config=config)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        self._run.log(numbers, step=step)

    def close(self) -> None:
        self._run.finish()


class _Mlflow:
    def __init__(self, run: RunConfig, config: dict[str, Any]) -> None:
        import mlflow

        self._mlflow = mlflow
        mlflow.set_experiment(run.project)
        self._run = mlflow.start_run(run_name=run.name)
        mlflow.log_params(_flat_params(config))

    def log(self, step: int, numbers: dict[str, float]) -> None:
        self._mlflow.log_metrics(numbers, step=step, run_id=self._run.info.run_id)

    def close(self) -> None:
        self._mlflow.end_run()


class _Trackio:
    def __init__(self, run: RunConfig, config: dict[str, Any]) -> None:
        import trackio

        self._run = trackio.init(project=run.project, name=run.name, config=config)

    def log(self, step: int, numbers: dict[str, float]) -> None:
        self._run.log(numbers, step=step)

    def close(self) -> None:
        self._run.finish()


_KINDS: dict[str, type[Tracker]] = {"wandb": _Wandb, "mlflow": _Mlflow, "trackio": _Trackio}
"""By `run.trackers` name, which is also the package each imports."""


def check_installed(run: RunConfig) -> None:
    """Before the model loads: a tracker that is named but not installed is a usage error."""
    for name in run.trackers:
        if importlib.util.find_spec(name) is None:
            raise UsageError(
                f"run.trackers names {name}, which is not installed: "
                "pip install 'reinforge[trackers]'"
            )


class Trackers:
    """The run's trackers, opened at the start of a run (or of a resumed one)."""

    def __init__(self, run: RunConfig, config: dict[str, Any]) -> None:
        check_installed(run)
        self._open: dict[str, Tracker] = {}
        for name in run.trackers:
            try:
                self._open[name] = _KINDS[name](run, config)
            except Exception as error:
                self.close()
                raise UsageError(f"run.trackers: {name} did not start: {error}") from error

    def log(self, step: int, record: Record) -> None:
        values = numbers(record)
        for name, tracker in list(self._open.items()):
            try:
                tracker.log(step, values)
            except Exception as error:  # noqa: BLE001 - a tracker must not stop training
                log.warning("tracker %s failed (%s); metrics.jsonl goes on without it", name, error)
                del self._open[name]

    def close(self) -> None:
        for tracker in self._open.values():
            tracker.close()
        self._open.clear()
