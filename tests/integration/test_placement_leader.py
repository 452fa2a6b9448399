"""One placement leader at a time, on real NATS JetStream and FerretDB.

The lease adapter against a real key-value bucket (with a hand-moved clock, so expiry
is exact and nothing sleeps), then two ``python -m trainyard_placement`` processes: the
leader places, is SIGKILLed, the follower takes over, rebuilds the state from the store
and places the next job on what is really free; no attempt is ever placed twice.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from trainyard_common.bus import Bus, KvBucket, RevisionMismatch, key_value
from trainyard_common.events import JobAccepted, JobPlaced, JobQueued, decode
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_common.subjects import STREAM
from trainyard_placement.adapters.lease import Lease, LeaseLost
from trainyard_stack.components import NatsServer, free_port

ADMIN_TOKEN = "placement-leader-test-admin-token"
TTL_S = 1.5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def kv(nats_url: str) -> AsyncIterator[KvBucket]:
    bus = await Bus.connect(nats_url, name="lease-test")
    # A bucket of this test's own: the shared server outlives the test.
    bucket = "leases_" + uuid.uuid4().hex[:8]
    yield await key_value(bus, bucket)
    await bus.js.delete_key_value(bucket)
    await bus.close()


async def test_lease_is_created_renewed_lost_and_taken_over_after_a_whole_ttl(
    kv: KvBucket,
) -> None:
    clock = Clock()
    a = Lease(kv, "placement", "host:1", ttl_s=5, clock=clock)
    b = Lease(kv, "placement", "host:2", ttl_s=5, clock=clock)
    assert await a.try_acquire() and a.held
    assert await b.holder() == "host:1"
    assert not await b.try_acquire()  # first sight of a's revision
    clock.now += 3
    await a.renew()
    assert not await b.try_acquire()  # a renewed: b starts counting again from now
    clock.now += 4
    # a counts on 80 % of the ttl from the renewal it sent: it has stopped leading a
    # whole second before b may take over.
    assert not a.held
    assert not await b.try_acquire()
    clock.now += 1
    assert await b.try_acquire() and b.held
    assert await a.holder() == "host:2"
    with pytest.raises(LeaseLost):
        await a.renew()
    assert not a.held
    # A clean stop deletes the key: the next look takes it at once.
    await b.release()
    assert not b.held and await b.holder() is None
    assert await a.try_acquire()


async def test_a_renewal_whose_reply_was_lost_is_still_ours(kv: KvBucket) -> None:
    clock = Clock()
    a = Lease(kv, "placement", "host:1", ttl_s=5, clock=clock)
    assert await a.try_acquire()
    entry = await kv.get("placement")
    assert entry is not None
    # The write of a renewal landed but a never heard back: its revision is stale.
    await kv.update("placement", entry.value, entry.revision)
    await a.renew()
    assert a.held and a.revision == (await kv.get("placement")).revision  # type: ignore[union-attr]
    # Someone writing over it for real is another matter.
    current = await kv.get("placement")
    assert current is not None
    await kv.update("placement", json.dumps({"replica": "intruder"}).encode(), current.revision)
    with pytest.raises(LeaseLost):
        await a.renew()
    with pytest.raises(RevisionMismatch):
        await kv.create("placement", b"{}")


async def test_of_two_racing_replicas_exactly_one_wins(kv: KvBucket) -> None:
    leases = [Lease(kv, "race", f"host:{i}", ttl_s=5) for i in range(4)]
    won = await asyncio.gather(*(lease.try_acquire() for lease in leases))
    assert sorted(won) == [False, False, False, True]
    winner = leases[won.index(True)]
    assert await winner.holder() == winner.replica


async def test_keep_renews_until_stopped_and_ends_when_overwritten(kv: KvBucket) -> None:
    a = Lease(kv, "keep", "host:1", ttl_s=0.6)
    b = Lease(kv, "keep", "host:2", ttl_s=0.6)
    assert await a.try_acquire()
    stop = asyncio.Event()
    keeper = asyncio.create_task(a.keep(stop))
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # three ttls: b never gets it while a renews
        assert not await b.try_acquire()
        assert a.held
        await asyncio.sleep(0.1)
    stop.set()
    await keeper
    assert a.held  # stopping keep is not giving up; release is
    await a.release()
    assert await b.try_acquire()

    # Someone else writing over b's lease ends b's keep with LeaseLost.
    keeper = asyncio.create_task(b.keep(asyncio.Event()))
    await overwrite(kv, "keep", "host:3")
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(keeper, timeout=5)
    assert not b.held


async def overwrite(kv: KvBucket, key: str, replica: str) -> None:
    """Write another holder over the lease, whatever revision its keeper renews to."""
    while True:
        entry = await kv.get(key)
        assert entry is not None
        try:
            await kv.update(key, json.dumps({"replica": replica}).encode(), entry.revision)
            return
        except RevisionMismatch:
            continue


# --------------------------------------------------------------------------- replicas

CLUSTER = {"nodes": [{"name": "n1", "cpu": 8, "memory_mb": 16000, "gpus": 2,
                      "gpu_type": "V100", "port_range": [31000, 31999]}]}


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, roles=[RoleSpec(
        name="worker", command="true", resources=Resources(cpu=1, gpu=1, gpu_type="V100"))])


class Replica:
    """One ``python -m trainyard_placement`` process."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.env = {**env, "YARD_PLACEMENT_PORT": str(self.port)}
        self.log_path = log
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=5,
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

    def start(self) -> Replica:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "trainyard_placement"],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if self.http.get("/healthz").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "placement did not become healthy"
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


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[str]:
    # Its own server: the durable "placement" consumer replays the whole stream, and the
    # shared one holds other tests' JobAccepted events.
    server = NatsServer(tmp_path / "nats").start()
    yield server.url
    server.stop()


