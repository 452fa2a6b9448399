"""The bus adapter: NATS JetStream, the only module that imports ``nats``.

Publishing: every event goes to ``subject_for(event)`` with ``Nats-Msg-Id`` set to its
``event_id`` (JetStream drops a duplicate inside the stream's duplicate window) and the
current W3C trace context in ``traceparent``. ``publish`` returns only after JetStream
stored the message.

Consuming: durable pull consumers with an explicit ack policy. A handler's effect is
stored before the ack; anything but :class:`PermanentError` naks the message with a
growing delay so JetStream redelivers it (a consumer whose writes all go to its store
may store each fetched batch at once: ``Atomic``, acks after it is stored). Handlers
must be idempotent. A message that cannot be processed (undecodable, a permanent
error, or still failing on its last delivery) is never dropped silently: it goes to the
dead-letter stream with its error, is counted and logged, then terminated; an admin can
replay it (status's admin API), and it comes back to the same durable on
``yard.replay.<durable>.…``.

Identity: a URL with a user (``nats://intake:…@host``) connects as that service, whose
replies arrive on its own inbox prefix (bus_access.py).
We use nats-py directly instead of FastStream: it is the cheapest hop (DESIGN §9), and
the ack policy is visible here rather than a framework default (docs/design/0001).

Key-value: :func:`key_value` opens (or creates) a JetStream KV bucket as a
:class:`KvBucket`, whose writes are all compare-and-set on a key's revision (placement's
leader lease is built on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from opentelemetry import trace
from pydantic import ValidationError

from .bus_access import inbox_prefix
from .errors import BusUnavailable, PermanentError, ReplayIncomplete
from .events import Event, decode, encode
from .metrics import (
    BUS_BATCHES_SPLIT,
    BUS_DEAD_LETTERS,
    BUS_HANDLE,
    BUS_MESSAGES,
    BUS_PENDING,
    BUS_REDELIVERIES,
)
from .subjects import (
    DEAD_LETTER_PREFIX,
    DEAD_LETTER_STREAM,
    REPLAY_PREFIX,
    STREAM,
    STREAM_SUBJECTS,
    dead_letter_subject,
    replay_subject,
    replays_of,
    subject_for,
    subject_template,
    with_earlier_forms,
)
from .telemetry import current_job, extract_context, inject_headers, trace_id_of, tracer

log = logging.getLogger("trainyard.bus")

DUPLICATE_WINDOW_S = 600.0
ACK_WAIT_S = 30.0
MAX_DELIVER = 50
# Deliveries the server makes beyond the bus's own limit. The bus decides when a message
# goes to the dead letters; at the server's limit JetStream just stops delivering it
# (an advisory nobody reads), so it must never be the first to give up: a message whose
# handler never answered (it ran past the ack wait, its process ended) reaches the
# bus's limit and still comes once more to be kept, and a dead letter that could not be
# stored is tried again this many times.
DEAD_LETTER_MARGIN = 10


@dataclass(frozen=True)
class Delivery:
    """What the bus knows about one delivered message, besides the event itself."""

    stream_seq: int
    num_delivered: int
    subject: str
    trace_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


D = TypeVar("D")
Handler = Callable[[Any, Delivery], Awaitable[None]]
# One shape for every service's event handlers: (event, its delivery, the service's
# dependencies); each service's table maps event types to them.
EventHandler = Callable[[Any, Delivery, D], Awaitable[None]]
# What a consumer makes of a message's bytes (an event, by default).
Decoder = Callable[[bytes, str, dict[str, str]], Any]


# What settles a handled message with the server (ack, nak or dead letter), once its
# effect is stored; an ack runs the handler's when_stored hooks first.
Settle = Callable[[], Awaitable[None]]


class _Hooks(list[Callable[[], None]]):
    """What the handler of the message being handled left for after its effects are
    stored; closed when the handler returns (a task it started and that asks later is
    no longer part of that message)."""

    closed = False


_when_stored: contextvars.ContextVar[_Hooks | None] = contextvars.ContextVar(
    "trainyard_bus_when_stored", default=None
)


def when_stored(hook: Callable[[], None]) -> None:
    """Run ``hook`` once the effects of the message being handled are stored: as its
    handler returns, or, in a batch (``Atomic``), after the batch's commit; never if the
    handler raises or the batch is not stored (the message's next delivery runs its
    handler again, which asks again). For what must count a message once, metrics: a
    crash between the commit and the hook skips it, and the hook's own errors are
    logged, not raised. Outside a handler run by a ``Bus`` (or from a task it started,
    once it has returned), at once. A hook is a plain function, not a coroutine."""
    if inspect.iscoroutinefunction(hook):
        raise TypeError("when_stored takes a plain function, not a coroutine function")
    hooks = _when_stored.get()
    if hooks is None or hooks.closed:
        hook()
    else:
        hooks.append(hook)


class Atomic(Protocol):
    """A store's batches (``storage.batch_writes``: SQLite's transactions, a unit of
    work on MongoDB), for a consumer whose handlers write only to it: a fetched batch's
    effects are one ``transaction()``, each message's a ``savepoint()`` inside it (undone
    alone if its handler fails)."""

    def transaction(self) -> AbstractAsyncContextManager[None]: ...

    def savepoint(self) -> AbstractAsyncContextManager[None]: ...


def _original_subject(subject: str, durable: str) -> str:
    """A message's subject, or the one it had before an admin replayed it to ``durable``."""
    return subject.removeprefix(f"{REPLAY_PREFIX}.{durable}.")


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A message its decoder refused, and why (it goes to the dead letters)."""

    error: str


def _decode(
    msg: Msg, decoder: Decoder, subject: str | None = None, headers: dict[str, str] | None = None
) -> Any:
    """``msg``'s event, or :class:`Undecodable` (``subject`` and ``headers``: as the
    caller has them already)."""
    if subject is None:
        subject = _original_subject(msg.subject, msg.metadata.consumer or "unknown")
    try:
        return decoder(msg.data, subject, dict(msg.headers or {}) if headers is None else headers)
    except (ValidationError, ValueError) as exc:
        return Undecodable(str(exc))


def decode_event(data: bytes, subject: str, _headers: dict[str, str]) -> Event:
    """The event a message carries, which must be of its subject's kind: an identity
    allowed to publish one kind cannot pass another off under it (status reads every
    subject, and the bus's grants are by subject)."""
    event = decode(data)
    if subject_template(subject) != subject_for(event):
        raise ValueError(f"a {type(event).__name__} cannot come on {subject}")
    return event


# A publish's failures that say the server is not there now, not that the message is
# wrong: no server, a connection closed, reconnecting or stale, no stream answering
# (JetStream restarting), the ack's timeout, JetStream's own 503.
_GONE = (
    nats.errors.TimeoutError, TimeoutError, nats.errors.NoServersError,
    nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError, nats.errors.NoRespondersError,
    nats.errors.UnexpectedEOF, nats.errors.OutboundBufferLimitError,
    NoStreamResponseError, ServiceUnavailableError,
)  # fmt: skip


# What a fetch meets while the server is away for a moment (not closed for good), and
# how long the consumer waits before it fetches again.
_AWAY = tuple(e for e in _GONE if e is not nats.errors.ConnectionClosedError)
FETCH_AGAIN_S = 0.5
# How long a replay waits for its next message, while its consumer says some are left,
# before it gives up as incomplete (Bus.replay_stream).
REPLAY_STALL_S = 30.0


@contextlib.contextmanager
def _unavailable(subject: str) -> Iterator[None]:
    """A publish's failures of the bus (_GONE) as the project's BusUnavailable."""
    try:
        yield
    except _GONE as exc:
        raise BusUnavailable(f"the bus did not store the message on {subject}: {exc!r}") from exc


def nak_delay(num_delivered: int) -> float:
    """Redelivery backoff: 0.2 s, 0.4 s, ... capped at 10 s."""
    return min(0.2 * 2 ** max(num_delivered - 1, 0), 10.0)


class _Working:
    """While a fetched batch is handled, tells JetStream every third of the ack wait
    that its messages not settled yet are being worked on (``+WPI``): one waiting its
    turn behind slow handlers (a launcher's stops, each up to its kill grace) would
    otherwise be delivered again meanwhile, handled twice and a delivery nearer the dead
    letters. ``settled``: how many of the batch, from its start, are settled."""

    # Beats at most this long: a handler hung past it lets its message go back to
    # JetStream (delivered again, and at the bus's limit kept in the dead letters).
    MAX_S = 10 * ACK_WAIT_S

    def __init__(self, msgs: list[Msg]) -> None:
        self.msgs = msgs
        self.settled = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Working:
        if self.msgs:
            self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _beat(self) -> None:
        for _ in range(int(self.MAX_S / (ACK_WAIT_S / 3))):
            await asyncio.sleep(ACK_WAIT_S / 3)
            for msg in self.msgs[self.settled :]:
                # Settled meanwhile (acked, or nak'd to come back after its delay, which
                # a beat would reset to the whole ack wait): left alone. nats-py keeps
                # that on the message itself.
                if getattr(msg, "_ackd", False):
                    continue
                try:
                    await msg.in_progress()
                except Exception:  # noqa: BLE001 - a lost beat: at worst a redelivery
                    log.debug("in progress of %s not sent", msg.subject, exc_info=True)


class Bus:
    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js
        self._tracer = tracer("trainyard.bus")
        # Deliveries before a failing message goes to the dead letters.
        self.max_deliver = MAX_DELIVER

    @classmethod
    async def connect(cls, url: str, name: str = "trainyard") -> Bus:
        """``url``: one server, or a NATS cluster's as a comma-separated list (the
        form NATS's own tools take; nats-py refused it as one URL)."""
        servers = [part.strip() for part in url.split(",") if part.strip()]
        user = urlsplit(servers[0] if servers else url).username
        options: dict[str, Any] = {}
        if user:
            # Replies to this identity arrive where only it may listen.
            options["inbox_prefix"] = inbox_prefix(unquote(user)).encode()
        nc = await nats.connect(
            servers or url,
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            **options,
        )
        bus = cls(nc, nc.jetstream(timeout=10))
        await bus.ensure_streams()
        return bus

    async def ensure_streams(self) -> None:
        """The event stream and the dead letters' exist (made here by an identity that
        may: the platform's own at start, or any client of an open server)."""
        await self._ensure(
            StreamConfig(
                name=STREAM,
                subjects=STREAM_SUBJECTS,
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
            )
        )
        await self._ensure(
            StreamConfig(
                name=DEAD_LETTER_STREAM,
                subjects=[f"{DEAD_LETTER_PREFIX}.>"],
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
            )
        )

    async def _ensure(self, config: StreamConfig) -> None:
        assert config.name is not None
        try:
            info = await self.js.stream_info(config.name)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
                return
            except BadRequestError:
                info = await self.js.stream_info(config.name)  # made meanwhile
            except NatsTimeoutError as exc:
                # The server answers an identity that may not make it with nothing.
                raise RuntimeError(
                    f"the bus's stream {config.name} does not exist and making it timed "
                    "out: the server did not answer, or this identity may not make streams "
                    "(the platform's does: python -m trainyard_common.streams, the Helm "
                    "chart's hook)"
                ) from exc
        if sorted(info.config.subjects or []) != sorted(config.subjects or []):
            await self.js.update_stream(config)

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()

    def _headers(self, event: Event) -> dict[str, str]:
        return inject_headers(
            {"Nats-Msg-Id": event.event_id, "Trainyard-Type": type(event).__name__}
        )

    def _send_span(self, subject: str, message_id: str, job_id: str | None) -> trace.Span:
        """A producer span by the messaging conventions: "publish <subject template>"."""
        attributes: dict[str, str | int] = {
            "messaging.system": "nats",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": subject,
            "messaging.destination.template": subject_template(subject),
            "messaging.message.id": message_id,
        }
        if job_id:
            attributes["trainyard.job_id"] = job_id
        return self._tracer.start_span(
            f"publish {subject_template(subject)}",
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
        )

    async def publish(self, event: Event) -> int:
        """Publish and wait for JetStream's ack; returns the stream sequence
        (BusUnavailable when the bus did not store it)."""
        subject = subject_for(event)
        span = self._send_span(subject, event.event_id, event.job_id)
        with trace.use_span(span, end_on_exit=True), _unavailable(subject):
            ack = await self.js.publish(subject, encode(event), headers=self._headers(event))
            return ack.seq

    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> int:
        """Publish bytes as they are (a submission, a replayed dead letter); ``headers``
        should carry a ``Nats-Msg-Id`` so a retried publish is stored once."""
        span = self._send_span(subject, headers.get("Nats-Msg-Id", ""), None)
        with trace.use_span(span, end_on_exit=True), _unavailable(subject):
            ack = await self.js.publish(subject, data, headers=inject_headers(dict(headers)))
            return ack.seq

    async def publish_all(self, events: Iterable[Event]) -> list[int]:
        """Publish several events without waiting for each ack in turn (they keep their
        order in the stream: one connection, sent in order), then wait for all acks."""
        futures = []
        spans = []
        for e in events:
            subject = subject_for(e)
            span = self._send_span(subject, e.event_id, e.job_id)
            spans.append(span)
            with trace.use_span(span):
                futures.append(
                    await self.js.publish_async(subject, encode(e), headers=self._headers(e))
                )
        try:
            acks = await asyncio.gather(*futures)
        finally:
            for span in spans:
                span.end()
        return [ack.seq for ack in acks]

    async def ensure_consumer(self, durable: str, subjects: list[str]) -> None:
        config = ConsumerConfig(
            durable_name=durable,
            name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ACK_WAIT_S,
            max_deliver=self.max_deliver + DEAD_LETTER_MARGIN,
            max_ack_pending=1000,
        )
        if len(subjects) == 1:
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = subjects
        await self.js.add_consumer(STREAM, config=config)

    async def consume(
        self,
        durable: str,
        subjects: list[str],
        handler: Handler,
        *,
        stop: asyncio.Event,
        batch: int = 64,
        ready: asyncio.Event | None = None,
        decoder: Decoder = decode_event,
        after_batch: Callable[[], Awaitable[None]] | None = None,
        atomic: Atomic | None = None,
        before_batch: Callable[[list[Any]], Awaitable[None]] | None = None,
    ) -> None:
        """Run ``handler`` for every message of the durable consumer until ``stop``
        (its subjects and the dead letters an admin sends back to it); ``after_batch``
        after the messages of each fetch (work several messages share, done once).
        With ``atomic``, each fetch's effects are stored in one transaction and its
        messages settled after the commit (``_handle_batch``); ``before_batch``, with
        ``atomic`` only, gets each batch's decodable messages first, inside it (to read
        at once what their handlers will read)."""
        await self.ensure_consumer(durable, [*with_earlier_forms(subjects), replays_of(durable)])
        sub = await self.js.pull_subscribe_bind(durable=durable, stream=STREAM)
        if ready is not None:
            ready.set()
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(batch, timeout=1.0)
                except (TimeoutError, NatsTimeoutError):
                    BUS_PENDING.labels(durable).set(0)
                    continue
                except _AWAY as exc:
                    # The server restarting (JetStream's 503, reconnecting): fetched
                    # again once it is back. Raised, it ended the consumer, and with it
                    # the service (a placement leader under a NATS restart).
                    log.warning("fetching for %s: %r; again in a moment", durable, exc)
                    await asyncio.sleep(FETCH_AGAIN_S)
                    continue
                async with _Working(msgs) as working:
                    if atomic is None:
                        for msg in msgs:
                            await (await self._handle(msg, handler, decoder))()
                            working.settled += 1
                    elif msgs:
                        await self._handle_batch(msgs, handler, decoder, atomic, before_batch)
                if msgs:
                    BUS_PENDING.labels(durable).set(msgs[-1].metadata.num_pending)
                if after_batch is not None and msgs:
                    try:
                        await after_batch()
                    except Exception:  # noqa: BLE001 - its owner retries it; the messages are done
                        log.exception("after a batch of %s", durable)
        finally:
            await sub.unsubscribe()

    async def replay_stream(
        self,
        durable: str,
        subjects: list[str],
        handler: Handler,
        until_seq: int,
        batch: int = 256,
        stall_s: float | None = None,
    ) -> int:
        """Every message of ``subjects`` from the stream's start to ``until_seq``
        through ``handler`` (a fresh consumer ``durable``, removed afterwards), each
        acked once handled; returns how many. A handler's error ends the replay.

        It ends only where every such message was read: one at or past ``until_seq``,
        or none left for the consumer (its pending count 0: the rest of the stream is
        of other subjects). A fetch that comes back empty is not the end (a slow server
        answered after its timeout); no progress for ``stall_s`` (REPLAY_STALL_S) raises
        ReplayIncomplete, whose caller must not take what was read for the whole."""
        stall_s = REPLAY_STALL_S if stall_s is None else stall_s
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(STREAM, durable)
        await self.ensure_consumer(durable, subjects)
        sub = await self.js.pull_subscribe_bind(durable=durable, stream=STREAM)
        handled = 0
        reached = 0  # the stream sequence of the last message read
        progress = time.monotonic()
        try:
            while True:
                try:
                    msgs = await sub.fetch(batch, timeout=1.0)
                except (TimeoutError, NatsTimeoutError):
                    msgs = []
                if not msgs:
                    info = await self.js.consumer_info(STREAM, durable)
                    if not info.num_pending and not info.num_ack_pending:
                        # Every message of its subjects was delivered and handled (each
                        # is acked once handled): one delivered after a fetch's timeout
                        # waits in the subscription, unacked, for the next fetch.
                        return handled
                    if time.monotonic() - progress > stall_s:
                        raise ReplayIncomplete(
                            f"the replay read the stream only up to sequence {reached} of "
                            f"{until_seq}: no message for {stall_s:.0f} s while "
                            f"{info.num_pending} were left"
                        )
                    continue
                progress = time.monotonic()
                for msg in msgs:
                    meta = msg.metadata
                    if meta.sequence.stream > until_seq:
                        return handled
                    reached = meta.sequence.stream
                    headers = dict(msg.headers or {})
                    subject = msg.subject
                    try:
                        event = decode_event(msg.data, subject, headers)
                    except (ValidationError, ValueError):
                        await msg.ack()  # never an event (it went to the dead letters)
                        continue
                    # Not inside a message of another consumer: its hooks run at once.
                    hooks_token = _when_stored.set(None)
                    try:
                        await handler(
                            event,
                            Delivery(
                                stream_seq=meta.sequence.stream,
                                num_delivered=meta.num_delivered,
                                subject=subject,
                                trace_id=trace_id_of(headers),
                                headers=headers,
                            ),
                        )
                    finally:
                        _when_stored.reset(hooks_token)
                    await msg.ack()
                    handled += 1
                    if meta.sequence.stream >= until_seq:
                        return handled
        finally:
            await sub.unsubscribe()
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(STREAM, durable)

    async def consumed(self, durable: str, seq: int, timeout_s: float = 2.0) -> bool:
        """Wait until the durable consumer ``durable`` has acknowledged every message up
        to stream sequence ``seq`` (a consumer acks once its effect is stored); False
        when it has not within ``timeout_s`` (it is behind or down)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                info = await self.js.consumer_info(STREAM, durable)
                if info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq:
                    return True
            except (nats.errors.Error, TimeoutError):
                pass
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def last_seq(self) -> int:
        """The sequence of the newest message in the stream."""
        return int((await self.js.stream_info(STREAM)).state.last_seq)

    async def _handle_batch(
        self,
        msgs: list[Msg],
        handler: Handler,
        decoder: Decoder,
        atomic: Atomic,
        before: Callable[[list[Any]], Awaitable[None]] | None = None,
    ) -> None:
        """A fetched batch in one transaction (on MongoDB a unit of work: mongo_batch.py),
        each message in a savepoint (a failing message's writes are undone alone, and it
        is redelivered or dead-lettered as ever); the acks, naks and dead letters go out
        after the commit, so nothing is acked before it is stored. One commit per batch
        instead of one per write: the status service's projection spent about a sixth
        of its CPU committing (on MongoDB: 4.6 commands per event, 0.18 batched).

        A batch that cannot be stored whole is tried whole once more (another status
        replica's document met by an insert: the race is over, and the batch's reads
        now see that document), then handled one message at a time: a write the store
        refuses would fail the batch on every delivery, and after the last one all its
        messages would be gone without a dead letter; alone, each message is stored, or
        retried and dead-lettered by itself as ever. Handlers are idempotent: running
        them again is safe."""
        durable = msgs[0].metadata.consumer or "unknown"
        try:
            settles = await self._store_batch(msgs, handler, decoder, atomic, before)
        except Exception as exc:  # noqa: BLE001 - tried again
            log.info("%s: a batch of %d not stored (%r); trying it again", durable, len(msgs), exc)
            try:
                settles = await self._store_batch(msgs, handler, decoder, atomic, before)
            except Exception as again:  # noqa: BLE001 - handled one message at a time
                log.warning(
                    "%s: a batch of %d not stored twice (%r); one message at a time",
                    durable, len(msgs), again,
                )  # fmt: skip
                BUS_BATCHES_SPLIT.labels(durable).inc()
                for msg in msgs:
                    await (await self._handle(msg, handler, decoder))()
                return
        for settle in settles:
            await settle()

    async def _store_batch(
        self,
        msgs: list[Msg],
        handler: Handler,
        decoder: Decoder,
        atomic: Atomic,
        before: Callable[[list[Any]], Awaitable[None]] | None,
    ) -> list[Settle]:
        """The batch's handlers in one transaction; what settles each message, once the
        transaction is stored (it raises otherwise)."""
        settles: list[Settle] = []
        # Each message decoded once, for the read ahead and its handler both.
        decoded = [_decode(msg, decoder) for msg in msgs]
        async with atomic.transaction():
            if before is not None:
                try:
                    await before([e for e in decoded if not isinstance(e, Undecodable)])
                except Exception:  # noqa: BLE001 - a read ahead; the handlers read anyway
                    durable = msgs[0].metadata.consumer or "unknown"
                    log.exception("%s: reading ahead for a batch of %d", durable, len(msgs))
            for msg, event in zip(msgs, decoded, strict=True):
                settles.append(await self._handle(msg, handler, decoder, atomic.savepoint, event))
        return settles

    async def _handle(
        self,
        msg: Msg,
        handler: Handler,
        decoder: Decoder,
        scope: Callable[[], AbstractAsyncContextManager[None]] = contextlib.nullcontext,
        decoded: Any = None,
    ) -> Settle:
        """Run ``handler`` on ``msg`` (inside ``scope``, which undoes its writes if it
        raises); returns what settles the message once its effect is stored.
        ``decoded``: what :func:`_decode` made of it already (None: decoded here)."""
        meta = msg.metadata
        headers = dict(msg.headers or {})
        durable = meta.consumer or "unknown"
        if meta.num_delivered > 1:
            BUS_REDELIVERIES.labels(durable).inc()
        subject = _original_subject(msg.subject, durable)
        event = decoded if decoded is not None else _decode(msg, decoder, subject, headers)
        if isinstance(event, Undecodable):
            return functools.partial(self._dead_letter, msg, durable, f"undecodable: {event.error}")
        if meta.num_delivered > self.max_deliver:
            # Every delivery so far ended without an answer, or its dead letter was not
            # stored: not run again (it may be what stops the process).
            error = (
                f"not settled on any of its first {self.max_deliver} deliveries (a handler "
                "that never answered, or a dead letter that could not be kept then)"
            )
            return functools.partial(self._dead_letter, msg, durable, error)
        delivery = Delivery(
            stream_seq=meta.sequence.stream,
            num_delivered=meta.num_delivered,
            subject=subject,
            trace_id=trace_id_of(headers),
            headers=headers,
        )
        job_id = getattr(event, "job_id", None)
        attributes: dict[str, str | int] = {
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": subject,
            "messaging.destination.template": subject_template(subject),
            "messaging.consumer.group.name": durable,
            "messaging.message.id": headers.get("Nats-Msg-Id", ""),
            "messaging.message.delivery_count": meta.num_delivered,
            "trainyard.event": type(event).__name__,
        }
        if isinstance(job_id, str):
            attributes["trainyard.job_id"] = job_id
        job_token = current_job.set(job_id if isinstance(job_id, str) else None)
        with self._tracer.start_as_current_span(
            f"process {subject_template(subject)}",
            context=extract_context(headers),
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
        ):
            began = time.perf_counter()
            hooks = _Hooks()
            hooks_token = _when_stored.set(hooks)
            try:
                async with scope():
                    await handler(event, delivery)
                if log.isEnabledFor(logging.DEBUG):  # a line per message: only when asked
                    log.debug("%s handled %s (delivery %d)", durable, subject, meta.num_delivered)
            except PermanentError as exc:
                return functools.partial(self._dead_letter, msg, durable, f"permanent error: {exc}")
            except Exception as exc:  # noqa: BLE001 - anything else may pass on redelivery
                if meta.num_delivered >= self.max_deliver:
                    error = f"failed on all {meta.num_delivered} deliveries: {exc!r}"
                    return functools.partial(self._dead_letter, msg, durable, error)
                delay = nak_delay(meta.num_delivered)
                log.warning(
                    "transient error on %s (delivery %d), redelivering in %.1fs: %r",
                    msg.subject,
                    meta.num_delivered,
                    delay,
                    exc,
                )
                return functools.partial(self._retry, msg, durable, delay)
            finally:
                hooks.closed = True
                _when_stored.reset(hooks_token)
                BUS_HANDLE.labels(durable).observe(time.perf_counter() - began)
                current_job.reset(job_token)
        if hooks:
            return functools.partial(self._stored, msg, durable, hooks)
        return functools.partial(self._ack, msg, durable)

    @classmethod
    async def _stored(cls, msg: Msg, durable: str, hooks: list[Callable[[], None]]) -> None:
        """The handler's ``when_stored`` hooks, then the ack."""
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - metrics and the like; the message is stored
                log.exception(
                    "%s: after storing %s (stream seq %d)",
                    durable, msg.subject, msg.metadata.sequence.stream,
                )  # fmt: skip
        await cls._ack(msg, durable)

    @staticmethod
    async def _ack(msg: Msg, durable: str) -> None:
        await msg.ack()
        BUS_MESSAGES.labels(durable, "acked").inc()

    @staticmethod
    async def _retry(msg: Msg, durable: str, delay: float) -> None:
        await msg.nak(delay=delay)
        BUS_MESSAGES.labels(durable, "retried").inc()

    async def _dead_letter(self, msg: Msg, durable: str, error: str) -> None:
        """Keep ``msg`` in the dead letters with why, count it, then drop it from the
        consumer. Not stored (the dead-letter stream unreachable): redelivered later."""
        meta = msg.metadata
        original = _original_subject(msg.subject, durable)
        headers = {
            **{k: v for k, v in (msg.headers or {}).items() if k != "Nats-Msg-Id"},
            # One dead letter per message and delivery that gave up on it.
            "Nats-Msg-Id": f"dead-{durable}-{meta.sequence.stream}-{meta.num_delivered}",
            DEAD_ERROR: error[:2000],
            DEAD_SUBJECT: original,
            DEAD_DURABLE: durable,
            DEAD_SEQ: str(meta.sequence.stream),
            DEAD_DELIVERIES: str(meta.num_delivered),
        }
        try:
            await self.js.publish(dead_letter_subject(durable, original), msg.data, headers=headers)
        except Exception as exc:  # noqa: BLE001 - keep the message rather than lose it
            log.error(
                "cannot keep a dead letter of %s (%s); redelivering: %r", original, error, exc
            )
            await msg.nak(delay=nak_delay(meta.num_delivered))
            return
        BUS_DEAD_LETTERS.labels(durable).inc()
        BUS_MESSAGES.labels(durable, "dead").inc()
        log.error(
            "dead letter: %s (stream seq %d, delivery %d) of %s: %s",
            original,
            meta.sequence.stream,
            meta.num_delivered,
            durable,
            error,
        )
        await msg.term()


@dataclass(frozen=True)
class DeadLetter:
    seq: int  # in the dead-letter stream
    durable: str
    subject: str  # where the message was first published
    error: str
    deliveries: int
    original_seq: int
    data: bytes
    headers: dict[str, str]


class DeadLetters:
    """The dead-letter stream, read and replayed by an admin (status's admin API)."""

    def __init__(self, bus: Bus) -> None:
        self.js = bus.js

    async def list(self, limit: int = 100) -> list[DeadLetter]:
        info = await self.js.stream_info(DEAD_LETTER_STREAM)
        found: list[DeadLetter] = []
        seq = info.state.first_seq
        while seq and seq <= info.state.last_seq and len(found) < limit:
            letter = await self.get(seq)
            if letter is not None:
                found.append(letter)
            seq += 1
        return found

    async def get(self, seq: int) -> DeadLetter | None:
        try:
            msg = await self.js.get_msg(DEAD_LETTER_STREAM, seq)
        except NotFoundError:
            return None
        headers = dict(msg.headers or {})
        return DeadLetter(
            seq=seq,
            durable=headers.get(DEAD_DURABLE, ""),
            subject=headers.get(DEAD_SUBJECT, ""),
            error=headers.get(DEAD_ERROR, ""),
            deliveries=int(headers.get(DEAD_DELIVERIES) or 0),
            original_seq=int(headers.get(DEAD_SEQ) or 0),
            data=msg.data or b"",
            headers=headers,
        )

    async def replay(self, seq: int) -> DeadLetter | None:
        """Send the dead letter back to the durable that gave up on it (its handlers
        are idempotent, so a replay of what was half done finishes it), then forget it.
        None: no such dead letter (replayed already)."""
        letter = await self.get(seq)
        if letter is None:
            return None
        headers = {k: v for k, v in letter.headers.items() if not k.startswith("Trainyard-Dead-")}
        headers["Nats-Msg-Id"] = f"replay-{seq}"
        await self.js.publish(
            replay_subject(letter.durable, letter.subject), letter.data, headers=headers
        )
        await self.js.delete_msg(DEAD_LETTER_STREAM, seq)
        return letter


# Headers of a dead letter: why, and where it came from.
DEAD_ERROR = "Trainyard-Dead-Error"
DEAD_SUBJECT = "Trainyard-Dead-Subject"
DEAD_DURABLE = "Trainyard-Dead-Durable"
DEAD_SEQ = "Trainyard-Dead-Seq"
DEAD_DELIVERIES = "Trainyard-Dead-Deliveries"


# --- key-value buckets -----------------------------------------------------------------


NONCE_BUCKET = "yard_nonces"


class KvNonces:
    """AccessKey signatures' nonces in a JetStream bucket that forgets them once their
    signatures are too old to be accepted: every replica of every API refuses a replay."""

    def __init__(self, bucket: KvBucket) -> None:
        self.bucket = bucket

    @classmethod
    async def open(cls, bus: Bus, ttl_s: float) -> KvNonces:
        return cls(await key_value(bus, NONCE_BUCKET, ttl_s))

    async def first_use(self, key: str) -> bool:
        try:
            await self.bucket.create(key, b"")
        except RevisionMismatch:
            return False
        return True


@dataclass(frozen=True)
class KvEntry:
    key: str
    value: bytes
    revision: int


class RevisionMismatch(Exception):
    """A revision-checked write lost: the key exists (create) or changed since the
    revision given (update, delete)."""


# JetStream's "wrong last sequence" errors (JSStreamWrongLastSequenceErrF / ...ConstantErr).
_WRONG_LAST_SEQUENCE = (10071, 10164)


class KvBucket:
    """A JetStream key-value bucket with compare-and-set writes only: every change names
    the revision it replaces, so two writers can never both win (leases are built on it)."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def get(self, key: str) -> KvEntry | None:
        """The latest value, or None when the key was never written or is deleted."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None
        return KvEntry(key, entry.value or b"", entry.revision or 0)

    async def create(self, key: str, value: bytes) -> int:
        """Write a key that does not exist (or was deleted); returns its revision."""
        try:
            return await self._kv.create(key, value)
        except KeyWrongLastSequenceError as exc:
            raise RevisionMismatch(f"key {key!r} already exists") from exc

    async def update(self, key: str, value: bytes, revision: int) -> int:
        """Replace the value written at ``revision``; returns the new revision."""
        try:
            return await self._kv.update(key, value, last=revision)
        except KeyWrongLastSequenceError as exc:
            raise RevisionMismatch(f"key {key!r} is no longer at revision {revision}") from exc

    async def delete(self, key: str, revision: int) -> None:
        """Delete the key if it is still at ``revision``."""
        try:
            await self._kv.delete(key, last=revision)
        except APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                raise RevisionMismatch(f"key {key!r} is no longer at revision {revision}") from exc
            raise


async def key_value(bus: Bus, bucket: str, ttl_s: float | None = None) -> KvBucket:
    """The bucket, created on first use (one revision kept per key, file storage; with
    ``ttl_s`` a key goes that long after it was written)."""
    try:
        return KvBucket(await bus.js.key_value(bucket))
    except BucketNotFoundError:
        pass
    try:
        kv = await bus.js.create_key_value(
            KeyValueConfig(bucket=bucket, history=1, storage=StorageType.FILE, ttl=ttl_s)
        )
    except BadRequestError:
        # Another process created it between our two calls.
        kv = await bus.js.key_value(bucket)
    return KvBucket(kv)
