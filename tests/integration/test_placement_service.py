"""Placement against real servers: the job store on FerretDB (the same contract run on
the in-memory fake, so the fake cannot drift), and ``python -m trainyard_placement`` as
its own process on a real NATS JetStream."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from trainyard_common.bus import Bus
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobState,
    TaskPlacement,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, PortSpec, Resources, RoleSpec
from trainyard_placement.adapters.store import DocJobStore, JobStore, MemoryJobStore
from trainyard_stack.components import NatsServer, free_port

from ..support.stores import REAL_STORES, store_client
from .placement_replicas import stream_events


def spec(gpus: int = 2, name: str = "train") -> JobSpec:
    return JobSpec(name=name, env=[{"name": "a.b", "value": "1"}, {"name": "$X", "value": "2"}],
                   roles=[RoleSpec(name="worker", command="python train.py",
                                   resources=Resources(cpu=1, gpu=gpus, gpu_type="V100"),
                                   ports=[PortSpec(label="http", count=2)])])  # fmt: skip


TASK = TaskPlacement(role="worker", index=0, node="n1", host_ip="10.0.0.1", gpu_indices=[0, 1],
                     ports=[{"label": "http", "ports": [31001, 31002]}])  # fmt: skip


# ------------------------------------------------------------------------ store contract


@pytest.fixture(params=["memory", *REAL_STORES])
async def store(request: pytest.FixtureRequest, db_prefix: str) -> AsyncIterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore()
        return
    async with store_client(request, request.param, db_prefix) as client:
        yield DocJobStore(client[f"{db_prefix}_placement"]["jobs"])


async def test_store_queued_to_placed_to_done(store: JobStore) -> None:
    assert await store.add_queued("j1", attempt=1, arrival_seq=7, spec=spec())
    assert not await store.add_queued("j1", attempt=1, arrival_seq=9, spec=spec(gpus=1))
    record = await store.get("j1")
    assert record is not None
    assert (record.state, record.arrival_seq, record.spec) == ("queued", 7, spec())
    assert record.spec.env[0].name == "a.b"  # key-unsafe names survive as a JSON string

    await store.note_reasons("j1", ["no room"], 1)
    assert await store.mark_placed("j1", [TASK])
    assert not await store.mark_placed("j1", [TASK])  # the transition happens once
    await store.note_reasons("j1", ["ignored once placed"], 2)
    record = await store.get("j1")
    assert record is not None
    assert (record.state, record.allocation, record.placed_published) == ("placed", (TASK,), False)
    assert (record.reasons, record.queued_notices) == (("no room",), 1)
    await store.mark_placed_published("j1")
    assert (await store.get("j1")).placed_published  # type: ignore[union-attr]

    assert not await store.mark_done("j1", "queued")
    assert await store.mark_done("j1", "placed")
    assert not await store.mark_done("j1", "placed")
    assert (await store.get("j1")).state == "done"  # type: ignore[union-attr]
    assert await store.get("nope") is None


async def test_store_change_answers_whether_it_changed_anything(store: JobStore) -> None:
    # Handlers lean on it: a redelivered change finds its values there already and
    # answers False, so what followed it is caught up another way (handlers.catch_up).
    from trainyard_placement.adapters.store import spec_fields

    await store.add_queued("j1", attempt=1, arrival_seq=1, spec=spec())
    fields = spec_fields(spec(gpus=1))
    assert not await store.change("j1", states=("placed",), attempt=1, fields=fields)
    assert not await store.change("j1", states=("queued",), attempt=2, fields=fields)
    assert await store.change("j1", states=("queued",), attempt=1, fields=fields)
    assert not await store.change("j1", states=("queued",), attempt=1, fields=fields)
    assert (await store.get("j1")).spec == spec(gpus=1)  # type: ignore[union-attr]


async def test_store_tombstone_and_active(store: JobStore) -> None:
    assert await store.add_tombstone("early", attempt=1)
    assert not await store.add_queued("early", attempt=1, arrival_seq=1, spec=spec())
    assert not await store.add_tombstone("early", attempt=1)
    assert (await store.get("early")).state == "stopped_early"  # type: ignore[union-attr]
    for i, job_id in enumerate(["q", "p", "d"]):
        await store.add_queued(job_id, attempt=1, arrival_seq=i, spec=spec())
    await store.mark_placed("p", [TASK])
    await store.mark_done("d", "queued", stopped_in_queue=True)
    active = {r.job_id: r.state for r in await store.active()}
    assert active == {"q": "queued", "p": "placed"}
    assert (await store.get("d")).stopped_in_queue  # type: ignore[union-attr]


async def test_store_requeues_a_placed_attempt_as_the_next(store: JobStore) -> None:
    not_before = datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC)
    await store.add_queued("j1", attempt=1, arrival_seq=3, spec=spec())
    assert not await store.requeue("j1", from_attempt=1, attempt=2, not_before=not_before)
    await store.note_reasons("j1", ["no room"], 1)
    await store.mark_placed("j1", [TASK])
    await store.mark_placed_published("j1")
    assert not await store.requeue("j1", from_attempt=2, attempt=3, not_before=not_before)
    assert await store.requeue("j1", from_attempt=1, attempt=2, not_before=not_before)
    assert not await store.requeue("j1", from_attempt=1, attempt=2, not_before=not_before)
    record = await store.get("j1")
    assert record is not None
    assert (record.state, record.attempt, record.not_before, record.arrival_seq) == (
        "queued",
        2,
        not_before,
        3,
    )
    assert (record.allocation, record.reasons, record.placed_published, record.queued_notices) == (
        (),
        (),
        False,
        0,
    )
    assert [r.job_id for r in await store.active()] == ["j1"]


async def test_store_keeps_a_preemption_across_attempts(store: JobStore) -> None:
    from trainyard_placement.adapters.store import (
        interrupt_sent_fields,
        interrupting_fields,
        next_attempt_fields,
        preempted_fields,
    )

    await store.add_queued("v", attempt=1, arrival_seq=1, spec=spec())
    await store.mark_placed("v", [TASK])
    placed_at = (await store.get("v")).placed_at  # type: ignore[union-attr]
    assert placed_at is not None and placed_at.tzinfo is not None
    fields = {
        **interrupting_fields("preempted", "preempted by job h (priority 9)"),
        **preempted_fields("h", 1),
    }
    assert await store.change("v", states=("placed",), attempt=1, fields=fields)
    assert not await store.change("v", states=("placed",), attempt=1, fields=fields)  # once
    record = await store.get("v")
    assert record is not None
    assert (record.state, record.preempted_by, record.preemptions, record.interrupt_sent) == (
        "interrupting",
        "h",
        1,
        False,
    )
    await store.change("v", states=("interrupting",), attempt=1, fields=interrupt_sent_fields())
    assert (await store.get("v")).interrupt_sent  # type: ignore[union-attr]
    # The next attempt keeps the count: the no-cycles rule reads it.
    await store.change("v", states=("interrupting",), attempt=1, fields=next_attempt_fields(2))
    record = await store.get("v")
    assert record is not None and (record.state, record.attempt, record.preemptions) == (
        "queued",
        2,
        1,
    )


# --------------------------------------------------------------------------- the service

CLUSTER = {
    "nodes": [
        {
            "name": "n1",
            "host_ip": "10.0.0.1",
            "cpu": 8,
            "memory_mb": 16000,
            "gpus": 2,
            "gpu_type": "V100",
            "port_range": [31000, 31999],
        }
    ]
}


ADMIN_TOKEN = "placement-test-admin-token"


class Service:
    """``python -m trainyard_placement`` as a child process that can crash and restart."""

    def __init__(self, env: dict[str, str], log: Path, port: int) -> None:
        self.env, self.log_path, self.url = env, log, f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainyard_placement"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                # Healthy is not enough: after a SIGKILL the new process leads only once
                # the old one's lease has run out (docs/placement.md).
                if self.leading():
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "placement did not become the leader"
            time.sleep(0.1)

    def leading(self) -> bool:
        answer = httpx.get(
            f"{self.url}/v1/placement/leader",
            timeout=1,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        return answer.status_code == 200 and bool(answer.json()["leading"])

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int | None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None

    def queue(self) -> list[dict[str, object]]:
        answer = httpx.get(
            f"{self.url}/v1/placement/queue",
            timeout=5,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        return answer.json()["jobs"]

    def queue_status_without_token(self) -> int:
        return httpx.get(f"{self.url}/v1/placement/queue", timeout=5).status_code


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[str]:
    # Its own server: the shared one holds other tests' JobAccepted events, which this
    # service's durable consumer would replay into its queue (strict FIFO behind them).
    server = NatsServer(tmp_path / "nats").start()
    yield server.url
    server.stop()


@pytest.fixture
def service(private_nats: str, mongo_url: str, db_prefix: str, tmp_path: Path) -> Iterator[Service]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("YARD_TOKEN", "NATS_URL", "MONGO_URL")}
    env.update(
        YARD_NATS_URL=private_nats, YARD_MONGO_URL=mongo_url, YARD_DB_PREFIX=db_prefix,
        YARD_PLACEMENT_PORT=str(port), YARD_CLUSTER=str(cluster),
        YARD_DATA_DIR=str(tmp_path / "data"), YARD_LOG_LEVEL="WARNING", YARD_TOKEN=ADMIN_TOKEN,
        YARD_PLACEMENT_LEASE_TTL_S="1",
    )  # fmt: skip
    svc = Service(env, tmp_path / "placement.log", port)
    svc.start()
    try:
        yield svc
    finally:
        code = svc.stop()
    assert code == 0, svc.log_path.read_text()


@pytest.fixture
async def bus(private_nats: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(private_nats, name="test-placement")
    yield bus
    await bus.close()


async def last_event(bus: Bus, job_id: str, suffix: str, timeout: float = 20.0) -> Event:
    deadline = time.monotonic() + timeout
    while True:
        found = await stream_events(bus, f"yard.job.{suffix}", job_id)
        if found:
            return found[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no {suffix} event for {job_id} within {timeout}s")
        await asyncio.sleep(0.1)


async def test_service_places_queues_survives_a_crash_and_releases(
    service: Service, bus: Bus
) -> None:
    a, b = "a" + uuid.uuid4().hex[:8], "b" + uuid.uuid4().hex[:8]
    await bus.publish(JobAccepted(job_id=a, spec=spec()))
    placed = await last_event(bus, a, "placed")
    assert isinstance(placed, JobPlaced)
    assert placed.event_id == derived_id(a, 1, "placed")
    (task,) = placed.tasks
    assert (task.node, task.host_ip, task.gpu_indices) == ("n1", "10.0.0.1", [0, 1])
    assert all(31000 <= p <= 31999 for p in task.ports[0].ports)

    await bus.publish(JobAccepted(job_id=b, spec=spec()))
    queued = await last_event(bus, b, "queued")
    assert isinstance(queued, JobQueued) and queued.position == 1
    assert "no node has 2 free GPUs of type V100" in queued.reasons[0]
    assert [(j["job_id"], j["position"]) for j in service.queue()] == [(b, 1)]

    # A crash loses nothing and counts nothing twice: a still holds both GPUs.
    service.kill()
    service.start()
    (row,) = service.queue()
    assert service.queue_status_without_token() == 401
    assert row["job_id"] == b and "2 free GPUs" in row["reasons"][0]  # type: ignore[index]

    await bus.publish(JobFinished(job_id=a, state=JobState.SUCCEEDED, reason="done"))
    placed_b = await last_event(bus, b, "placed")
    assert isinstance(placed_b, JobPlaced) and placed_b.tasks[0].gpu_indices == [0, 1]
    deadline = time.monotonic() + 10
    while service.queue() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert service.queue() == []


async def test_service_places_a_retry_after_its_backoff_even_across_a_crash(
    service: Service, bus: Bus
) -> None:
    from datetime import timedelta

    from trainyard_common.events import FailureClass, JobRetrying, utcnow

    a = "r" + uuid.uuid4().hex[:8]
    await bus.publish(JobAccepted(job_id=a, spec=spec()))
    assert (await last_event(bus, a, "placed")).attempt == 1  # type: ignore[attr-defined]
    not_before = utcnow() + timedelta(seconds=10)
    await bus.publish(
        JobRetrying(
            event_id=derived_id(a, 1, "retry"),
            job_id=a,
            attempt=2,
            previous_attempt=1,
            reason="attempt 1 failed",
            failure_class=FailureClass.PLATFORM,
            not_before=not_before,
        )
    )
    queued = await last_event(bus, a, "queued")
    assert isinstance(queued, JobQueued) and queued.attempt == 2
    until = not_before.isoformat(timespec="milliseconds")
    assert queued.reasons == [f"retrying attempt 2 after backoff until {until}"]
    # Killed while the retry waits: the restarted service still waits, then places it.
    service.kill()
    service.start()
    assert [row["job_id"] for row in service.queue()] == [a]
    deadline = time.monotonic() + 20
    placed = await last_event(bus, a, "placed")
    while placed.attempt == 1 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        await asyncio.sleep(0.1)
        placed = await last_event(bus, a, "placed")
    assert isinstance(placed, JobPlaced) and placed.attempt == 2
    assert placed.event_id == derived_id(a, 2, "placed")
    assert utcnow() >= not_before
