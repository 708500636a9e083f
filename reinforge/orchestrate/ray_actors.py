"""What every Ray actor of a run is asked through: its node, and a question answered within
a bound or in one line. Ray is an optional extra, imported here once."""

from __future__ import annotations

import re
from typing import Any

from reinforge.errors import UsageError

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.placement_group import remove_placement_group
except ImportError:  # told in one line when a run asks for it (`RayCluster`)
    ray = None

ANSWER_S = 60.0
"""How long an actor may take to answer a question (its node, its engine's exit code):
one on a node that died or hangs never answers, and Ray would wait for ever."""


def node_id() -> str:
    """This process's Ray node, by id."""
    return ray.get_runtime_context().get_node_id()


def ask(method: Any, who: str) -> Any:
    """An actor's answer to a question that takes no time, or one line: an actor on a
    node that died or hangs would keep `ray.get` waiting for ever (or, its node found dead,
    raise Ray's many lines)."""
    try:
        return ray.get(method.remote(), timeout=ANSWER_S)
    except GetTimeoutError:
        raise UsageError(
            f"{who} did not answer within {ANSWER_S:.0f} s (is its node up?)"
        ) from None
    except RayActorError as error:
        raise UsageError(f"{who} died before it answered {death(error)}") from None


def death(error: RayActorError) -> str:
    """Where and why Ray says an actor died, in one line: its node's address where Ray
    knows it, and Ray's reason (`reason`)."""
    lines = str(error).splitlines()
    fields = dict(line.strip().partition(": ")[::2] for line in lines if line.startswith("\t"))
    where = f"on node {fields['ip']} " if fields.get("ip") else ""
    return f"{where}({reason(error)})"


def reason(error: RayActorError) -> str:
    """Ray's reason for an actor's death or silence, in one line: the first sentence of it,
    without ids (the rest of Ray's many lines is a headline, ids and advice)."""
    lines = str(error).splitlines()
    reasons = [line.strip() for line in lines if line.strip() and not line.startswith("\t")]
    reasons = reasons[1:] or reasons  # past "The actor died unexpectedly ...", if more
    why = reasons[0].split(". ")[0].rstrip(".") if reasons else "no reason given"
    return "Ray: " + re.sub(r"\b[0-9a-f]{16,} ?", "", why)


def release(group: Any) -> None:
    """A placement group back to the cluster; nothing for None (a failed run stops twice:
    its owner forgets the group once released)."""
    if group is not None:
        remove_placement_group(group)
