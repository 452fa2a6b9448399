"""The bus adapter against a real nats-server: dedup, explicit acks, redelivery of
transient failures, termination of permanent ones, and trace context across hops."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from trainyard_common.bus import DEAD_LETTER_MARGIN, Atomic, Bus, DeadLetters, Delivery, when_stored
from trainyard_common.docstore import SqliteClient
from trainyard_common.errors import BusUnavailable, PermanentError, TransientError
from trainyard_common.events import Event, JobSubmitted, StopJob, decode, encode
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_common.storage import Client, Collection, batch_writes, batching, insert_once
from trainyard_common.subjects import ALL_COMMANDS, ALL_EVENTS, STREAM, commands_of, events_of
from trainyard_common.telemetry import setup_telemetry, tracer
from trainyard_stack.components import NatsServer


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(
        job_id=job_id, spec=JobSpec(name="j", roles=[RoleSpec(name="r", command="true")])
    )


def metric(name: str, **labels: str) -> float:
    """A sample of this process's Prometheus registry (0 when absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def bus(private_nats: str):
    # Its own server: subjects do not name the job, so a consumer here gets every
    # message of the stream, and the shared one holds other tests'.
    setup_telemetry("test")
    bus = await Bus.connect(private_nats, name="test")
    yield bus
    await bus.close()


async def consume_until(
    bus: Bus,
    durable: str,
    subjects: list[str],
    handler,
    done: asyncio.Event,
    timeout: float = 15.0,
    atomic: Atomic | None = None,
    before_batch: Callable[[list[Any]], Awaitable[None]] | None = None,
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(
        bus.consume(durable, subjects, handler, stop=stop, atomic=atomic, before_batch=before_batch)
    )
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        stop.set()
        await task


async def test_same_event_id_is_stored_once(bus: Bus) -> None:
    event = submitted(uuid.uuid4().hex)
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert first == second  # JetStream answered the duplicate with the original's sequence


async def test_publish_all_keeps_order(bus: Bus) -> None:
    job = uuid.uuid4().hex
    events = [StopJob(job_id=job, requested_by=f"u{i}") for i in range(20)]
    seqs = await bus.publish_all(events)
    assert seqs == sorted(seqs) and len(set(seqs)) == 20


async def test_transient_error_is_redelivered_then_acked(bus: Bus) -> None:
    job = uuid.uuid4().hex
    await bus.publish(submitted(job))
    deliveries: list[int] = []
    done = asyncio.Event()

    async def flaky(event: Event, delivery: Delivery) -> None:
        if event.job_id != job:
            return
        deliveries.append(delivery.num_delivered)
        if delivery.num_delivered < 3:
            raise ConnectionError("store hiccup")
        done.set()

    await consume_until(bus, f"flaky-{job[:8]}", [ALL_EVENTS], flaky, done)
    assert deliveries == [1, 2, 3]
    # Acked after success: a new subscription on the same durable gets nothing more.
    again = asyncio.Event()
    seen: list[int] = []

    async def record(event: Event, delivery: Delivery) -> None:
        seen.append(delivery.stream_seq)

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(f"flaky-{job[:8]}", [ALL_EVENTS], record, stop=stop))
    await asyncio.sleep(1.5)
    stop.set()
    await task
    assert seen == [] and not again.is_set()


async def test_permanent_error_is_not_redelivered(bus: Bus) -> None:
    job = uuid.uuid4().hex
    await bus.publish(submitted(job))
    calls: list[int] = []
    first = asyncio.Event()

    async def broken(event: Event, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        first.set()
        raise PermanentError("this job can never be handled")

    await consume_until(bus, f"perm-{job[:8]}", [ALL_EVENTS], broken, first)
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(f"perm-{job[:8]}", [ALL_EVENTS], broken, stop=stop))
    await asyncio.sleep(1.5)
    stop.set()
    await task
    assert calls == [1]


async def test_filter_by_event_and_command_subjects(bus: Bus) -> None:
    job = uuid.uuid4().hex
    await bus.publish_all([submitted(job), StopJob(job_id=job, requested_by="bob")])
    got: list[str] = []
    done = asyncio.Event()

    async def collect(event: Event, delivery: Delivery) -> None:
        if event.job_id == job:
            got.append(type(event).__name__)
            done.set()

    await consume_until(bus, f"cmd-{job[:8]}", commands_of("stop"), collect, done)
    assert got == ["StopJob"]
    assert events_of("submitted") == ["yard.job.submitted"]


