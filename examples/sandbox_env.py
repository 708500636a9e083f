"""An agent that works in its own sandbox: sum a file of numbers with shell tools.

    reinforge eval examples/sandbox_env.py --model smollm2-135m --tasks 4 --rollouts 2

Each episode gets a fresh sandbox holding `numbers.txt`; the model has `bash`,
`read_file`, `write_file` and `edit`, and must leave the sum in `answer.txt`. The grader
never runs in the sandbox: `collect` copies `answer.txt` out before the sandbox is
destroyed, and the expected sum never enters it.
"""

import random

from reinforge.envs import Episode, Harness, Reward, Rubric
from reinforge.envs.harbor.sandbox import SandboxEnvironment, SandboxTools
from reinforge.types import Task

PROMPT = (
    "The file numbers.txt in your working directory has one number per line. "
    "Use the tools to add them up and write the sum, alone, into answer.txt."
)


def correct(episode: Episode) -> float:
    return float(episode.state.get("answer", "").strip() == str(episode.task.answer))


def wrote_an_answer(episode: Episode) -> float:
    return float(bool(episode.state.get("answer", "").strip()))


class SumFile(SandboxEnvironment):
    name = "sum-file"

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            numbers = [rng.randint(1, 99) for _ in range(rng.randint(3, 8))]
            tasks.append(
                Task(
                    id=f"sum-file-{seed}-{i}",
                    prompt=[{"role": "user", "content": PROMPT}],
                    answer=sum(numbers),
                    info={"numbers": numbers},
                )
            )
        return tasks

    async def prepare(self, episode, sandbox) -> None:
        numbers = "\n".join(str(n) for n in episode.task.info["numbers"]) + "\n"
        await sandbox.write_files({"numbers.txt": numbers.encode()})

    async def collect(self, episode, sandbox) -> None:
        answer = (await sandbox.read_files(["answer.txt"]))["answer.txt"]
        episode.state["answer"] = answer.decode(errors="replace")[:100] if answer else ""


def load_environment(timeout_s: float = 10.0) -> SumFile:
    return SumFile(
        harness=Harness(
            tools=SandboxTools(timeout_s=timeout_s).tools(), max_turns=6, max_tokens_per_turn=128
        ),
        rubric=Rubric(Reward(correct), Reward(wrote_an_answer, weight=0.1)),
    )
