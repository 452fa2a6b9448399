"""Placement replicas as real processes, for the leadership and node-admin tests: each a
``python -m trainyard_placement`` with its own port, on a NATS server of the test's own."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from nats.js.errors import NotFoundError

from trainyard_common.bus import Bus
from trainyard_common.events import Event, JobPlaced, JobQueued, decode
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_common.subjects import STREAM
from trainyard_stack.components import free_port

ADMIN_TOKEN = "placement-leader-test-admin-token"
TTL_S = 1.5

CLUSTER = {
    "nodes": [
        {
            "name": "n1",
            "cpu": 8,
            "memory_mb": 16000,
            "gpus": 2,
            "gpu_type": "V100",
            "port_range": [31000, 31999],
        }
    ]
}


def spec(name: str) -> JobSpec:
    return JobSpec(
        name=name,
        roles=[
            RoleSpec(
                name="worker", command="true", resources=Resources(cpu=1, gpu=1, gpu_type="V100")
            )
        ],
    )


class Replica:
    """One ``python -m trainyard_placement`` process (or another ``service``'s)."""

    def __init__(self, env: dict[str, str], log: Path, service: str = "placement") -> None:
        self.port = free_port()
        self.service = service
        self.env = {**env, f"YARD_{service.upper()}_PORT": str(self.port)}
        self.log_path = log
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(
            base_url=self.url, timeout=5, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )

    def start(self) -> Replica:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"trainyard_{self.service}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if self.http.get("/healthz").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{self.service} did not become healthy"
            time.sleep(0.1)

    def lease(self) -> dict[str, object]:
        answer = self.http.get("/v1/placement/leader")
        assert answer.status_code == 200, answer.text
        return answer.json()

    async def wait_leading(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.lease()["leading"]:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, f"{self.url} never led:\n{self.log()}"
            await asyncio.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.http.close()
        return self.proc.returncode if self.proc else None


async def stream_events(bus: Bus, subject: str, job_id: str | None = None) -> list[Event]:
    """Every event of ``subject`` in the stream, in order, duplicates included (of one
    job, with ``job_id``: subjects do not name the job)."""
    events: list[Event] = []
    seq = 1
    while True:
        try:
            msg = await bus.js.get_msg(STREAM, seq, subject=subject, next=True)
        except NotFoundError:
            return events
        event = decode(msg.data or b"")
        if job_id is None or event.job_id == job_id:
            events.append(event)
        assert msg.seq is not None
        seq = msg.seq + 1


async def placed_events(bus: Bus) -> list[JobPlaced]:
    """Every JobPlaced in the stream, duplicates included."""
    events = await stream_events(bus, "yard.job.placed")
    assert all(isinstance(event, JobPlaced) for event in events)
    return events  # type: ignore[return-value]


async def wait_placed(bus: Bus, job_id: str, timeout: float = 20.0) -> JobPlaced:
    deadline = time.monotonic() + timeout
    while True:
        for event in await placed_events(bus):
            if event.job_id == job_id:
                return event
        assert time.monotonic() < deadline, f"{job_id} was not placed within {timeout}s"
        await asyncio.sleep(0.1)


async def wait_queued(bus: Bus, job_id: str, timeout: float = 20.0) -> JobQueued:
    deadline = time.monotonic() + timeout
    while True:
        queued = await stream_events(bus, "yard.job.queued", job_id)
        if queued:
            assert isinstance(queued[-1], JobQueued)
            return queued[-1]
        assert time.monotonic() < deadline, f"{job_id} was not queued within {timeout}s"
        await asyncio.sleep(0.1)