async def test_a_message_stored_with_the_job_id_in_its_subject_is_still_delivered(
    bus: Bus,
) -> None:
    """Before 2026-11-28 a subject named its job (``yard.job.<job_id>.<event>``): what
    the stream took then and no consumer handled yet reaches the durable that filtered
    that form, now filtering today's."""
    job = uuid.uuid4().hex
    durable = f"earlier-{job[:8]}"
    await bus.ensure_consumer(durable, ["yard.job.*.submitted"])  # the earlier filter
    old = submitted(job)
    await bus.publish_raw(f"yard.job.{job}.submitted", encode(old), {"Nats-Msg-Id": job})
    new = submitted(uuid.uuid4().hex)
    await bus.publish(new)
    got: list[str] = []
    done = asyncio.Event()

    async def note(event: Event, delivery: Delivery) -> None:
        got.append(event.job_id)
        if len(got) == 2:
            done.set()

    await consume_until(bus, durable, events_of("submitted"), note, done)
    assert got == [job, new.job_id]


async def test_trace_context_follows_the_event_to_the_next_hop(bus: Bus) -> None:
    job = uuid.uuid4().hex
    with tracer("test").start_as_current_span("submit") as span:
        root_trace = format(span.get_span_context().trace_id, "032x")
        await bus.publish(submitted(job))
    hops: list[str | None] = []
    done = asyncio.Event()

    async def relay(event: Event, delivery: Delivery) -> None:
        if event.job_id != job:
            return
        hops.append(delivery.trace_id)
        if isinstance(event, JobSubmitted):
            await bus.publish(
                StopJob(job_id=job, requested_by="relay")
            )  # published inside the consume span
        else:
            done.set()

    await consume_until(bus, f"trace-{job[:8]}", [ALL_EVENTS, ALL_COMMANDS], relay, done)
    assert hops == [root_trace, root_trace]


