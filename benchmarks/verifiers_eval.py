"""A verifiers environment evaluated two ways, side by side in one invocation: by verifiers'
own `vf-eval` against `reinforge serve` as its OpenAI endpoint, and by `reinforge eval
verifiers:ENV`, where the same verifiers code plays each rollout and reinforge's episode
client is the model.

Both run the same tasks (all of the environment's, `--tasks` of them) with the same
number of rollouts each, the same harness (verifiers' `null` chat loop) in the same
runtime (a local subprocess), the same model (`tiny-random` on the built-in engine), the
same cap on tokens per reply and the same concurrency, in interleaved rounds. The server
`vf-eval` calls starts once, before the rounds, and is not timed; `reinforge eval` loads
its model in its own process each round.

Reported per system, as medians over the rounds: the command's wall time, the rollout
phase's (from the first rollout's start to the last one's end: `summary.json`'s `wall_s`
for reinforge, the traces' own timings for vf-eval), rollouts per second of each, and the
mean reward over every rollout of every round (the weighted total verifiers scores).

Reproduce (from the repository root, reinforge installed with its `ecosystem` extra; a
few minutes on the 2-vCPU machine):

    python benchmarks/verifiers_eval.py --rounds 3 --json benchmarks/verifiers_eval-results.json

Options: `--env PATH` (a verifiers environment file; default
`tests/data/vf_single_env.py`), `--tasks`, `--rollouts`, `--max-tokens`, `--concurrency`.
`vf-eval` imports the environment by its module name, so the file's directory goes on
its `PYTHONPATH`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
MODEL = "tiny-random"
SYSTEMS = ("vf-eval", "reinforge")


@dataclass
class Round:
    command_s: float
    rollout_s: float
    rollouts: int
    rewards: list[float]


@dataclass
class System:
    rounds: list[Round] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        command = statistics.median(r.command_s for r in self.rounds)
        rollout = statistics.median(r.rollout_s for r in self.rounds)
        rollouts = self.rounds[0].rollouts
        rewards = [x for r in self.rounds for x in r.rewards]
        return {
            "command_s": command,
            "rollout_s": rollout,
            "rollouts_per_s": rollouts / rollout,
            "rollouts_per_s_command": rollouts / command,
            "reward_mean": statistics.fmean(rewards),
            "rollouts": rollouts,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="tests/data/vf_single_env.py")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = Path(args.env).resolve()
    systems = {name: System() for name in SYSTEMS}
    with tempfile.TemporaryDirectory() as scratch, serving() as url:
        for number in range(args.rounds):
            order = SYSTEMS if number % 2 == 0 else SYSTEMS[::-1]
            for name in order:
                out = Path(scratch) / f"{name}-{number}"
                run = vf_eval if name == "vf-eval" else reinforge_eval
                result = run(env, args, out, url)
                systems[name].rounds.append(result)
                shutil.rmtree(out, ignore_errors=True)
                print(
                    f"round {number + 1} {name:9}  command {result.command_s:6.1f}s  "
                    f"rollouts {result.rollout_s:6.1f}s  "
                    f"reward {statistics.fmean(result.rewards):.3f}",
                    file=sys.stderr,
                )
    report = {
        "env": str(env.relative_to(REPO)) if env.is_relative_to(REPO) else str(env),
        "model": MODEL,
        "tasks": args.tasks,
        "rollouts_per_task": args.rollouts,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "cpus": len(os.sched_getaffinity(0)),
        "systems": {name: s.summary() for name, s in systems.items()},
        "raw": {name: [asdict(r) for r in s.rounds] for name, s in systems.items()},
    }
    vf, rf = report["systems"]["vf-eval"], report["systems"]["reinforge"]
    report["reinforge_over_vf_eval"] = {
        "rollouts_per_s": rf["rollouts_per_s"] / vf["rollouts_per_s"],
        "rollouts_per_s_command": rf["rollouts_per_s_command"] / vf["rollouts_per_s_command"],
    }
    print(f"{'':10} {'command s':>10} {'rollouts s':>10} {'rollouts/s':>10} {'reward':>7}")
    for name, s in report["systems"].items():
        print(
            f"{name:10} {s['command_s']:10.1f} {s['rollout_s']:10.1f} "
            f"{s['rollouts_per_s']:10.2f} {s['reward_mean']:7.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


@contextmanager
def serving() -> Iterator[str]:
    """`reinforge serve --model tiny-random` on a free port, for vf-eval: its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "reinforge", "serve", "--model", MODEL, "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield f"{url}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


def vf_eval(env: Path, args: argparse.Namespace, out: Path, url: str) -> Round:
    command = [
        shutil.which("vf-eval") or "vf-eval",
        env.stem,
        "-m",
        MODEL,
        "--client.base-url",
        url,
        "--client.api-key-var",
        "REINFORGE_NO_KEY",
        "-n",
        str(args.tasks),
        "-r",
        str(args.rollouts),
        "-c",
        str(args.concurrency),
        "--env.agent.harness.id",
        "null",
        "--env.agent.runtime.type",
        "subprocess",
        "--sampling.max-tokens",
        str(args.max_tokens),
        "--no-push",
        "--no-rich",
        "-o",
        str(out),
        "--run.dir",
        "run",
    ]
    path = os.pathsep.join(filter(None, [str(env.parent), os.environ.get("PYTHONPATH")]))
    started = time.perf_counter()
    run(command, {"PYTHONPATH": path})
    command_s = time.perf_counter() - started
    episodes = [json.loads(line) for line in (out / "run" / "traces.jsonl").open()]
    traces = [trace for episode in episodes for trace in episode["traces"]]
    first = min(trace["timing"]["boot"]["start"] for trace in traces)
    last = max(trace["timing"]["scoring"]["end"] for trace in traces)
    rewards = [
        sum(r["score"] * r["weight"] for r in trace["rewards"].values() if r is not None)
        for trace in traces
    ]
    return Round(command_s, last - first, len(traces), rewards)


def reinforge_eval(env: Path, args: argparse.Namespace, out: Path, url: str) -> Round:
    command = [
        sys.executable,
        "-m",
        "reinforge",
        "eval",
        f"verifiers:{env}",
        "--model",
        MODEL,
        "--tasks",
        str(args.tasks),
        "--rollouts",
        str(args.rollouts),
        "--concurrency",
        str(args.concurrency),
        "--max-tokens",
        str(args.max_tokens),
        "--env-arg",
        'harness={id = "null"}',
        "--out",
        str(out),
    ]
    started = time.perf_counter()
    run(command, {})
    command_s = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").open()]
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    return Round(command_s, summary["wall_s"], len(rows), rewards)


def run(command: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(
        command, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"{command[0]} failed:\n{result.stderr[-3000:]}")


if __name__ == "__main__":
    main()