@pytest.fixture
def replica_env(private_nats: str, mongo_url: str, db_prefix: str, tmp_path: Path) -> dict[str, str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    env = {k: v for k, v in os.environ.items() if k not in ("YARD_TOKEN", "NATS_URL", "MONGO_URL")}
    env.update(
        YARD_NATS_URL=private_nats, YARD_MONGO_URL=mongo_url, YARD_DB_PREFIX=db_prefix,
        YARD_CLUSTER=str(cluster), YARD_DATA_DIR=str(tmp_path / "data"),
        YARD_LOG_LEVEL="INFO", YARD_TOKEN=ADMIN_TOKEN, YARD_PLACEMENT_LEASE_TTL_S=str(TTL_S),
    )  # fmt: skip
    return env


@pytest.fixture
async def bus(private_nats: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(private_nats, name="test-placement-leader")
    yield bus
    await bus.close()


async def placed_events(bus: Bus) -> list[JobPlaced]:
    """Every JobPlaced in the stream, duplicates included (read by sequence)."""
    info = await bus.js.stream_info(STREAM)
    events = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await bus.js.get_msg(STREAM, seq)
        if msg.subject.endswith(".placed"):
            event = decode(msg.data or b"")
            assert isinstance(event, JobPlaced)
            events.append(event)
    return events


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
        try:
            msg = await bus.js.get_last_msg(STREAM, f"yard.job.{job_id}.queued")
            event = decode(msg.data or b"")
            assert isinstance(event, JobQueued)
            return event
        except Exception:  # noqa: BLE001 - not there yet
            assert time.monotonic() < deadline, f"{job_id} was not queued within {timeout}s"
            await asyncio.sleep(0.1)


async def test_the_follower_takes_over_from_a_killed_leader_and_nothing_is_placed_twice(
    replica_env: dict[str, str], bus: Bus, tmp_path: Path
) -> None:
    first = Replica(replica_env, tmp_path / "first.log").start()
    second: Replica | None = None
    third: Replica | None = None
    try:
        await first.wait_leading()
        second = Replica(replica_env, tmp_path / "second.log").start()
        lease = second.lease()
        assert lease["leading"] is False and lease["leader"] == first.lease()["replica"]
        # A follower does not answer for the leader.
        answer = second.http.get("/v1/placement/queue")
        assert answer.status_code == 503 and "not the leader" in answer.json()["detail"]
        answer = second.http.post("/v1/placement/nodes/n1/drain")
        assert answer.status_code == 503 and lease["leader"] in answer.json()["detail"]

        a, b, c = (f"{x}{uuid.uuid4().hex[:8]}" for x in "abc")
        await bus.publish(JobAccepted(job_id=a, spec=spec("a")))
        placed_a = await wait_placed(bus, a)
        await asyncio.sleep(1.0)  # a few renewals: the follower must stay a follower
        assert second.lease()["leading"] is False

        first.kill()
        await second.wait_leading(timeout=10 * TTL_S)
        assert second.lease()["leader"] == second.lease()["replica"]
        # The new leader rebuilt a's allocation from the store: b gets the other GPU, and
        # c, for which nothing is left, waits.
        await bus.publish(JobAccepted(job_id=b, spec=spec("b")))
        placed_b = await wait_placed(bus, b)
        assert placed_b.tasks[0].gpu_indices != placed_a.tasks[0].gpu_indices
        await bus.publish(JobAccepted(job_id=c, spec=spec("c")))
        queued_c = await wait_queued(bus, c)
        assert "largest free: n1 0 GPUs" in queued_c.reasons[0], queued_c.reasons

        # A clean stop gives the lease up: a new replica leads without waiting a ttl.
        assert second.stop() == 0, second.log()
        third = Replica(replica_env, tmp_path / "third.log").start()
        await third.wait_leading()
        queue = third.http.get("/v1/placement/queue").json()["jobs"]
        assert [row["job_id"] for row in queue] == [c]

        counts = collections.Counter((e.job_id, e.attempt) for e in await placed_events(bus))
        assert counts == {(a, 1): 1, (b, 1): 1}, counts
    finally:
        for replica in (first, second, third):
            if replica is not None:
                replica.kill()


async def test_a_leader_whose_lease_is_taken_follows_and_leads_again_once_it_is_free(
    replica_env: dict[str, str], bus: Bus, tmp_path: Path
) -> None:
    leader = Replica(replica_env, tmp_path / "leader.log").start()
    try:
        await leader.wait_leading()
        await overwrite(await key_value(bus, "yard_leases"), "placement", "elsewhere:1")
        # It stops leading (and so stops placing) but stays up as a follower...
        deadline = time.monotonic() + 10 * TTL_S
        while leader.lease()["leading"]:
            assert time.monotonic() < deadline, leader.log()
            await asyncio.sleep(0.1)
        assert leader.proc is not None and leader.proc.poll() is None, leader.log()
        assert "lost the lease; following again" in leader.log()
        assert leader.http.get("/v1/placement/queue").status_code == 503
        # ...and takes the lease over again once the foreign holder stops renewing it.
        await leader.wait_leading(timeout=10 * TTL_S)
        assert leader.lease()["leader"] == leader.lease()["replica"]
    finally:
        leader.kill()
