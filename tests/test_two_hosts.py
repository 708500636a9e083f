"""A run across two hosts, on two Ray nodes of this machine that stand in for them
(`tests/twohosts.py`): what one host writes in its memory the other does not see, so a
weight file handed over by its path would not be found."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .commands import ROOT
from .conftest import require_extra
from .twohosts import TwoHosts, two_hosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[TwoHosts]:
    require_extra("ray", "ray")
    with two_hosts() as started:
        yield started


ON_B = """
import os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(resources={"host_b": 1})
def write() -> str:
    open("/dev/shm/reinforge-two-hosts-probe", "w").close()
    return ray.util.get_node_ip_address()
print(ray.get(write.remote()))
"""


def test_host_b_is_its_own_node_with_its_own_memory(hosts):
    done = subprocess.run(
        hosts.on_a([sys.executable, "-c", ON_B, hosts.address]),
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "127.0.0.2"
    assert (hosts.b.shm / "reinforge-two-hosts-probe").exists()
    if not hosts.isolated:
        pytest.skip("this machine gives its nodes no /dev/shm of their own (needs root)")
    assert not (hosts.a.shm / "reinforge-two-hosts-probe").exists()
    assert os.stat(hosts.b.shm).st_dev not in {
        os.stat("/dev/shm").st_dev,
        os.stat(hosts.a.shm).st_dev,
    }
