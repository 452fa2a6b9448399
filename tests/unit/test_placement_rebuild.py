"""A restart rebuilds exactly the state the live process had.

Hypothesis drives placement's handlers (memory stores, a collecting publisher that can
fail) through random interleavings of accept, finish, retry, stop, node changes, a bus
that fails a publish (the message comes back later, as JetStream redelivers a nak'd
one) and restarts. After every step: memory matches the store, no node holds more than
it has, and no attempt is announced placed twice. At every restart: the state rebuilt
from the stores (``handlers.load`` + ``NodeAdmin.restore``) has the same allocations,
queue and nodes as the live one — no capacity counted twice or lost.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trainyard_common.bus import Delivery
from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.events import (
    Event,
    FailureClass,
    InterruptCause,
    JobAccepted,
    JobFinished,
    JobInterrupted,
    JobPlaced,
    JobRetrying,
    JobState,
    StopJob,
    derived_id,
    utcnow,
)
from trainyard_common.jobspec import JobSpec, PortSpec, Resources, RoleSpec
from trainyard_placement.adapters.nodes import MemoryNodeStore
from trainyard_placement.adapters.store import MemoryJobStore
from trainyard_placement.domain.gpu_share import MILLI
from trainyard_placement.handlers import Deps, handle, load, start
from trainyard_placement.node_admin import NodeAdmin, NodeError

CLUSTER = ClusterSpec(nodes=[
    NodeSpec(name=f"n{i}", cpu=4, memory_mb=8192, gpus=2, gpu_type="V100",
             port_range=(30000, 30003))
    for i in (1, 2)
])  # fmt: skip
EXTRA = NodeSpec(
    name="n3", cpu=2, memory_mb=4096, gpus=1, gpu_type="V100", port_range=(30000, 30003)
)
NODES = {n.name: n for n in [*CLUSTER.nodes, EXTRA]}
JOBS = [f"j{i}" for i in range(6)]


def job_spec(gpu: float, replicas: int) -> JobSpec:
    return JobSpec(name="train", roles=[RoleSpec(
        name="w", replicas=replicas, command="true", ports=[PortSpec(label="http")],
        resources=Resources(cpu=1, memory_mb=1024, gpu=gpu, gpu_type="V100"),
    )])  # fmt: skip


class BusDown(ConnectionError):
    pass


@dataclass
class Publisher:
    events: list[Event] = field(default_factory=list)
    fail_next: bool = False

    async def publish(self, event: Event) -> int:
        if self.fail_next:
            self.fail_next = False
            raise BusDown("bus unavailable")
        self.events.append(event)
        return len(self.events)


class Rebuild(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.jobs = MemoryJobStore()
        self.nodes = MemoryNodeStore()
        self.pub = Publisher()
        self.seq = 0
        self.redeliver: list[tuple[Event, int]] = []
        self.deps, self.admin = self.run(self.rebuild())
        self.run(start(self.deps))

    def teardown(self) -> None:
        self.loop.close()

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    async def rebuild(self) -> tuple[Deps, NodeAdmin]:
        """What a new process knows before its first cycle."""
        deps = await load(self.jobs, self.pub, CLUSTER)
        admin = NodeAdmin(deps, self.nodes)
        await admin.restore()
        return deps, admin

    def send(self, event: Event, seq: int | None = None) -> None:
        if seq is None:
            self.seq += 1
            seq = self.seq
        delivery = Delivery(stream_seq=seq, num_delivered=1, subject="x")
        try:
            self.run(handle(event, delivery, self.deps))
        except BusDown:
            self.redeliver.append((event, seq))  # nak'd: JetStream delivers it again

    def doc(self, job_id: str) -> dict | None:
        return self.jobs.docs.get(job_id)

    # --- what the outside world does --------------------------------------------------

    @rule(
        job_id=st.sampled_from(JOBS),
        gpu=st.sampled_from([0, 0.5, 1, 2]),
        replicas=st.integers(1, 2),
    )
    def accept(self, job_id: str, gpu: float, replicas: int) -> None:
        # A job accepted twice is a redelivery: the same event again.
        self.send(
            JobAccepted(event_id=f"acc-{job_id}", job_id=job_id, spec=job_spec(gpu, replicas))
        )

    @rule(
        job_id=st.sampled_from(JOBS), state=st.sampled_from([JobState.SUCCEEDED, JobState.FAILED])
    )
    def finish(self, job_id: str, state: JobState) -> None:
        doc = self.doc(job_id)
        if doc is None or doc["state"] not in ("placed", "interrupting"):
            return
        self.send(
            JobFinished(
                event_id=derived_id(job_id, doc["attempt"], "finished"),
                job_id=job_id,
                attempt=doc["attempt"],
                state=state,
                reason="end",
            )
        )

    @rule(job_id=st.sampled_from(JOBS), due=st.booleans())
    def retry(self, job_id: str, due: bool) -> None:
        doc = self.doc(job_id)
        if doc is None or doc["state"] != "placed":
            return
        attempt = doc["attempt"]
        not_before = utcnow() + (timedelta(seconds=-1) if due else timedelta(hours=1))
        self.send(
            JobRetrying(
                event_id=derived_id(job_id, attempt, "retry"),
                job_id=job_id,
                attempt=attempt + 1,
                previous_attempt=attempt,
                reason="failed",
                failure_class=FailureClass.PLATFORM,
                not_before=not_before,
            )
        )

    @rule(job_id=st.sampled_from(JOBS))
    def stop(self, job_id: str) -> None:
        self.send(StopJob(job_id=job_id, requested_by="alice"))

    @rule(job_id=st.sampled_from(JOBS))
    def launcher_interrupted(self, job_id: str) -> None:
        doc = self.doc(job_id)
        if doc is None or doc["state"] != "interrupting":
            return
        attempt = doc["attempt"]
        self.send(
            JobInterrupted(
                event_id=derived_id(job_id, attempt, "interrupted"),
                job_id=job_id,
                attempt=attempt,
                cause=InterruptCause(doc["interrupt"]["cause"]),
                reason="ended",
            )
        )

    @rule(name=st.sampled_from(["n1", "n2", "n3"]), drain=st.booleans())
    def drain(self, name: str, drain: bool) -> None:
        try:
            self.run(self.admin.drain(name) if drain else self.admin.undrain(name))
        except NodeError:
            pass  # not a node (now)
        except BusDown:
            pass  # stored and applied; the JobQueued it was announcing comes again later

    @rule(name=st.sampled_from(["n1", "n2", "n3"]))
    def add_node(self, name: str) -> None:
        # n3 is new; n1 and n2 come back (as added nodes) after a removal.
        try:
            self.run(self.admin.add(NODES[name]))
        except (NodeError, BusDown):
            pass

    @rule(name=st.sampled_from(["n1", "n2", "n3"]))
    def remove_node(self, name: str) -> None:
        try:
            self.run(self.admin.remove(name))
        except (NodeError, BusDown):
            pass

    @rule()
    def bus_fails_next_publish(self) -> None:
        self.pub.fail_next = True

    @precondition(lambda self: bool(self.redeliver))
    @rule()
    def redelivery(self) -> None:
        event, seq = self.redeliver.pop(0)
        self.send(event, seq)

    @rule()
    def restart(self) -> None:
        self.pub.fail_next = False  # a new process, a working bus
        live = self.deps
        deps, admin = self.run(self.rebuild())
        rebuilt = deps.state
        assert rebuilt.placed == live.state.placed
        assert set(rebuilt.queued) | set(deps.deferred) == set(live.state.queued) | set(
            live.deferred
        )
        assert [n.name for n in rebuilt.cluster.nodes] == [n.name for n in live.state.cluster.nodes]
        assert rebuilt.drained == live.state.drained
        # (The live process also remembers attempts of jobs that ended; only those that
        # hold capacity matter.)
        assert {j: deps.attempts[j] for j in rebuilt.placed} == {
            j: live.attempts[j] for j in live.state.placed
        }
        self.deps, self.admin = deps, admin
        self.run(start(deps))

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def memory_matches_the_store(self) -> None:
        held = {
            job_id: doc
            for job_id, doc in self.jobs.docs.items()
            if doc["state"] in ("placed", "interrupting")
        }
        assert set(self.deps.state.placed) == set(held)
        for job_id, allocation in self.deps.state.placed.items():
            stored = [t["node"] for t in held[job_id]["allocation"]]
            assert [t.node for t in allocation.tasks] == stored

    @invariant()
    def no_node_holds_more_than_it_has(self) -> None:
        cpu: Counter[str] = Counter()
        gpu: dict[tuple[str, int], int] = defaultdict(int)
        ports: Counter[tuple[str, int]] = Counter()
        for allocation in self.deps.state.placed.values():
            for task in allocation.tasks:
                resources = allocation.spec.role(task.role).resources
                cpu[task.node] += resources.cpu
                for index in task.gpu_indices:
                    gpu[task.node, index] += task.gpu_milli or MILLI
                for group in task.ports:
                    for port in group.ports:
                        ports[task.node, port] += 1
        assert all(cpu[name] <= NODES[name].cpu for name in cpu), cpu
        assert all(milli <= MILLI for milli in gpu.values()), gpu
        assert all(count == 1 for count in ports.values()), ports

    @invariant()
    def no_attempt_is_announced_placed_twice(self) -> None:
        placed = [e for e in self.pub.events if isinstance(e, JobPlaced)]
        counts = Counter((e.job_id, e.attempt) for e in placed)
        assert all(n == 1 for n in counts.values()), counts


Rebuild.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRebuild = Rebuild.TestCase
