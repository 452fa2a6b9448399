"""A task's log files: written with a size cap by the task's wrapper, read now or
followed as they grow by the log API.

Each stream (``stdout.log``, ``stderr.log``) is kept in at most two parts of half the cap
(``YARD_LOG_MAX_BYTES``, default 64 MiB per stream): when the current part is full it
becomes ``<name>.1``, replacing the older part, and a new part starts. So a task never
keeps more than the cap per stream, and always at least the newest half of it; what came
before is dropped (rotated once, not kept). Parts end at a line's end where a line
fits. A tail of a log (its last lines) reads only its end (``tail``, ``tail_text``).
Standard library only: the task wrapper imports this.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import AnyStr, BinaryIO

CHUNK = 64 * 1024
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# The most of a log's end a tail reads (``read_end``): a stream keeps up to its cap
# (64 MiB), and splitting all of it into lines to answer the last few held gigabytes.
# Past it the log is taken to begin there, as if rotated: a tail of longer lines than
# fit answers the last lines within it (the first of them maybe cut short).
TAIL_WINDOW = 4 * 1024 * 1024
# Where lines end for bytes.splitlines() and for str.splitlines().
_BYTE_BREAKS = re.compile(rb"\r\n|[\r\n]")
_TEXT_BREAKS = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


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


def open_parts(path: Path) -> list[BinaryIO]:
    """A log's parts open for reading, oldest first (the caller closes them)."""
    parts: list[BinaryIO] = []
    try:
        for part in (path, older_part(path)):
            if (f := _open(part, 0)) is not None:
                parts.append(f)
    except BaseException:
        for f in parts:  # the first one opened, when opening the second failed
            f.close()
        raise
    inodes = {os.fstat(f.fileno()).st_ino for f in parts}
    if len(inodes) < len(parts):
        # Rotated between the two opens: the current part became the older one.
        parts.pop().close()
    return parts[::-1]


def tail(parts: Sequence[BinaryIO], lines: int, window: int = TAIL_WINDOW) -> bytes:
    """The last ``lines`` lines of the log made of ``parts`` (oldest first), with their
    ends: ``b"".join(log.splitlines(keepends=True)[-lines:])`` (none for 0), of no more
    than the log's last ``window`` bytes."""
    return _last_lines(read_end(parts, lines, window), lines)


def tail_text(
    streams: Sequence[Sequence[BinaryIO]], lines: int, window: int = TAIL_WINDOW
) -> list[str]:
    """The last ``lines`` lines of ``streams`` (logs, each made of parts) one after the
    other, each stream's lines its own: the last of ``[line for log in streams for line
    in log.decode("utf-8", "replace").splitlines()]``, of no more than each stream's
    last ``window`` bytes."""
    found: list[str] = []
    for parts in reversed(streams):
        if (want := lines - len(found)) > 0:
            text = read_end(parts, want, window).decode("utf-8", "replace")
            found = _last_text_lines(text, want) + found
    return found


def read_end(parts: Sequence[BinaryIO], lines: int, window: int = TAIL_WINDOW) -> bytes:
    """The end of the log made of ``parts`` (oldest first) that holds its last ``lines``
    lines, read backwards a block at a time: from right after the line feed before them
    (other line breaks, ``\\r`` and text's, only add lines), else from the log's start,
    else from ``window`` bytes before its end (at a character's start)."""
    if lines <= 0:
        return b""
    blocks: list[bytes] = []
    feeds = 0
    room = window
    for f in reversed(parts):
        end = f.seek(0, os.SEEK_END)
        while end > 0:
            if room <= 0:
                return _from_character(b"".join(reversed(blocks)))
            start = max(end - CHUNK, end - room, 0)
            f.seek(start)
            block = f.read(end - start)
            room -= len(block)
            end = start
            count = block.count(b"\n")
            if feeds + count > lines:
                cut = len(block)
                for _ in range(lines + 1 - feeds):
                    cut = block.rfind(b"\n", 0, cut)
                blocks.append(block[cut + 1 :])
                return b"".join(reversed(blocks))
            feeds += count
            blocks.append(block)
    return b"".join(reversed(blocks))


def _from_character(data: bytes) -> bytes:
    """``data`` from its first character's start: past the UTF-8 continuation bytes of
    one cut before it."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    return data[skip:]


def _last_lines(data: bytes, lines: int) -> bytes:
    """``b"".join(data.splitlines(keepends=True)[-lines:])`` (none for 0), without
    splitting the lines before them."""
    return data[_tail_start(data, lines, _BYTE_BREAKS) :]


def _last_text_lines(text: str, lines: int) -> list[str]:
    """``text.splitlines()[-lines:]`` (none for 0), without splitting the lines before
    them."""
    return text[_tail_start(text, lines, _TEXT_BREAKS) :].splitlines()


def _tail_start(text: AnyStr, lines: int, breaks: re.Pattern[AnyStr]) -> int:
    """Where the last ``lines`` lines of ``text`` begin (a line begins where a break
    ends, but at the very end): looked for a block at a time from the end."""
    if lines <= 0:
        return len(text)
    hi = len(text)
    while hi > 0:
        lo = max(hi - CHUNK, 0)
        # The breaks that end in (lo, hi]: one going on past hi (CR LF) is the next's.
        last = min(hi, len(text) - 1)
        starts = [m.end() for m in breaks.finditer(text, lo, hi + 1) if m.end() <= last]
        if len(starts) >= lines:
            return starts[-lines]
        lines -= len(starts)
        hi = lo
    return 0


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
