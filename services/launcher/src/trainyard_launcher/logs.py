"""Reading a task's log files: a range now, or following them until the task ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

CHUNK = 64 * 1024


def read_from(path: Path, offset: int, limit: int | None = None) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read() if limit is None else f.read(limit)
    except FileNotFoundError:
        return b""


async def follow(
    path: Path, offset: int, ended: Callable[[], Awaitable[bool]], poll_s: float = 0.3
) -> AsyncIterator[bytes]:
    """New bytes of ``path`` from ``offset`` as they come; stops once ``ended()`` and
    everything written before that is sent."""
    position = offset
    while True:
        chunk = read_from(path, position, CHUNK)
        if chunk:
            position += len(chunk)
            yield chunk
            continue
        if await ended():
            # The task may have written its last lines between our read and its end.
            while chunk := read_from(path, position, CHUNK):
                position += len(chunk)
                yield chunk
            return
        await asyncio.sleep(poll_s)
