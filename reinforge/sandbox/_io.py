"""Non-blocking pipe plumbing and file framing between the manager and a sandbox.

Pipes are read with `loop.add_reader` rather than asyncio transports so output caps are
enforced while reading: a command printing gigabytes costs the manager `cap` bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping

from reinforge.sandbox import _helper as wire

CHUNK = 256 * 1024


class PipeReader:
    """Collects up to `cap` bytes from a pipe, draining (and dropping) the rest."""

    def __init__(
        self,
        fd: int,
        cap: int,
        on_chunk: Callable[[bytes], None] | None = None,
        on_full: Callable[[], object] | None = None,
    ) -> None:
        self._fd = fd
        self._cap = cap
        self._on_chunk = on_chunk
        self._on_full = on_full  # called once, when the cap is first passed
        self._chunks: list[bytes] = []
        self._size = 0
        self.truncated = False
        self._loop = asyncio.get_running_loop()
        self.eof: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        if self._on_chunk is not None:
            self._on_chunk(data)
        room = self._cap - self._size
        if len(data) > room:
            if not self.truncated and self._on_full is not None:
                self._on_full()
            self.truncated = True
            data = data[:room]
        if data:
            self._chunks.append(data)
            self._size += len(data)

    def value(self) -> bytes:
        return b"".join(self._chunks)

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if not self.eof.done():
            self.eof.set_result(None)


async def feed_pipe(fd: int, data: bytes) -> None:
    """Write `data` to a pipe without blocking the loop; stop quietly if the reader left."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view[:CHUNK]) :]
            except BlockingIOError:
                writable = loop.create_future()
                loop.add_writer(fd, writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(fd)
            except BrokenPipeError:
                return
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def write_frames(files: Mapping[str, bytes], mode: int) -> bytes:
    """Encode files for the helper's built-in writer (no tar needed in the base)."""
    parts = []
    for path, data in files.items():
        encoded = path.encode()
        parts.append(wire.WRITE_FRAME.pack(len(encoded), mode, len(data)) + encoded + data)
    return b"".join(parts)


def parse_read_frames(data: bytes, count: int, max_bytes: int) -> list[bytes | None]:
    """Decode the helper's read output; any inconsistency is an error, never a guess."""
    out: list[bytes | None] = []
    pos = 0
    for _ in range(count):
        if pos + wire.READ_FRAME.size > len(data):
            raise ValueError("truncated read_files output")
        status, length = wire.READ_FRAME.unpack_from(data, pos)
        pos += wire.READ_FRAME.size
        if length > max_bytes or pos + length > len(data):
            raise ValueError("malformed read_files output")
        out.append(data[pos : pos + length] if status == 0 else None)
        pos += length
    return out
