"""A log's tail (``tailLines`` of the Kubernetes pod log, PAI-DLC GetPodLogs' ``MaxLines``)
reads only the log's end: the same lines as splitting all of it, below the window, and
a bounded read of a log at its cap (64 MiB a stream)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO
from unittest import mock

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard_common.auth import ADMIN_USER, TokenStore
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher import logs
from trainyard_launcher.adapters.backend import LogChunk, Stream, TaskRef
from trainyard_launcher.adapters.local import LocalBackend
from trainyard_launcher.adapters.store import JobRecord, MemoryLauncherStore, new_task
from trainyard_launcher.app import create_app
from trainyard_launcher.logs import CappedLog, older_part, read_log, tail, tail_text

from ..support.launcher import ScriptedBackend

ADMIN = "log-tail-admin-token"


class Counted(io.BytesIO):
    """A log part that counts what is read of it."""

    def __init__(self, data: bytes, read: list[int]) -> None:
        super().__init__(data)
        self.counter = read

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.counter[0] += len(data)
        return data


def parts_of(*data: bytes) -> list[BinaryIO]:
    return [io.BytesIO(d) for d in data]


def old_tail(log: bytes, lines: int) -> bytes:
    """What the Kubernetes pod log answered for tailLines before."""
    return b"".join(log.splitlines(keepends=True)[-lines:]) if lines else b""


def old_text(streams: list[bytes], lines: int) -> list[str]:
    """What GetPodLogs answered for MaxLines before."""
    found: list[str] = []
    for data in streams:
        found += data.decode("utf-8", "replace").splitlines()
    return found[-lines:]


# Logs made of what line splitting and UTF-8 decoding treat specially: every break of
# bytes and of text, characters of each length, bytes that are no character, and pieces
# of characters.
PIECES = [b"a", b"ab", b" ", b"\n", b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x1c", b"\x1e",
          b"\x85", b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9", b"\xc3\xa9", b"\xe2\x80",
          b"\xf0\x9f\x98\x80", b"\xf0\x9f", b"\xff", b"\x80"]  # fmt: skip
log_bytes = st.one_of(st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join), st.binary())
# A log split into parts anywhere (a part may end inside a CR LF or a character).
split_log = st.lists(log_bytes, min_size=0, max_size=3)
# Blocks of a few bytes: lines and breaks across blocks, not only across parts.
blocks = st.sampled_from([1, 2, 3, 5, logs.CHUNK])


@settings(max_examples=400, deadline=None)
@given(stdout=split_log, stderr=split_log, lines=st.integers(0, 12), block=blocks)
def test_a_pod_log_tail_is_what_splitting_the_whole_log_gave(
    stdout: list[bytes], stderr: list[bytes], lines: int, block: int
) -> None:
    log = b"".join(stdout + stderr)
    with mock.patch.object(logs, "CHUNK", block):
        assert tail(parts_of(*stdout, *stderr), lines) == old_tail(log, lines)


@settings(max_examples=400, deadline=None)
@given(stdout=split_log, stderr=split_log, lines=st.integers(1, 12), block=blocks)
def test_pod_log_lines_are_what_splitting_each_whole_stream_gave(
    stdout: list[bytes], stderr: list[bytes], lines: int, block: int
) -> None:
    streams = [parts_of(*stdout), parts_of(*stderr)]
    with mock.patch.object(logs, "CHUNK", block):
        found = tail_text(streams, lines)
    assert found == old_text([b"".join(stdout), b"".join(stderr)], lines)


def test_the_edges_of_a_tail() -> None:
    assert tail([], 3) == b"" and tail(parts_of(b"", b""), 3) == b""
    assert tail(parts_of(b"a\nb\n"), 0) == b""
    assert tail(parts_of(b"a\nb\nc"), 1) == b"c"  # a last line without its line feed
    assert tail(parts_of(b"a\r\nb\r\n"), 1) == b"b\r\n"
    assert tail(parts_of(b"a\r", b"\nb"), 2) == b"a\r\nb"  # CR LF across two parts
    assert tail(parts_of(b"1%\r50%\r100%\n"), 2) == b"50%\r100%\n"  # a progress bar
    assert tail(parts_of(b"out", b"err\n"), 1) == b"outerr\n"  # one log: stdout, stderr
    assert tail_text([parts_of(b"out"), parts_of(b"err\n")], 2) == ["out", "err"]
    assert tail_text([parts_of(b"a\nb\n"), []], 1) == ["b"]
    assert tail_text([[], parts_of(b"x\xe2\x80\xa8y\n")], 1) == ["y"]  # U+2028 ends a line


def test_past_the_window_the_log_begins_there() -> None:
    log = b"".join(b"line %d\n" % i for i in range(1000))
    assert tail(parts_of(log), 3, window=64) == b"line 997\nline 998\nline 999\n"
    # Lines longer than the window: the last of them, the first cut short.
    assert tail(parts_of(log), 100, window=20) == b"7\nline 998\nline 999\n"
    # Never from inside a character.
    assert tail(parts_of(("é" * 100 + "\n").encode()), 1, window=10) == ("é" * 4 + "\n").encode()
    assert tail_text([parts_of(log), parts_of(b"error\n")], 5, window=16) == [
        "ne 998", "line 999", "error"
    ]  # fmt: skip


def test_a_tail_of_a_log_at_its_cap_reads_only_its_end() -> None:
    read = [0]
    part = b"ab\n" * (32 * 1024 * 1024 // 3)  # a stream at the default cap: 2 x 32 MiB
    assert tail([Counted(part, read), Counted(part, read)], 1) == b"ab\n"
    assert read[0] <= logs.CHUNK
    read[0] = 0
    assert tail([Counted(part, read), Counted(part, read)], 10**9).endswith(b"ab\n" * 5)
    assert read[0] <= logs.TAIL_WINDOW
    read[0] = 0
    assert tail_text([[Counted(part, read)], [Counted(part, read)]], 2) == ["ab", "ab"]
    assert read[0] <= logs.CHUNK


def test_a_local_logs_parts_are_tailed_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    log = CappedLog(path, 64)
    for i in range(40):
        log.write(b"line %d\n" % i)
    log.close()
    assert older_part(path).exists()
    parts = logs.open_parts(path)
    try:
        assert len(parts) == 2
        assert tail(parts, 7) == old_tail(read_log(path), 7)
    finally:
        for f in parts:
            f.close()
    assert logs.open_parts(tmp_path / "stderr.log") == []


class LogBackend(ScriptedBackend):
    """Each task's log from memory, counting what the launcher took of it."""

    def __init__(self, log: dict[Stream, list[bytes]]) -> None:
        super().__init__()
        self.log = log
        self.read = [0]

    async def read_log(self, ref: TaskRef, stream: Stream, offset: int) -> LogChunk:
        data = b"".join(self.log[stream])
        self.read[0] += len(data)
        return LogChunk(data, len(data))

    async def open_log(self, ref: TaskRef, stream: Stream) -> list[BinaryIO]:
        return [Counted(part, self.read) for part in self.log[stream]]