async def test_a_message_that_keeps_failing_ends_in_the_dead_letters_and_can_be_replayed(
    bus: Bus,
) -> None:
    job = uuid.uuid4().hex
    durable = f"dead-{job[:8]}"
    await bus.publish(submitted(job))
    bus.max_deliver = 3
    calls: list[int] = []
    healed = False
    done = asyncio.Event()

    async def buggy(event: Event, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        if not healed:
            if delivery.num_delivered == 3:
                done.set()
            raise RuntimeError("a handler bug")
        done.set()

    await consume_until(bus, durable, [ALL_EVENTS], buggy, done)
    await asyncio.sleep(0.3)  # the third delivery's dead letter is kept after the raise
    assert calls == [1, 2, 3]
    # And /metrics says so: two naks, two redeliveries, one dead letter, no ack yet.
    assert metric("trainyard_bus_messages_total", durable=durable, outcome="retried") == 2
    assert metric("trainyard_bus_redeliveries_total", durable=durable) == 2
    assert metric("trainyard_bus_dead_letters_total", durable=durable) == 1
    assert metric("trainyard_bus_messages_total", durable=durable, outcome="dead") == 1
    assert metric("trainyard_bus_messages_total", durable=durable, outcome="acked") == 0
    assert metric("trainyard_bus_handle_seconds_count", durable=durable) == 3
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert len(letters) == 1
    letter = letters[0]
    assert letter.subject == "yard.job.submitted" and letter.deliveries == 3
    assert "a handler bug" in letter.error and decode(letter.data).job_id == job

    # Fixed, and replayed by an admin: it comes back to the same durable, once.
    healed, done = True, asyncio.Event()
    assert await DeadLetters(bus).replay(letter.seq) is not None
    await consume_until(bus, durable, [ALL_EVENTS], buggy, done)
    assert calls[-1] == 1 and len(calls) == 4
    assert metric("trainyard_bus_messages_total", durable=durable, outcome="acked") == 1
    # Nothing left to deliver: the consumer's lag reads 0 again.
    assert metric("trainyard_bus_consumer_pending_messages", durable=durable) == 0
    assert await DeadLetters(bus).get(letter.seq) is None
    assert await DeadLetters(bus).replay(letter.seq) is None


async def test_a_permanent_error_and_an_undecodable_message_are_dead_letters_at_once(
    bus: Bus,
) -> None:
    job = uuid.uuid4().hex
    durable = f"perm-dead-{job[:8]}"
    await bus.publish(submitted(job))
    await bus.publish_raw("yard.job.task", b"{not json", {"Nats-Msg-Id": job})
    seen = asyncio.Event()

    async def refuse(event: Event, delivery: Delivery) -> None:
        seen.set()
        raise PermanentError("never")

    await consume_until(bus, durable, [ALL_EVENTS], refuse, seen)
    await asyncio.sleep(0.5)
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert sorted(d.error.split(":")[0] for d in letters) == ["permanent error", "undecodable"]
    assert all(d.deliveries == 1 for d in letters)


async def test_an_event_under_another_kinds_subject_is_a_dead_letter(bus: Bus) -> None:
    """Publishing is granted by subject: one allowed ``yard.job.task`` (the launcher)
    cannot pass a JobPlaced off under it to a consumer of every subject (status)."""
    job = uuid.uuid4().hex
    durable = f"kind-{job[:8]}"
    forged = submitted(job)
    await bus.publish_raw("yard.job.task", encode(forged), {"Nats-Msg-Id": f"{job}-forged"})
    await bus.publish(StopJob(job_id=job, requested_by="u"))
    got: list[str] = []
    done = asyncio.Event()

    async def note(event: Event, delivery: Delivery) -> None:
        got.append(type(event).__name__)
        done.set()

    await consume_until(bus, durable, [ALL_EVENTS, ALL_COMMANDS], note, done)
    assert got == ["StopJob"]
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert [(d.subject, d.error) for d in letters] == [
        ("yard.job.task", "undecodable: a JobSubmitted cannot come on yard.job.task")
    ]


async def test_json_that_is_no_event_object_is_a_dead_letter_and_the_consumer_goes_on(
    bus: Bus,
) -> None:
    """A list, a null schema_version, an unhashable type: each raised past the decoder's
    refusals once (AttributeError, TypeError), which stopped the consumer on every
    delivery of it. Now each is a dead letter and the next message is handled."""
    job = uuid.uuid4().hex
    durable = f"not-obj-{job[:8]}"
    bad = [b"[1]", b'{"schema_version": null}', b'{"type": [1], "schema_version": 1}']
    for i, data in enumerate(bad):
        await bus.publish_raw("yard.job.task", data, {"Nats-Msg-Id": f"{job}-{i}"})
    await bus.publish(submitted(job))
    seen = asyncio.Event()

    async def note(event: Event, delivery: Delivery) -> None:
        seen.set()

    await consume_until(bus, durable, [ALL_EVENTS], note, seen)
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert [d.error.split(":")[0] for d in letters] == ["undecodable"] * 3


async def test_a_consumers_lag_is_what_the_stream_still_holds_for_it(bus: Bus) -> None:
    job = uuid.uuid4().hex
    durable = f"lag-{job[:8]}"
    for _ in range(5):
        await bus.publish(submitted(uuid.uuid4().hex).model_copy(update={"job_id": job}))
    seen: list[float] = []
    done = asyncio.Event()

    async def note(event: Event, delivery: Delivery) -> None:
        seen.append(metric("trainyard_bus_consumer_pending_messages", durable=durable))
        if len(seen) == 5:
            done.set()

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(durable, [ALL_EVENTS], note, stop=stop, batch=2))
    try:
        await asyncio.wait_for(done.wait(), 15)
    finally:
        stop.set()
        await task
    # Read while handling each batch: the lag the batch before it left (2 fetched of 5).
    assert seen == [0, 0, 3, 3, 1]


