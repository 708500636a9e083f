"""A multi-turn verifiers environment, in verifiers' own style: the environment answers
each reply (higher, lower, or correct) until the number is found or three guesses are
spent. Its length reward varies even for a random model."""

import re

import verifiers.v1 as vf

GUESSES = 3


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def guesses(self, trace: vf.Trace) -> float:
        return len(trace.assistant_messages) / GUESSES

    @vf.reward(weight=0.1)
    async def length(self, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        return min(sum(len(reply) for reply in replies) / 600, 1.0)

    @vf.reward(weight=3.0)
    async def found(self, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        return float(any(str(self.data.secret) in reply for reply in replies))


def feedback(reply: str, secret: int) -> str:
    """The environment's answer to one guess."""
    number = re.search(r"-?\d+", reply)
    if number is None:
        return "That is not a number. Guess a number from 1 to 10."
    guess = int(number.group())
    if guess == secret:
        return "Correct!"
    return "Higher." if guess < secret else "Lower."


class GuessEnv(vf.SingleAgentEnv):
    """Answers each guess until it is right or the guesses are spent."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            for _ in range(GUESSES - 1):
                if segment.terminated:
                    break
                answer = feedback(segment.last_reply, task.data.secret)
                if answer == "Correct!":
                    break
                segment = await interaction.turn(answer)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> list[GuessTask]:
        return [
            GuessTask(
                GuessData(prompt="Guess my number from 1 to 10.", secret=secret),
                self.config.task,
            )
            for secret in (3, 7, 9)
        ]


__all__ = ["GuessEnv", "GuessTaskset"]
