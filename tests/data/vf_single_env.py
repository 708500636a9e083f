"""A single-turn verifiers environment, in verifiers' own style: a small dataset and two
weighted rewards. Its length reward varies even for a random model.

reinforge eval verifiers:tests/data/vf_single_env.py --model tiny-random
"""

import verifiers.v1 as vf

DATASET = [
    {"word": "apple", "prompt": "Repeat the word apple."},
    {"word": "pear", "prompt": "Repeat the word pear."},
    {"word": "plum", "prompt": "Repeat the word plum."},
    {"word": "fig", "prompt": "Repeat the word fig."},
]
SYSTEM = "Answer in one word."


class WordData(vf.TaskData):
    word: str


class WordTask(vf.Task[WordData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=0.5)
    async def length(self, trace: vf.Trace) -> float:
        return min(len(trace.last_reply) / 200, 1.0)

    @vf.reward(weight=2.0)
    async def said_word(self, trace: vf.Trace) -> float:
        return float(self.data.word in trace.last_reply.lower())


class WordConfig(vf.TasksetConfig):
    split: str = "train"


class WordTaskset(vf.Taskset[WordTask, WordConfig]):
    def load(self) -> list[WordTask]:
        rows = DATASET if self.config.split == "train" else DATASET[:2]
        return [
            WordTask(
                WordData(prompt=row["prompt"], system_prompt=SYSTEM, word=row["word"]),
                self.config.task,
            )
            for row in rows
        ]


__all__ = ["WordTaskset"]