async def test_a_batch_decodes_each_message_once_for_its_read_ahead_and_handler(
    bus: Bus, doc_client: Client, db_prefix: str
) -> None:
    """The read ahead and the handlers share one decoding of each message; one the
    decoder refuses is left out of the read ahead and goes to the dead letters."""
    job = uuid.uuid4().hex
    durable = f"once-{job[:8]}"
    await bus.publish_all([StopJob(job_id=job, requested_by=f"u{i}") for i in range(2)])
    await bus.publish_raw("yard.cmd.stop", b"{not json", {"Nats-Msg-Id": f"{job}-bad"})
    seqs = await bus.publish_all([StopJob(job_id=job, requested_by="u2")])
    decoded: list[bytes] = []

    def counting(data: bytes, subject: str, headers: dict[str, str]) -> Any:
        decoded.append(data)
        return decode(data)

    handled: list[Any] = []
    ahead: list[Any] = []
    done = asyncio.Event()

    async def handle(event: StopJob, _delivery: Delivery) -> None:
        handled.append(event)
        if len(handled) == 3:
            done.set()

    async def read_ahead(events: list[Any]) -> None:
        ahead.extend(events)

    stop = asyncio.Event()
    task = asyncio.create_task(
        bus.consume(
            durable,
            [ALL_COMMANDS],
            handle,
            stop=stop,
            decoder=counting,
            atomic=batch_writes(batching(doc_client[f"{db_prefix}_once"])),
            before_batch=read_ahead,
        )
    )
    try:
        await asyncio.wait_for(done.wait(), 15)
        assert await bus.consumed(durable, seqs[-1])
    finally:
        stop.set()
        await task
    assert len(decoded) == 4  # once each, the refused one too
    assert [e.requested_by for e in ahead] == ["u0", "u1", "u2"]
    assert [e is a for e, a in zip(handled, ahead, strict=True)] == [True] * 3
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert [d.error.split(":")[0] for d in letters] == ["undecodable"]


async def test_a_batch_is_stored_at_once_acked_after_it_and_a_failure_is_undone_alone(
    bus: Bus, doc_client: Client, db_prefix: str
) -> None:
    """On each store: one SQLite transaction, or a unit of work on MongoDB."""
    job = uuid.uuid4().hex
    durable = f"batch-{job[:8]}"
    seqs = await bus.publish_all([StopJob(job_id=job, requested_by=f"u{i}") for i in range(6)])
    database = batching(doc_client[f"{db_prefix}_batch"])
    mine = database["c"]
    # Another connection (SQLite) or a plain collection (MongoDB): sees what is stored only.
    theirs: Collection
    if isinstance(doc_client, SqliteClient):
        theirs = SqliteClient(doc_client.directory)[f"{db_prefix}_batch"]["c"]
    else:
        theirs = doc_client[f"{db_prefix}_batch"]["c"]
    committed: list[int] = []  # what the other connection saw as each message was handled
    fresh: dict[str, list[bool]] = defaultdict(list)  # insert_once per delivery
    acked_during_batch: list[int] = []
    done = asyncio.Event()

    async def store(event: StopJob, delivery: Delivery) -> None:
        who = event.requested_by
        fresh[who].append(await insert_once(mine, {"_id": who}))
        committed.append(await theirs.count_documents({}))
        if who == "u5":  # the batch's last: none of it acked yet
            info = await bus.js.consumer_info(STREAM, durable)
            acked_during_batch.append(info.ack_floor.stream_seq or 0)
        if who == "u2" and delivery.num_delivered == 1:
            raise ConnectionError("transient, after its write")
        if who == "u4":
            raise PermanentError("never, after its write")
        if who == "u2":
            done.set()

    atomic = batch_writes(database)
    before: list[list[str]] = []  # each batch's events, as given before its handlers

    async def read_ahead(events: list[Any]) -> None:
        before.append([e.requested_by for e in events])
        committed.append(await theirs.count_documents({}))
        raise ConnectionError("a read ahead that failed: the handlers read for themselves")

    await consume_until(
        bus, durable, [ALL_COMMANDS], store, done, atomic=atomic, before_batch=read_ahead
    )
    assert before[0] == [f"u{i}" for i in range(6)]
    # The first fetch held all six: nothing committed while any of them was handled.
    assert committed[:7] == [0] * 7
    assert len(acked_during_batch) == 1 and acked_during_batch[0] < seqs[0]
    # u2's first write was undone with its failure (its redelivery wrote it anew);
    # u4's too, and it went to the dead letters; the others were stored once.
    assert fresh["u2"] == [True, True]
    assert sorted([d["_id"] async for d in theirs.find({})]) == ["u0", "u1", "u2", "u3", "u5"]
    assert await bus.consumed(durable, seqs[-1])
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert [d.error.split(":")[0] for d in letters] == ["permanent error"]


