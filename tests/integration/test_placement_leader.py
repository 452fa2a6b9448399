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
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from trainyard_common.bus import ACK_WAIT_S, Bus, KvBucket, RevisionMismatch, key_value
from trainyard_common.events import JobAccepted
from trainyard_placement.adapters.lease import Lease, LeaseLost
from trainyard_stack.components import NatsServer

from .placement_replicas import (
    TTL_S,
    Replica,
    placed_events,
    spec,
    stream_events,
    wait_placed,
    wait_queued,
)


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
        assert answer.headers["Trainyard-Follower"] == "true"  # the gateway asks the next
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


@pytest.mark.parametrize("outage_s", [0.3, 3 * TTL_S], ids=["brief", "past-the-lease"])
async def test_leadership_survives_a_nats_restart_under_load_and_is_reported_truly(
    replica_env: dict[str, str],
    private_nats_server: NatsServer,
    tmp_path: Path,
    outage_s: float,
) -> None:
    first = Replica(replica_env, tmp_path / "first.log").start()
    second = Replica(replica_env, tmp_path / "second.log").start()
    try:
        await first.wait_leading()
        bus = await Bus.connect(private_nats_server.url, name="restart-test")
        jobs = [f"r{i}{uuid.uuid4().hex[:8]}" for i in range(12)]
        for job in jobs[:4]:
            await bus.publish(JobAccepted(job_id=job, spec=spec(job)))
        await bus.close()
        # NATS goes away with work in flight, and comes back on the same store.
        private_nats_server.stop()
        await asyncio.sleep(outage_s)
        private_nats_server.start()
        bus = await Bus.connect(private_nats_server.url, name="restart-test")
        try:
            for job in jobs[4:]:
                await bus.publish(JobAccepted(job_id=job, spec=spec(job)))

            def truth() -> tuple[str, ...] | None:
                views = [r.lease() for r in (first, second)]
                leading = [v for v in views if v["leading"]]
                if len(leading) != 1:
                    return None
                # What each replica says agrees with the lease and with the other.
                if any(v["leader"] != leading[0]["replica"] for v in views):
                    return None
                return leading[0]["replica"]

            deadline = time.monotonic() + 20 * TTL_S
            leader = None
            while (leader := truth()) is None:
                assert time.monotonic() < deadline, [r.lease() for r in (first, second)]
                await asyncio.sleep(0.2)
            # The leader answers its API (no 503), the follower refuses it.
            holder = first if first.lease()["replica"] == leader else second
            other = second if holder is first else first
            assert holder.http.get("/v1/placement/nodes").status_code == 200
            assert other.http.get("/v1/placement/nodes").status_code == 503
            # Every job accepted before, during and after gets its answer, once. A message
            # the old leader had fetched but not handled when the bus went away comes back
            # only after JetStream's ack wait: the answer may take that long (seen under
            # the full suite's load).
            for job in jobs:
                deadline = time.monotonic() + ACK_WAIT_S + 20
                while True:
                    placed = {e.job_id for e in await placed_events(bus)}
                    queued = await _queued_ids(bus)
                    if job in placed or job in queued:
                        break
                    assert time.monotonic() < deadline, f"{job} neither placed nor queued"
                    await asyncio.sleep(0.2)
            counts = collections.Counter((e.job_id, e.attempt) for e in await placed_events(bus))
            assert all(n == 1 for n in counts.values()), counts
        finally:
            await bus.close()
    finally:
        first.kill()
        second.kill()


async def _queued_ids(bus: Bus) -> set[str]:
    return {event.job_id for event in await stream_events(bus, "yard.job.queued")}
