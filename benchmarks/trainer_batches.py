"""The trainer's step on the batches a run really trained, in seconds: what a change to
the trainer moves on a job's own rollouts (lengths, shared prompts, trained tokens).

The batches are each recorded step's rollouts, selected as the trainer selects them under
the config given (`shared_prefix.batches`); the model is the config's. One untimed step
on the first batch warms the kernels up, then every batch is stepped in turn:

    python benchmarks/trainer_batches.py runs/coding-kl15-s0 examples/coding.toml \\
        model.name=runs/coding-sft --steps 3 [--profile]

Two revisions side by side: `benchmarks/revisions.py BASE --workloads batches --batches
RUN CONFIG [OVERRIDE ...]`, which runs this script under each revision's code.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext

from shared_prefix import batches, model_and_reference, run_parser
from torch.profiler import ProfilerActivity, profile

from reinforge.config import Config, load_config
from reinforge.train.trainer import Trainer


def main() -> None:
    parser = run_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="recorded steps that train")
    parser.add_argument("--profile", action="store_true", help="print torch's op profile")
    args = parser.parse_args()

    config = load_config(Config, args.config, args.overrides)
    steps = batches(args.run, config)[: args.steps]
    model, reference = model_and_reference(config)
    trainer = Trainer(model, config.trainer, config.optim, 1000, reference=reference)
    trainer.step(steps[0])  # warm-up, untimed
    profiler = profile(activities=[ProfilerActivity.CPU]) if args.profile else nullcontext()
    with profiler as ops:
        started = time.perf_counter()
        for batch in steps:
            trainer.step(batch)
        seconds = time.perf_counter() - started
    if ops is not None:
        print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    trained = [int(batch.target_mask.sum()) for batch in steps]
    print(json.dumps({"seconds": seconds, "trained_tokens": trained}))


if __name__ == "__main__":
    main()