class CommitFails:
    """A store whose every commit fails (a write it refuses, a full disk): the adapters'
    own failures are tested with them (test_docstore, test_mongo_batch); here, what the
    bus makes of it."""

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        yield
        raise sqlite3.OperationalError("database or disk is full")

    def savepoint(self) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


async def test_a_batch_that_cannot_be_stored_is_handled_one_message_at_a_time(
    bus: Bus,
) -> None:
    # Naking the whole batch again and again would end, at its last delivery, with all
    # its messages gone and none in the dead letters. Alone, the good ones are stored
    # and acked, and the one that keeps failing goes to the dead letters by itself.
    bus.max_deliver = 2
    job = uuid.uuid4().hex
    seqs = await bus.publish_all([StopJob(job_id=job, requested_by=f"u{i}") for i in range(3)])
    deliveries: dict[str, list[int]] = defaultdict(list)
    done = asyncio.Event()
    durable = f"commit-{job[:8]}"

    stored: list[str] = []  # when_stored hooks that ran

    async def note(event: StopJob, delivery: Delivery) -> None:
        deliveries[event.requested_by].append(delivery.num_delivered)
        when_stored(lambda: stored.append(event.requested_by))
        if event.requested_by == "u1":
            if delivery.num_delivered == 2:
                done.set()
            raise ConnectionError("a poison message")

    await consume_until(bus, durable, [ALL_COMMANDS], note, done, atomic=CommitFails())
    # Each batch ran whole twice (its commit failed both times), then each message alone.
    assert deliveries["u0"] == [1, 1, 1] and deliveries["u2"] == [1, 1, 1]
    assert deliveries["u1"] == [1, 1, 1, 2, 2, 2]
    # Only what was stored (alone) ran its hook, once; the dead letter none.
    assert stored == ["u0", "u2"]
    assert metric("trainyard_bus_batches_split_total", durable=durable) == 2
    assert metric("trainyard_bus_messages_total", durable=durable, outcome="acked") == 2
    assert await bus.consumed(durable, seqs[-1])
    letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
    assert [d.original_seq for d in letters] == [seqs[1]]
    assert "failed on all 2 deliveries" in letters[0].error


class CommitFailsOnce(CommitFails):
    """The first commit fails (another replica's document met by an insert), the next
    ones do not."""

    def __init__(self) -> None:
        self.failed = False

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        yield
        if not self.failed:
            self.failed = True
            raise sqlite3.IntegrityError("a document another replica made first")


async def test_a_batch_that_fails_once_is_stored_whole_on_its_second_try(bus: Bus) -> None:
    job = uuid.uuid4().hex
    seqs = await bus.publish_all([StopJob(job_id=job, requested_by=f"u{i}") for i in range(3)])
    deliveries: dict[str, list[int]] = defaultdict(list)
    done = asyncio.Event()
    durable = f"once-{job[:8]}"

    async def note(event: StopJob, delivery: Delivery) -> None:
        deliveries[event.requested_by].append(delivery.num_delivered)
        if sum(map(len, deliveries.values())) == 6:
            done.set()

    atomic = CommitFailsOnce()
    await consume_until(bus, durable, [ALL_COMMANDS], note, done, atomic=atomic)
    assert dict(deliveries) == {"u0": [1, 1], "u1": [1, 1], "u2": [1, 1]}
    assert metric("trainyard_bus_batches_split_total", durable=durable) == 0
    assert await bus.consumed(durable, seqs[-1])
    assert metric("trainyard_bus_messages_total", durable=durable, outcome="acked") == 3


class CountsCommits(CommitFailsOnce):
    """The first commit fails; counts the ones that store."""

    def __init__(self) -> None:
        super().__init__()
        self.stored = 0

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with super().transaction():
            yield
        self.stored += 1


