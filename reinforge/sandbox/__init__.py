"""Sandboxes: one isolated computer per rollout (protocol, local backend, pool, Docker)."""

from reinforge.sandbox.local import LocalProvider, LocalSandbox
from reinforge.sandbox.pool import PooledSandbox, SandboxPool
from reinforge.sandbox.protocol import (
    Capabilities,
    ExecResult,
    HostView,
    Image,
    Rootfs,
    Sandbox,
    SandboxClosed,
    SandboxError,
    SandboxPaused,
    SandboxProvider,
    SandboxSpec,
    TarTooLarge,
)

__all__ = [
    "Capabilities",
    "ExecResult",
    "HostView",
    "Image",
    "LocalProvider",
    "LocalSandbox",
    "PooledSandbox",
    "Rootfs",
    "Sandbox",
    "SandboxClosed",
    "SandboxError",
    "TarTooLarge",
    "SandboxPaused",
    "SandboxPool",
    "SandboxProvider",
    "SandboxSpec",
]
