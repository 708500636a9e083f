"""The scripted agents of a Harbor environment, for task authors and `reinforge audit`:
`oracle` runs the task's `solution/solve.sh` and records it as the conversation a model
agent would have had, and a `ScriptAgent` runs its own shell script. Neither uses a model;
both act in the agent's sandbox and are graded like any other agent."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from reinforge.envs.episode import Episode
from reinforge.envs.harbor.sandbox import SANDBOX, SandboxTools
from reinforge.envs.harbor.task import HarborTask
from reinforge.envs.harbor.verify import tests_tar
from reinforge.errors import UsageError
from reinforge.sandbox.pool import PooledSandbox
from reinforge.sandbox.protocol import ExecResult

SOLUTION_DIR = "/solution"
OUTPUT_CHARS = 2000
"""How much of a script's or the verifier's output a trajectory keeps (the end of it)."""
NAMED_PATH = re.compile(r"`(/[^`\s]+)`")
"""An absolute path written in backticks in an instruction: a file the oracle looks at."""
ORACLE_ANSWER = "I ran the commands above; the task is done."


@dataclass(frozen=True)
class ScriptAgent:
    """An agent that is one bash script, run in the workdir of the agent's sandbox with the
    image's ENV: no model, no tools, graded like any other agent. `script` is the script,
    or gives one for each task (a user's exploit that reads the task's files)."""

    name: str
    script: str | Callable[[HarborTask], str]

    def script_for(self, task: HarborTask) -> str:
        return self.script if isinstance(self.script, str) else self.script(task)


async def play_oracle(
    task: HarborTask, episode: Episode, tools: SandboxTools, read_first: bool
) -> None:
    """Run `solution/solve.sh` as Harbor does (bash, the solution's ENV, no time limit but
    the agent's), and record it as the conversation a model agent would have had: a
    `read_file` call (when `read_first`, the tool being offered) for each file the
    instruction names by absolute path that exists, then one `bash` call holding the
    script (less its `#!` line), each with what the tool reports, and a final answer.
    Those transcripts are SFT data that teaches the tool-call format, and to look at a file
    before changing it (`examples/coding-sft.toml`)."""
    sandbox: PooledSandbox = episode.resources[SANDBOX]
    solve = task.solution_dir / "solve.sh"
    if not solve.is_file():
        raise UsageError(f"{task.path}: no solution/solve.sh for the oracle agent")
    script = solve.read_text(encoding="utf-8", errors="replace")
    if script.startswith("#!"):  # a shell command, as a model would write it
        script = script.split("\n", 1)[1] if "\n" in script else ""
    if read_first:
        reads, reports = [], []
        for path in dict.fromkeys(NAMED_PATH.findall(task.instruction)):
            try:
                reports.append(await tools.read_file(path, episode))
            except FileNotFoundError:  # a file the task asks for: nothing to look at
                continue
            reads.append((f"call_read_{len(reads)}", "read_file", {"path": path}))
        if reads:
            _record_calls(episode, reads, reports)
    await sandbox.upload_tar(tests_tar(task.solution_dir), SOLUTION_DIR)
    env = task.env | task.config.solution.env
    result = await sandbox.exec(["bash", f"{SOLUTION_DIR}/solve.sh"], env=env)
    _keep_output(episode, "oracle", result)
    solve_call = ("call_oracle", "bash", {"command": script})
    _record_calls(episode, [solve_call], [tools.report(result)])
    episode.messages.append({"role": "assistant", "content": ORACLE_ANSWER})


async def play_script(agent: ScriptAgent, task: HarborTask, episode: Episode) -> None:
    sandbox: PooledSandbox = episode.resources[SANDBOX]
    result = await sandbox.exec(["bash", "-c", agent.script_for(task)], env=task.env)
    _keep_output(episode, "script", result)


def _record_calls(
    episode: Episode, calls: list[tuple[str, str, dict[str, str]]], reports: list[str]
) -> None:
    """One assistant turn making `calls` (id, tool, arguments), and each tool's report."""
    episode.messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for call_id, name, args in calls
            ],
        }
    )
    for (call_id, name, _), report in zip(calls, reports, strict=True):
        episode.messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": report}
        )


def _keep_output(episode: Episode, agent: str, result: ExecResult) -> None:
    episode.state[f"{agent}_exit_code"] = result.exit_code
    output = (result.stdout + result.stderr).decode(errors="replace")
    episode.state[f"{agent}_output"] = output[-OUTPUT_CHARS:]
