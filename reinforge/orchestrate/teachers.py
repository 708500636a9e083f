"""The teachers of on-policy distillation (`distill.teachers`) and their place in a step:
each group's task is routed to its teacher, which scores every token of the group's
rollouts; the log-probs of the sampled ones are recorded on each trajectory
(`teacher_logprobs`), where the trainer's selection reads them.
"""

from __future__ import annotations

import asyncio

from transformers import PreTrainedTokenizerBase

from reinforge.config import Config
from reinforge.policy.teacher import Teacher
from reinforge.train.distill import TeacherConfig
from reinforge.train.trainer import trainable
from reinforge.types import Group, Task, Trajectory


class Teachers:
    """The opened teachers, in the order `distill.teachers` lists them; none when the
    run does not distil."""

    def __init__(self, routes: list[tuple[TeacherConfig, Teacher]], environment: str) -> None:
        self._routes = routes
        self.environment = environment
        """The environment's name, which a route may name."""

    @classmethod
    async def open(
        cls, config: Config, tokenizer: PreTrainedTokenizerBase, environment: str
    ) -> Teachers:
        """Open each teacher and check once that it shares the student's vocabulary."""
        routes: list[tuple[TeacherConfig, Teacher]] = []
        teachers = cls(routes, environment)
        try:
            for spec in config.distill.teachers if config.distill else []:
                teacher = await Teacher.open(
                    spec.model, config.model, config.engine, spec.served_name
                )
                routes.append((spec, teacher))
                await teacher.check_vocabulary(tokenizer)
        except BaseException:
            await teachers.aclose()
            raise
        return teachers

    def teacher_of(self, task: Task) -> Teacher | None:
        """The first teacher whose route is None, the environment's name or one of the
        task's tags (`info["tags"]`, a list of strings or one string)."""
        tags = task.info.get("tags") or []
        tags = [tags] if isinstance(tags, str) else tags
        for spec, teacher in self._routes:
            if spec.route is None or spec.route == self.environment or spec.route in tags:
                return teacher
        return None

    async def score(self, groups: list[Group]) -> list[Group]:
        """The groups, each trainable rollout of a taught task carrying its teacher's
        log-prob of every sampled token."""
        return list(await asyncio.gather(*(self._score_group(g) for g in groups)))

    async def _score_group(self, group: Group) -> Group:
        teacher = self.teacher_of(group.task)
        if teacher is None:
            return group
        scored = await asyncio.gather(*(_scored(teacher, t) for t in group.trajectories))
        return group.model_copy(update={"trajectories": list(scored)})

    async def aclose(self) -> None:
        for _, teacher in self._routes:
            await teacher.aclose()


async def _scored(teacher: Teacher, trajectory: Trajectory) -> Trajectory:
    if not trainable(trajectory):
        return trajectory
    # logprobs[i - 1] is token i's, given tokens 0..i-1; token 0 is never sampled.
    logprobs = await teacher.logprobs(trajectory.token_ids)
    sampled = [lp for lp, bit in zip(logprobs, trajectory.loss_mask[1:], strict=True) if bit]
    return trajectory.model_copy(update={"teacher_logprobs": sampled})
