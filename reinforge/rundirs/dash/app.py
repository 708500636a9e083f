"""The dashboard's web app: static pages and a JSON API over the runs below one folder.

The pages (`static/`) poll the API, so a run that is training shows its new steps without a
reload. The charting library (uPlot) is vendored in `static/`: the dashboard works offline.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query
from fastapi.staticfiles import StaticFiles

from reinforge.errors import UsageError
from reinforge.rundirs import diff
from reinforge.rundirs.dash import runs, trajectories
from reinforge.rundirs.dash.runs import RunDir

STATIC = Path(__file__).parent / "static"


def create_app(root: Path) -> FastAPI:
    app = FastAPI(title="reinforge dash", docs_url=None, redoc_url=None, openapi_url=None)

    def run_dir(run: str) -> RunDir:
        found = runs.get_run(root, run)
        if found is None:
            raise HTTPException(404, f"no run {run!r} below {root}")
        return found

    def step_file(found: RunDir, step: int | None) -> Path:
        path = runs.trajectory_file(found, step)
        if path is None or not path.is_file():
            raise HTTPException(404, f"run {found.id!r} has no trajectories for step {step}")
        return path

    @app.get("/api/runs")
    def list_runs() -> dict[str, Any]:
        return {"root": str(root), "runs": [runs.summary(r) for r in runs.find_runs(root)]}

    @app.get("/api/metrics")
    def metrics(run: str, since: int = 0) -> dict[str, Any]:
        """Rows from line `since` on; `restart` when the file got shorter (a resumed run
        rewrote it), and then the rows are all of them."""
        found = run_dir(run)
        rows, lines = runs.read_metrics(found, since)
        if lines < since:
            rows, lines = runs.read_metrics(found)
            return {"rows": rows, "next": lines, "restart": True}
        return {"rows": rows, "next": lines, "restart": False}

    @app.get("/api/config")
    def run_config(run: str) -> dict[str, Any]:
        """A training run's config.json, an eval's summary.json."""
        return runs.config(run_dir(run))

    @app.get("/api/steps")
    def steps(run: str) -> dict[str, Any]:
        found = run_dir(run)
        return {"kind": found.kind, "steps": runs.steps(found)}

    @app.get("/api/trajectories")
    def trajectory_rows(run: str, step: int | None = None) -> dict[str, Any]:
        found = run_dir(run)
        read = trajectories.read(step_file(found, step))
        advantages, why_none = trajectories.advantages(read, _trainer_config(found))
        rows = [
            trajectories.row(line, t, a)
            for line, (t, a) in enumerate(zip(read, advantages, strict=True))
        ]
        return {"rows": rows, "no_advantages": why_none}

    @app.get("/api/trajectory")
    def trajectory(run: str, line: int, step: int | None = None) -> dict[str, Any]:
        found = run_dir(run)
        read = trajectories.read(step_file(found, step))
        if not 0 <= line < len(read):
            raise HTTPException(404, f"no trajectory {line} in step {step} of {found.id!r}")
        advantages, _ = trajectories.advantages(read, _trainer_config(found))
        tokenizer = trajectories.tokenizer_for(runs.model_name(found), found.path / "checkpoints")
        return trajectories.detail(read[line], advantages[line], tokenizer)

    @app.get("/api/diff")
    def behaviour_diff(
        run: str,
        start: int = Query(alias="from"),
        end: int = Query(alias="to"),
        window: int = diff.WINDOW,
    ) -> dict[str, Any]:
        """`reinforge diff RUN --from A --to B` as JSON."""
        try:
            report = diff.compare(*diff.run_sides(run_dir(run).path, start, end, window))
        except UsageError as error:
            raise HTTPException(400, str(error)) from error
        return dataclasses.asdict(report)

    app.mount("/", StaticFiles(directory=STATIC, html=True), name="static")
    return app


def _trainer_config(run: RunDir) -> dict[str, Any] | None:
    return runs.config(run).get("trainer", {}) if run.kind == "train" else None