@pytest.mark.parametrize("batched", [True, False])
async def test_what_a_handler_leaves_for_after_the_store_runs_once_it_is_stored(
    bus: Bus, batched: bool
) -> None:
    # Status counts its metrics so: an event counted before a batch that then failed
    # to commit was counted again on its redelivery.
    ran: list[tuple[str, int]] = []
    when_stored(lambda: ran.append(("outside a handler", 0)))
    assert ran == [("outside a handler", 0)]
    ran.clear()

    async def coroutine() -> None: ...

    with pytest.raises(TypeError):
        when_stored(coroutine)  # type: ignore[arg-type]
    late: list[str] = []  # from a task a handler started, after the handler returned
    tasks: list[asyncio.Task[None]] = []

    async def asks_late(who: str) -> None:
        await asyncio.sleep(0.05)
        when_stored(lambda: late.append(who))

    job = uuid.uuid4().hex
    seqs = await bus.publish_all([StopJob(job_id=job, requested_by=f"u{i}") for i in range(3)])
    atomic = CountsCommits() if batched else None
    handled: list[tuple[str, int]] = []
    done = asyncio.Event()
    durable = f"stored-{batched}-{job[:8]}"

    async def note(event: StopJob, delivery: Delivery) -> None:
        who = event.requested_by
        handled.append((who, delivery.num_delivered))
        when_stored(lambda: ran.append((who, atomic.stored if atomic else len(handled))))
        if who == "u0" and delivery.num_delivered == 1 and not tasks:
            tasks.append(asyncio.create_task(asks_late(who)))
        if who == "u1" and delivery.num_delivered == 1:
            raise ConnectionError("transient, after asking for its hook")
        if who == "u1":
            done.set()

    await consume_until(bus, durable, [ALL_COMMANDS], note, done, atomic=atomic)
    assert await bus.consumed(durable, seqs[-1])
    await tasks[0]
    assert late == ["u0"]  # not lost in a list nobody reads: at once
    if batched:
        # The first try's commit failed: nothing ran. The second stored u0 and u2
        # (u1 failed again, undone alone); u1's redelivery, the next commit.
        assert handled == [("u0", 1), ("u1", 1), ("u2", 1)] * 2 + [("u1", 2)]
        assert ran == [("u0", 1), ("u2", 1), ("u1", 2)]
    else:
        assert handled == [("u0", 1), ("u1", 1), ("u2", 1), ("u1", 2)]
        assert ran == [("u0", 1), ("u2", 3), ("u1", 4)]


async def test_a_publish_the_bus_did_not_store_is_bus_unavailable(tmp_path: Path) -> None:
    """The server down (killed, restarting): a publish fails as the project's transient
    BusUnavailable, which an HTTP route answers 503 and a consumer redelivers, not as
    the client's own errors (which were a 500 at the door)."""
    server = NatsServer(tmp_path / "nats").start()
    bus = await Bus.connect(server.url, name="test-down")
    try:
        assert await bus.publish(submitted("up")) > 0
        quick = Bus(bus.nc, bus.nc.jetstream(timeout=0.5))
        server.stop()
        with pytest.raises(BusUnavailable) as raised:
            await quick.publish(submitted("down"))
        assert isinstance(raised.value, TransientError)
    finally:
        await bus.nc.close()


