"""A small Docker base image made of the host's own programs, for the Docker tests.

No registry is reachable from CI, so nothing can be pulled: the image is `docker import`ed
from a tar of the programs a sandbox and a shell verifier use, with the libraries `ldd`
names, laid out as the host has them (merged /usr).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from reinforge.sandbox.docker_images import unreachable
from reinforge.sandbox.protocol import DEFAULT_PATH

TAG = "reinforge-test/host-tools:1"
PROGRAMS = (
    "sh bash tar sleep cat head tail mkdir find rm ls grep sed touch wc chmod cp mv env "
    "true false echo test id"
).split()
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


def docker_or_skip() -> None:
    """Skip where no engine answers; CI starts one and sets REINFORGE_REQUIRE_DOCKER=1, so
    there its absence fails instead."""
    reason = unreachable()
    if reason is None:
        return
    if os.environ.get("REINFORGE_REQUIRE_DOCKER"):
        pytest.fail(f"REINFORGE_REQUIRE_DOCKER is set but no Docker engine answers: {reason}")
    pytest.skip(f"no Docker engine reachable: {reason}")


def host_tools_image() -> str:
    """Import the image (again: it takes a second) and return its tag."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for top in ("bin", "sbin", "lib", "lib64"):  # merged /usr, as on the host
            link = tarfile.TarInfo(top)
            link.type, link.linkname = tarfile.SYMTYPE, f"usr/{top}"
            tar.addfile(link)
        for name, text in (("etc/passwd", PASSWD), ("etc/group", GROUP)):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
        added: set[str] = set()
        for program in PROGRAMS:
            found = shutil.which(program, path=DEFAULT_PATH)
            assert found is not None, f"the host has no {program}"
            for path in (Path(found), *_libraries(found)):
                # Under its directory's real path (so /lib/x.so lands in /usr/lib), with the
                # content of what the name points at.
                name = str(path.parent.resolve() / path.name).lstrip("/")
                if name not in added:
                    added.add(name)
                    tar.add(path.resolve(), arcname=name)
    change = ["--change", f"ENV PATH={DEFAULT_PATH}"]
    subprocess.run(
        ["docker", "import", *change, "-", TAG],
        input=buffer.getvalue(),
        check=True,
        capture_output=True,
    )
    return TAG


def _libraries(program: str) -> list[Path]:
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0] if words else ""
        if path.startswith("/"):
            found.append(Path(path))
    return found
