"""An agent written with the OpenAI Agents SDK, unmodified, as the policy's harness.

    reinforge eval examples/agents_sdk_env.py --model smollm2-135m --tasks 4

Each episode runs `Runner.run` on an SDK `Agent` whose model is an ordinary
`OpenAIChatCompletionsModel`, pointed at the episode's own gateway URL; its `bash` tool
runs in the episode's sandbox. The SDK only ever sees text over HTTP, yet the trajectory is
token-exact: the gateway keeps the conversation as the policy sampled it. The rubric reads
`answer.txt`, copied out of the sandbox when the episode ends.
"""

import random

from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from reinforge.envs import Episode, Harness, Reward, Rubric
from reinforge.envs.gateway import close_gateway, open_episode
from reinforge.envs.harbor.sandbox import SandboxEnvironment, SandboxTools
from reinforge.types import Task

set_tracing_disabled(True)  # the SDK's traces would go to OpenAI's servers

WORDS = ["apple", "river", "stone", "cloud", "maple", "ember", "frost", "coral"]
INSTRUCTIONS = "You work in a Linux shell through the bash tool. Do the task, then say done."
TOOLS = SandboxTools(timeout_s=10.0)


@function_tool
async def bash(ctx: RunContextWrapper[Episode], command: str) -> str:
    """Run a shell command in your working directory; returns its exit code and output.

    Args:
        command: The command line, run by /bin/sh.
    """
    return await TOOLS.bash(command, ctx.context)


AGENT = Agent(name="shell", instructions=INSTRUCTIONS, tools=[bash])


def correct(episode: Episode) -> float:
    return float(episode.state.get("answer", "").strip() == episode.task.answer)


class AgentsSDKTask(SandboxEnvironment):
    name = "agents-sdk-answer-file"

    def tasks(self, n: int, seed: int = 0) -> list[Task]:
        rng = random.Random(seed)
        tasks = []
        for i in range(n):
            word = rng.choice(WORDS)
            prompt = f"Create the file answer.txt containing the word {word}."
            tasks.append(
                Task(
                    id=f"agents-sdk-{seed}-{i}",
                    prompt=[{"role": "user", "content": prompt}],
                    answer=word,
                )
            )
        return tasks

    async def _play(self, client, episode: Episode) -> None:
        async with (
            open_episode(client, episode, self.harness.max_tokens_per_turn) as url,
            AsyncOpenAI(base_url=url, api_key="unused") as openai_client,
        ):
            model = OpenAIChatCompletionsModel(model="policy", openai_client=openai_client)
            agent = AGENT.clone(model=model)
            prompt = episode.task.prompt[-1]["content"]
            try:
                await Runner.run(agent, prompt, context=episode, max_turns=self.harness.max_turns)
            except MaxTurnsExceeded:
                episode.truncated = True

    def request_tools(self, episode: Episode) -> list[dict]:
        """The tools as the SDK sends them with each request: the trajectory records them,
        so that its conversation renders to its tokens again."""
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.params_json_schema,
                    "strict": tool.strict_json_schema,
                },
            }
            for tool in AGENT.tools
        ]

    async def collect(self, episode, sandbox) -> None:
        answer = (await sandbox.read_files(["answer.txt"]))["answer.txt"]
        episode.state["answer"] = answer.decode(errors="replace")[:100] if answer else ""

    async def aclose(self) -> None:
        await super().aclose()
        await close_gateway()


def load_environment() -> AgentsSDKTask:
    return AgentsSDKTask(
        harness=Harness(max_turns=4, max_tokens_per_turn=128), rubric=Rubric(Reward(correct))
    )
