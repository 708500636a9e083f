"""What a run leaves on disk: resolved config, metrics per step, trajectories, checkpoints.

`runs/<name>/config.json`, `metrics.jsonl` (one line per step, flushed),
`trajectories/step_00001.jsonl` (RL: the step's rollouts), and `checkpoints/step_00010/`
in Hugging Face format (loadable by transformers and by vLLM). Steps are numbered from 1
everywhere (console, metrics, trajectories, checkpoints): step 10's checkpoint holds the
weights after 10 steps. RL and SFT runs record the
same way, so `--resume` and every tool that reads a run work on both.
"""

from __future__ import annotations

from typing import Any, Self

from transformers import PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.orchestrate.trackers import Trackers
from reinforge.train.checkpoints import open_run, write_checkpoint
from reinforge.train.trainer import PolicyTrainer
from reinforge.types import Group, Record


class RunRecorder:
    """One run directory, after `start_step` steps (0, or where a resumed run's checkpoint
    left it) to `config.run.steps`; a checkpoint every `run.checkpoint_every` steps, at
    the last, and on an interruption (`save_last`). `resume` and `overwrite`: as the
    command line says (`open_run`)."""

    def __init__(
        self,
        config: Config,
        tokenizer: PreTrainedTokenizerBase,
        start_step: int,
        resume: bool,
        overwrite: bool,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.directory = config.run_dir
        # steps recorded, and the step of the newest checkpoint (0: none)
        self.steps = self.checkpointed = start_step
        self._state: dict[str, Any] = {}
        # Trackers first: one that cannot start leaves no half-made run directory behind.
        self._trackers = Trackers(config.run, config.model_dump(mode="json"))
        try:
            self._metrics = open_run(
                self.directory, config.model_dump_json(indent=2), start_step, resume, overwrite
            )
        except BaseException:
            self._trackers.close()
            raise

    def record(
        self,
        step: int,
        metrics: Record,
        trainer: PolicyTrainer,
        state: dict[str, Any],
        groups: list[Group] | None = None,
    ) -> None:
        """Step `step`'s rollouts (RL; None: no rollouts), its metrics line, and a
        checkpoint when one is due. `step` counts from 1: the steps done after it.
        `state`: the loop's own entries of the checkpoint's trainer state, beside the step
        and the trainer's, for resuming to restore or check."""
        if groups is not None:
            path = self.directory / "trajectories" / f"step_{step:05d}.jsonl"
            path.parent.mkdir(exist_ok=True)
            with path.open("w", encoding="utf-8") as out:
                for trajectory in (t for g in groups for t in g.trajectories):
                    out.write(trajectory.model_dump_json() + "\n")
        self._metrics.write(metrics.model_dump_json() + "\n")
        self._metrics.flush()
        self._trackers.log(step, metrics)
        self.steps, self._state = step, state
        if step % self.config.run.checkpoint_every == 0 or step == self.config.run.steps:
            self._checkpoint(trainer)

    def save_last(self, trainer: PolicyTrainer) -> str:
        """On an interruption, a checkpoint of the last step recorded unless it has one, so
        that no step done is lost; `trainer` must not have trained since. Says where the
        run resumes."""
        if self.steps > self.checkpointed:
            self._checkpoint(trainer)
            return f"checkpoint of step {self.steps} saved"
        if self.checkpointed:
            return f"checkpoint of step {self.checkpointed} already saved"
        return "no step done, nothing to save"

    def _checkpoint(self, trainer: PolicyTrainer) -> None:
        state = {"step": self.steps, **self._state, **trainer.state_dict()}
        write_checkpoint(
            self.directory,
            self.steps,
            trainer.save_model,
            trainer.save_optimizer,
            self.tokenizer,
            state,
            keep=self.config.run.keep_checkpoints,
        )
        self.checkpointed = self.steps

    def close(self) -> None:
        self._metrics.close()
        self._trackers.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
