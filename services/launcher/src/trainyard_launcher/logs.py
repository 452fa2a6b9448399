"""A task's log files: written with a size cap by the task's wrapper, read now or
followed as they grow by the log API.

Each stream (``stdout.log``, ``stderr.log``) is kept in at most two parts of half the cap
(``YARD_LOG_MAX_BYTES``, default 64 MiB per stream): when the current part is full it
becomes ``<name>.1``, replacing the older part, and a new part starts. So a task never
keeps more than the cap per stream, and always at least the newest half of it; what came
before is dropped (rotated once, not kept). Parts end at a line's end where a line
fits. Standard library only: the task wrapper imports this.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

CHUNK = 64 * 1024
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def older_part(path: Path) -> Path:
    return path.with_name(path.name + ".1")


class CappedLog:
    """An append-only log of at most ``max_bytes`` (0: no cap) kept in two parts."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.part = max(max_bytes // 2, 1) if max_bytes > 0 else 0
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        # Whether the part ends at a line's end (an existing one is not looked at).
        self._at_line_end = self.size == 0

    def write(self, data: bytes) -> None:
        while data:
            if self.part and self.size >= self.part:
                self._rotate()
            room = len(data) if not self.part else self.part - self.size
            take = len(data)
            if take > room:
                # End the part at a line's end when one fits; where the next line does
                # not fit and the part, at least half full, ends at a line's end, it ends
                # there; else cut where it is full.
                cut = data.rfind(b"\n", 0, room)
                if cut >= 0 and self.size + cut + 1 > self.part // 2:
                    take = cut + 1
                elif self._at_line_end and self.size > 0 and self.size >= self.part // 2:
                    self._rotate()
                    continue
                else:
                    take = room
            self._write_all(data[:take])
            data = data[take:]
            if data and self.part:
                self._rotate()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self.size += written
        if data:
            self._at_line_end = data.endswith(b"\n")

    def _rotate(self) -> None:
        os.replace(self.path, older_part(self.path))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0
        self._at_line_end = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_from(path: Path, offset: int, limit: int | None = None) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read() if limit is None else f.read(limit)
    except FileNotFoundError:
        return b""


def read_log(path: Path) -> bytes:
    """Everything kept of a log: its older part, then the current one."""
    return read_from(older_part(path), 0) + read_from(path, 0)


def _open(path: Path, offset: int) -> BinaryIO | None:
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None
    f.seek(offset)
    return f


def _rotated(f: BinaryIO, path: Path) -> bool:
    try:
        return os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False


async def follow(
    path: Path,
    offset: int,
    ended: Callable[[], Awaitable[bool]],
    poll_s: float = 0.3,
    with_older: bool = False,
) -> AsyncIterator[bytes]:
    """New bytes of ``path`` from ``offset`` as they come, across the wrapper's
    rotations; stops once ``ended()`` and everything written before that is sent.
    ``with_older``: send the older part first (a follow from the start)."""
    import asyncio  # here: the task wrapper imports this module and never follows

    if with_older:
        if older := read_from(older_part(path), 0):
            yield older
    f = _open(path, offset)
    try:
        while True:
            if f is None:
                f = _open(path, 0)
            chunk = f.read(CHUNK) if f is not None else b""
            if chunk:
                yield chunk
                continue
            if f is not None and _rotated(f, path):
                # The writer fills a part before it renames it: read what is left of
                # the old one, then go on with the new one from its start.
                while chunk := f.read(CHUNK):
                    yield chunk
                f.close()
                f = None
                continue
            if await ended():
                # The task may have written its last lines between our read and its end.
                for _ in range(2):
                    if f is None:
                        f = _open(path, 0)
                    while f is not None and (chunk := f.read(CHUNK)):
                        yield chunk
                    if f is None or not _rotated(f, path):
                        break
                    f.close()
                    f = None
                return
            await asyncio.sleep(poll_s)
    finally:
        if f is not None:
            f.close()
