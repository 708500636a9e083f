"""`task.toml` as Harbor's own task model reads it: the keys a sandbox needs, each meaning
what it means in Harbor (docs/harbor.md has the table), and every other key ignored.
Harbor's package needs Python >= 3.12; tests/test_harbor_compat.py checks this reading
against it key by key."""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reinforge.errors import UsageError


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


NetworkMode = Literal["public", "no-network", "allowlist"]
"""Harbor's network policies; reinforge has no allowlist, so only `public` opens the network."""


class AgentSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)
    network_mode: NetworkMode | None = None
    """The agent phase's own policy, over `[environment]`'s."""


class VerifierSection(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class EnvironmentSection(_Section):
    cpus: float = Field(1, gt=0)
    """Harbor sets no limit where a task gives none; a rollout's sandbox always has one."""
    memory_mb: int = Field(2048, gt=0)
    storage_mb: int = Field(10240, gt=0)
    network_mode: NetworkMode = "public"
    allow_internet: bool | None = None
    """Deprecated in Harbor: where `network_mode` is not given, it is `public` or `no-network`."""
    workdir: str | None = None
    """Where the agent works, over the Dockerfile's WORKDIR."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables every process of the task gets: the agent's, the oracle's, the verifier's."""
    os: str = "linux"
    docker_image: str | None = None
    """A prebuilt image, run instead of `environment/Dockerfile` (which it makes optional),
    pulled where the Docker engine lacks it."""

    @model_validator(mode="before")
    @classmethod
    def _sizes_as_mb(cls, data: Any) -> Any:
        """Harbor's deprecated `memory = "4G"` and `storage` are `memory_mb` and `storage_mb`;
        one that disagrees with the key it stands for is refused, as Harbor refuses it."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old in ("memory", "storage"):
            value = data.pop(old, None)
            if isinstance(value, str):  # Harbor drops any other type
                new, mb = f"{old}_mb", _size_mb(value)
                if data.setdefault(new, mb) != mb:
                    raise ValueError(f"{old} = {value!r} is {mb} MB but {new} = {data[new]!r}")
        return data

    @model_validator(mode="after")
    def _legacy_internet(self) -> EnvironmentSection:
        if self.allow_internet is not None and "network_mode" not in self.model_fields_set:
            self.network_mode = "public" if self.allow_internet else "no-network"
        return self

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, workdir: str | None) -> str | None:
        if workdir is None:
            return None
        if not workdir.startswith("/"):
            raise ValueError(f"workdir {workdir!r} is not an absolute path")
        return str(PurePosixPath(workdir))


class TaskConfig(_Section):
    """`task.toml`: the sections a sandbox needs, and the metadata that selects tasks;
    unknown keys are ignored."""

    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Harbor's free-form `[metadata]` (`difficulty`, `category`, `tags`...)."""
    steps: list[Any] | None = None
    """Harbor's multi-step tasks, which are refused: each step has its own instruction."""

    @property
    def agent_internet(self) -> bool:
        """Whether the task lets its agent phase reach the network."""
        return (self.agent.network_mode or self.environment.network_mode) == "public"


def _size_mb(text: str) -> int:
    """Harbor's size: a number with G, M or K (no B), in whole megabytes."""
    units = {"G": 1024, "M": 1, "K": 1 / 1024}
    text = text.strip().upper()
    if not text or text[-1] not in units:
        raise ValueError(f"size {text!r}: expected a number with G, M or K")
    return int(float(text[:-1]) * units[text[-1]])


ENV_TEMPLATE = re.compile(r"\$\{(?P<name>[^}:]+)(?::-(?P<default>.*))?\}")
"""A value that is all `${NAME}` or `${NAME:-default}` is read from the host's environment."""


def resolve_env(env: dict[str, str], table: str) -> dict[str, str]:
    """`env` with its `${NAME}` values taken from the host, as Harbor's runner takes them."""
    resolved = {}
    for key, value in env.items():
        template = ENV_TEMPLATE.fullmatch(value)
        if template is None:
            resolved[key] = value
        elif template["name"] in os.environ:
            resolved[key] = os.environ[template["name"]]
        elif template["default"] is not None:
            resolved[key] = template["default"]
        else:
            raise UsageError(f"{table} {key} = {value!r}: ${template['name']} is not set")
    return resolved
