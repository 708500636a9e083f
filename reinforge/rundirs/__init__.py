"""Readers of the folders that runs and evals leave behind (metrics.jsonl, trajectories,
checkpoints): the dashboard and `reinforge diff`. They only read those files, so nothing in
training imports them; the commands do."""
