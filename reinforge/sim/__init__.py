"""`reinforge sim`: a discrete-event model of the training loop, to size a run before
paying for it.

The loop's timing comes from a few measurable things: how long each rollout decodes (its
completion length, and the engine's decode-step time at the batch it shares), how long its
environment and grader take, how fast the trainer turns tokens into a step, and how many
devices sample and train. `config` holds the `sim` section beside the train tree;
`calibrate` measures the engine and trainer on this machine (a `Profile`, in `profile`);
`workload` says what the rollouts cost (from a run, or parametric);
`pipeline` plays the loop of `orchestrate/loop.py` forward in simulated time; `predict`
turns that into the figures a run reports and finds the best split of N devices.
"""