async def get(backend: LogBackend, url: str) -> httpx.Response:
    """``url`` of the launcher's app over ``backend``, with one job of one task."""
    store = MemoryLauncherStore()
    spec = JobSpec(name="train", user=ADMIN_USER, namespace="team",
                   roles=[RoleSpec(name="worker", replicas=1, command="run")])  # fmt: skip
    tasks = [TaskPlacement(role="worker", index=0, node="n1", host_ip="127.0.0.1")]
    await store.insert_job(JobRecord("j1", 1, "running", spec=spec, tasks=tasks, user=ADMIN_USER))
    await store.insert_task(new_task("j1", 1, "worker", 0, "/tasks", "n1"))
    app = create_app(store, TokenStore(None, ADMIN), backend)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://launcher",
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as client:
        return await client.get(url)


# A task's stdout at the default cap, in short lines, and a line of stderr.
AT_CAP = b"ab\n" * (32 * 1024 * 1024 // 3)


async def test_a_pod_log_tail_of_a_log_at_its_cap_reads_its_end() -> None:
    backend = LogBackend({"stdout": [AT_CAP, AT_CAP], "stderr": [b"done\n"]})
    pod = await get(backend, "/api/v1/namespaces/team/pods/train-worker-0/log?tailLines=2")
    assert (pod.status_code, pod.content) == (200, b"ab\ndone\n")
    assert backend.read[0] <= logs.CHUNK + len(b"done\n")


async def test_get_pod_logs_of_a_log_at_its_cap_reads_its_end() -> None:
    backend = LogBackend({"stdout": [AT_CAP, AT_CAP], "stderr": [b"done\n"]})
    dlc = await get(backend, "/api/v1/jobs/j1/pods/j1-worker-0/logs?MaxLines=3")
    assert dlc.status_code == 200, dlc.text
    assert dlc.json()["Logs"] == ["ab", "ab", "done"]
    assert backend.read[0] <= logs.CHUNK + len(b"done\n")


async def test_a_local_tasks_log_is_opened_as_its_parts(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, log_max_bytes=64, spawner=False)
    ref = TaskRef("j1", 1, "worker", 0)
    backend.task_dir(ref).mkdir(parents=True)
    log = CappedLog(backend.task_dir(ref) / "stdout.log", 64)
    for i in range(40):
        log.write(b"line %d\n" % i)
    log.close()
    whole = (await backend.read_log(ref, "stdout", 0)).data
    for lines in (0, 1, 5, 100):
        parts = await backend.open_log(ref, "stdout")
        try:
            assert tail(parts, lines) == old_tail(whole, lines)
        finally:
            for f in parts:
                f.close()
    assert await backend.open_log(ref, "stderr") == []