async def test_a_message_never_answered_still_ends_in_the_dead_letters(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its handler ran past the ack wait (or its process ended) on every delivery the
    # bus allows: JetStream must still deliver it once more, to be kept, not run.
    monkeypatch.setattr("trainyard_common.bus.ACK_WAIT_S", 0.5)
    bus.max_deliver = 2
    job = uuid.uuid4().hex
    durable = f"silent-{job[:8]}"
    [seq] = await bus.publish_all([submitted(job)])
    bus.max_deliver = 50  # a consumer made by an earlier version is brought up to date
    await bus.ensure_consumer(durable, [ALL_EVENTS])
    bus.max_deliver = 2
    await bus.ensure_consumer(durable, [ALL_EVENTS])
    info = await bus.js.consumer_info(STREAM, durable)
    assert info.config.max_deliver == 2 + DEAD_LETTER_MARGIN
    silent = await bus.js.pull_subscribe_bind(durable, STREAM)
    for delivery in (1, 2):  # fetched, never acked: the ack wait passes
        [msg] = await silent.fetch(1, timeout=5)
        assert msg.metadata.num_delivered == delivery
    await silent.unsubscribe()
    await asyncio.sleep(0.6)

    calls: list[int] = []

    async def handler(event: Event, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(durable, [ALL_EVENTS], handler, stop=stop))
    try:
        for _ in range(100):
            letters = [d for d in await DeadLetters(bus).list(1000) if d.durable == durable]
            if letters:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await task
    assert calls == []  # not run a third time
    assert [(d.original_seq, d.deliveries) for d in letters] == [(seq, 3)]
    assert "not settled on any of its first 2 deliveries" in letters[0].error
    assert await bus.consumed(durable, seq)


async def test_a_message_waiting_behind_slow_ones_is_not_delivered_again(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three messages fetched together, each handled slower than the ack wait allows the
    # last to wait: without telling JetStream they are being worked on, it delivered the
    # later ones again meanwhile.
    monkeypatch.setattr("trainyard_common.bus.ACK_WAIT_S", 0.6)
    job = uuid.uuid4().hex
    durable = f"slow-{job[:8]}"
    await bus.publish_all([StopJob(job_id=job, requested_by=f"u{i}") for i in range(3)])
    deliveries: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def slow(event: StopJob, delivery: Delivery) -> None:
        deliveries.append((event.requested_by, delivery.num_delivered))
        await asyncio.sleep(0.45)
        if len(deliveries) >= 3:
            done.set()

    await consume_until(bus, durable, [ALL_COMMANDS], slow, done)
    assert deliveries == [("u0", 1), ("u1", 1), ("u2", 1)]


async def test_a_cluster_given_as_a_list_of_urls_is_connected_to(tmp_path: Path) -> None:
    # NATS's tools take a cluster as "nats://a:4222,nats://b:4222" (the compose file's
    # YARD_NATS_URL): nats-py refused it as one URL and every service failed at start.
    server = NatsServer(tmp_path / "nats").start()
    try:
        listed = f"{server.url}, nats://127.0.0.1:1"  # the second one down: one is enough
        assert await stored_by(listed, "test-list")
    finally:
        server.stop()


async def stored_by(url: str, name: str) -> bool:
    """Whether a bus connected at ``url`` has a publish stored."""
    bus = await Bus.connect(url, name=name)
    try:
        return await bus.publish(submitted(name)) > 0
    finally:
        await bus.nc.close()


async def test_the_streams_are_the_platform_identitys_to_make(tmp_path: Path) -> None:
    # A service's identity may only look at the streams: with none made (a NATS set up
    # as the Helm chart asks), it waited out the server's silence and stopped with a
    # bare timeout; the chart had nothing to make them.
    import os
    import subprocess
    import sys

    from trainyard_stack.platform import PLATFORM_IDENTITY, bus_users

    users = bus_users(tmp_path, [])
    server = NatsServer(tmp_path / "nats", users=users).start()
    try:
        with pytest.raises(RuntimeError, match="trainyard_common.streams"):
            await Bus.connect(server.url_for("intake"), name="intake")
        env = {**os.environ, "YARD_NATS_URL": server.url_for(PLATFORM_IDENTITY)}
        made = subprocess.run([sys.executable, "-m", "trainyard_common.streams"], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert await stored_by(server.url_for("intake"), "intake")
    finally:
        server.stop()


async def test_a_consumer_fetches_again_while_the_server_is_away(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fetch met JetStream's 503 (or a reconnecting client) while NATS restarted: it
    # ended the consumer, and the service with it (a placement leader, under load).
    from nats.errors import ConnectionReconnectingError
    from nats.js.errors import ServiceUnavailableError

    import trainyard_common.bus as bus_module

    monkeypatch.setattr(bus_module, "FETCH_AGAIN_S", 0.01, raising=False)
    bind = bus.js.pull_subscribe_bind
    away = [ServiceUnavailableError(), ConnectionReconnectingError()]

    async def flaky_bind(*args: Any, **kwargs: Any) -> Any:
        sub = await bind(*args, **kwargs)
        fetch = sub.fetch

        async def fetch_once_back(*a: Any, **kw: Any) -> Any:
            if away:
                raise away.pop(0)
            return await fetch(*a, **kw)

        sub.fetch = fetch_once_back
        return sub

    monkeypatch.setattr(bus.js, "pull_subscribe_bind", flaky_bind)
    job = uuid.uuid4().hex
    await bus.publish(submitted(job))
    done = asyncio.Event()

    async def collect(event: Event, delivery: Delivery) -> None:
        if event.job_id == job:
            done.set()

    await consume_until(bus, f"away-{job[:8]}", events_of("submitted"), collect, done)
    assert done.is_set() and away == []
