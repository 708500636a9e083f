"""The TRL side of `benchmarks/vs_trl.py`: TRL's GRPOTrainer on the arithmetic tasks it is given.

`vs_trl.py` starts this script as its own process (so its peak RSS is TRL's alone) with a
JSONL file of tasks in step order, and reads back one JSON line per optimizer step. It is
not meant to be run by hand, but can be:

    python benchmarks/trl_grpo.py --tasks tasks.jsonl --steps 3 --out trl-steps.jsonl \\
        --model ~/.cache/reinforge/models/smollm2-135m

Pinned to trl==1.16.0: the config fields set below, the default that turns gradient
checkpointing on, and the `dapo` loss's normaliser are those of 1.16; another version
may silently mean something else, so the script refuses to run on one.

Each task line: {"step", "task", "prompt" (chat messages, as reinforge sends them),
"answer", "prompt_tokens"}. Each output line is one of
- {"kind": "setup", ...}: versions, the settings used, and whether TRL's prompt tokens equal
  reinforge's for every task;
- {"kind": "step", "step", "step_s", "rollouts": [{"task", "prompt_tokens",
  "completion_tokens", "reward"}, ...], "logs": TRL's own log line for the step};
- {"kind": "end", "logs": TRL's end-of-training summary}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch
import trl
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PrinterCallback,
    TrainerCallback,
)
from trl import GRPOConfig, GRPOTrainer

from reinforge.envs.builtin.arithmetic import correct
from reinforge.envs.episode import Episode
from reinforge.policy.chat import ChatFormat
from reinforge.types import Task

TRL_VERSION = "1.16.0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, required=True, help="JSONL, in step order")
    parser.add_argument("--model", type=Path, required=True, help="local HF model folder")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSONL, one line per step")
    parser.add_argument("--output-dir", type=Path, default=Path("/tmp/vs-trl-trainer"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--bf16", action="store_true", help="TRL's bf16 mixed precision")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="TRL 1.16's default; off here"
    )
    args = parser.parse_args()

    if trl.__version__ != TRL_VERSION:
        print(
            f"trl_grpo.py is pinned to trl=={TRL_VERSION}, found {trl.__version__}: "
            f"pip install trl=={TRL_VERSION}",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in args.tasks.read_text().splitlines() if line.strip()]
    if len(rows) != args.steps * args.prompts_per_step:
        print(f"{args.tasks}: {len(rows)} tasks for {args.steps} steps", file=sys.stderr)
        return 2

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = grpo_config(args)
    with args.out.open("w", encoding="utf-8") as out:
        recorder = StepRecorder(out, tokenizer, args.steps)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=recorder.correct,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[recorder],
        )
        trainer.remove_callback(PrinterCallback)  # it prints every log dict; we print a line
        setup = setup_record(config, tokenizer, rows)
        # what the trainer did to the model, whatever the config said
        setup["model_activation_checkpointing"] = trainer.model.is_gradient_checkpointing
        setup["model_dtype"] = str(next(trainer.model.parameters()).dtype)
        recorder.write(setup)
        trainer.train()
    return 0


def grpo_config(args: argparse.Namespace) -> GRPOConfig:
    """The reinforge defaults of `examples/arithmetic.toml`, spelled in TRL 1.16's fields.

    One optimizer step = one generation batch of prompts_per_step x group_size completions
    in a single micro-batch (reinforge's 4096-token micro-batch holds all 32 rows too), no
    reuse of a generation (num_iterations 1), so the PPO ratio is exactly 1 in TRL and
    ~1 in reinforge (its sampler's log-probs vs the trainer's).
    """
    completions = args.prompts_per_step * args.group_size
    return GRPOConfig(
        output_dir=str(args.output_dir),
        # data: the given tasks, in the given order, each repeated group_size times
        shuffle_dataset=False,
        remove_unused_columns=False,  # the reward reads "answer", "task", "prompt_tokens"
        per_device_train_batch_size=completions,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=args.group_size,
        num_iterations=1,
        max_steps=args.steps,
        # sampling
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        # loss: GRPO advantages (group std, TRL's eps 1e-4), DAPO token mean, clip-higher
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        mask_truncated_completions=False,  # reinforge trains on truncated rollouts too
        # optimizer: torch's fused AdamW (reinforge's), constant lr, no warm-up or decay
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch_fused",
        max_grad_norm=1.0,
        # precision and memory: TRL 1.16 defaults both bf16 and gradient checkpointing on
        bf16=args.bf16,
        fp16=False,
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=True,  # reinforge runs on the CPU; so does the comparison
        seed=args.seed,
        # no saving, no reporting, a log line per step for the recorder
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def setup_record(
    config: GRPOConfig, tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """Versions, the settings that matter, and a check that TRL tokenizes each prompt as
    reinforge does (TRL calls `apply_chat_template(tokenize=True)`; reinforge renders with
    `ChatFormat`), so both systems condition on the same tokens."""
    reinforge_ids = ChatFormat(tokenizer)
    trl_ids = tokenizer.apply_chat_template(
        conversation=[row["prompt"] for row in rows],
        tools=None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    same = sum(
        list(ids) == reinforge_ids.prompt_ids(row["prompt"])
        for ids, row in zip(trl_ids, rows, strict=True)
    )
    fields = (
        "per_device_train_batch_size gradient_accumulation_steps steps_per_generation "
        "generation_batch_size num_generations num_iterations max_completion_length "
        "temperature top_p top_k loss_type scale_rewards epsilon epsilon_high beta "
        "learning_rate lr_scheduler_type optim max_grad_norm bf16 gradient_checkpointing "
        "shuffle_dataset seed"
    ).split()
    return {
        "kind": "setup",
        "versions": {"trl": trl.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "config": {name: _plain(getattr(config, name)) for name in fields},
        "prompt_tokens_match": {"same": same, "tasks": len(rows)},
    }


def _plain(value: Any) -> Any:
    """A config value as JSON: enums by their value."""
    return getattr(value, "value", value)


class StepRecorder(TrainerCallback):
    """The reward function and the per-step timer in one object, so each step's line holds
    its rollouts, its wall time and TRL's logs.

    The step is timed from `on_step_begin` to `on_step_end`: in TRL generation happens in
    `training_step` (`_prepare_inputs`), between the two, as do the loss, the backward and
    the optimizer step; TRL's logging after `on_step_end` is outside, as reinforge's
    recording is outside its `time.total_s`.
    """

    def __init__(self, out: TextIO, tokenizer: PreTrainedTokenizerBase, steps: int) -> None:
        self.out = out
        self.tokenizer = tokenizer
        self.eos_ids = {tokenizer.eos_token_id}
        self.steps = steps
        self._started = 0.0
        self._step_s = 0.0
        self._rollouts: list[dict[str, Any]] = []

    def correct(
        self,
        prompts: list[list[dict[str, Any]]],
        completions: list[Any],
        completion_ids: list[list[int]],
        answer: list[int],
        task: list[int],
        prompt_tokens: list[int],
        **_: Any,
    ) -> list[float]:
        """reinforge's arithmetic reward, `correct` itself, on the text reinforge would see:
        the sampled tokens less a final EOS, decoded without skipping special tokens (TRL's
        own `completions` skips them)."""
        rewards = []
        for prompt, ids, value, index, prompt_len in zip(
            prompts, completion_ids, answer, task, prompt_tokens, strict=True
        ):
            text_ids = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
            reply = {"role": "assistant", "content": self.tokenizer.decode(text_ids)}
            episode = Episode(Task(id=str(index), prompt=prompt, answer=value), [*prompt, reply])
            reward = correct(episode)
            rewards.append(reward)
            self._rollouts.append(
                {
                    "task": index,
                    "prompt_tokens": prompt_len,
                    "completion_tokens": len(ids),
                    "reward": reward,
                }
            )
        return rewards

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self._step_s = time.perf_counter() - self._started

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        logs = dict(logs or {})
        if "train_runtime" in logs:  # the summary after the last step
            self.write({"kind": "end", "logs": logs})
            return
        step = state.global_step - 1
        rollouts, self._rollouts = self._rollouts, []
        record = {"kind": "step", "step": step, "step_s": self._step_s}
        self.write({**record, "rollouts": rollouts, "logs": logs})
        rewards = [r["reward"] for r in rollouts]
        lengths = [r["completion_tokens"] for r in rollouts]
        print(
            f"trl       step {step + 1:4d}/{self.steps}  "
            f"reward {sum(rewards) / max(len(rewards), 1):.3f}  "
            f"len {sum(lengths) / max(len(lengths), 1):5.1f}  "
            f"zero-std {logs.get('frac_reward_zero_std', float('nan')):.2f}  "
            f"step {self._step_s:5.1f}s",
            file=sys.stderr,
            flush=True,
        )

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()


if __name__ == "__main__":
    sys.exit(main())
