"""A verifiers environment with a tool, in verifiers' own style: a Python function served
to the harness as an MCP tool. One reward is for calling it, one for the sum it returns,
and one, which varies even for a random model, for the answer's length.

The tool server runs as `python -m vf_tool_env`, so this module must be importable."""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class SumData(vf.TaskData):
    a: int
    b: int


class SumTask(vf.Task[SumData]):
    @vf.stop
    async def enough(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 3

    @vf.reward(weight=0.2)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(bool(trace.tool_messages))

    @vf.reward(weight=0.1)
    async def length(self, trace: vf.Trace) -> float:
        return min(len(trace.last_reply) / 200, 1.0)

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(str(self.data.a + self.data.b) in trace.last_reply)


class SumConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    @classmethod
    def toolsets(cls, config: SumConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    def load(self) -> list[SumTask]:
        return [
            SumTask(
                SumData(prompt=f"Use the calc_add tool to add {a} and {b}.", a=a, b=b),
                self.config.task,
            )
            for a, b in [(17, 25), (40, 2), (123, 321)]
        ]


__all__ = ["SumTaskset"]

if __name__ == "__main__":
    CalcToolset.run()
