"""Fixtures for the sandbox suite: real namespaces and cgroups, nothing faked.

The suite needs Linux user namespaces; where the kernel forbids them it is skipped with
that reason (a CI runner without them cannot run any local sandbox).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reinforge.sandbox import LocalProvider, LocalSandbox, SandboxSpec

from .helpers import userns_skip_reason

SKIP_REASON = userns_skip_reason()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Without user namespaces no local sandbox can start: skip, and say why."""
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents and "docker" not in item.nodeid:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def provider() -> LocalProvider:
    return LocalProvider()


@pytest.fixture
async def sandbox(provider: LocalProvider) -> AsyncIterator[LocalSandbox]:
    sb = await provider.create(SandboxSpec(memory_bytes=256 << 20, pids=64, disk_bytes=64 << 20))
    yield sb
    await sb.close()
