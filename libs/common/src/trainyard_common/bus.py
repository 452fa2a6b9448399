"""The bus adapter: NATS JetStream, the only module that imports ``nats``.

Publishing: every event goes to ``subject_for(event)`` with ``Nats-Msg-Id`` set to its
``event_id`` (JetStream drops a duplicate inside the stream's duplicate window) and the
current W3C trace context in ``traceparent``. ``publish`` returns only after JetStream
stored the message.

Consuming: durable pull consumers with an explicit ack policy. A handler's effect is
stored before the ack; :class:`PermanentError` terminates the message, anything else
naks it with a growing delay so JetStream redelivers it. Handlers must be idempotent.
We use nats-py directly instead of FastStream: it is the cheapest hop (DESIGN §9), and
the ack policy is visible here rather than a framework default (docs/design/0001).

Key-value: :func:`key_value` opens (or creates) a JetStream KV bucket as a
:class:`KvBucket`, whose writes are all compare-and-set on a key's revision (placement's
leader lease is built on it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

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
    NotFoundError,
)
from nats.js.kv import KeyValue
from opentelemetry import trace
from pydantic import ValidationError

from .errors import PermanentError
from .events import Event, decode, encode
from .subjects import STREAM, STREAM_SUBJECTS, subject_for
from .telemetry import extract_context, inject_headers, trace_id_of, tracer

log = logging.getLogger("trainyard.bus")

DUPLICATE_WINDOW_S = 600.0
ACK_WAIT_S = 30.0
MAX_DELIVER = 50


@dataclass(frozen=True)
class Delivery:
    """What the bus knows about one delivered message, besides the event itself."""

    stream_seq: int
    num_delivered: int
    subject: str
    trace_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Event, Delivery], Awaitable[None]]


def nak_delay(num_delivered: int) -> float:
    """Redelivery backoff: 0.2 s, 0.4 s, ... capped at 10 s."""
    return min(0.2 * 2 ** max(num_delivered - 1, 0), 10.0)


class Bus:
    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js
        self._tracer = tracer("trainyard.bus")

    @classmethod
    async def connect(cls, url: str, name: str = "trainyard") -> Bus:
        nc = await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5)
        bus = cls(nc, nc.jetstream(timeout=10))
        await bus.ensure_stream()
        return bus

    async def ensure_stream(self) -> None:
        config = StreamConfig(
            name=STREAM,
            subjects=STREAM_SUBJECTS,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
        )
        try:
            await self.js.stream_info(STREAM)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
                return
            except nats.js.errors.BadRequestError:
                pass  # another service created it between our two calls
        await self.js.update_stream(config)

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()

    def _headers(self, event: Event) -> dict[str, str]:
        return inject_headers(
            {"Nats-Msg-Id": event.event_id, "Trainyard-Type": type(event).__name__}
        )

    async def publish(self, event: Event) -> int:
        """Publish and wait for JetStream's ack; returns the stream sequence."""
        ack = await self.js.publish(subject_for(event), encode(event), headers=self._headers(event))
        return ack.seq

    async def publish_all(self, events: Iterable[Event]) -> list[int]:
        """Publish several events without waiting for each ack in turn (they keep their
        order in the stream: one connection, sent in order), then wait for all acks."""
        futures = [
            await self.js.publish_async(subject_for(e), encode(e), headers=self._headers(e))
            for e in events
        ]
        acks = await asyncio.gather(*futures)
        return [ack.seq for ack in acks]

    async def ensure_consumer(self, durable: str, subjects: list[str]) -> None:
        config = ConsumerConfig(
            durable_name=durable,
            name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ACK_WAIT_S,
            max_deliver=MAX_DELIVER,
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
    ) -> None:
        """Run ``handler`` for every message of the durable consumer until ``stop``."""
        await self.ensure_consumer(durable, subjects)
        sub = await self.js.pull_subscribe_bind(durable=durable, stream=STREAM)
        if ready is not None:
            ready.set()
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(batch, timeout=1.0)
                except (TimeoutError, NatsTimeoutError):
                    continue
                for msg in msgs:
                    await self._handle(msg, handler)
        finally:
            await sub.unsubscribe()

    async def _handle(self, msg: Msg, handler: Handler) -> None:
        meta = msg.metadata
        headers = dict(msg.headers or {})
        try:
            event = decode(msg.data)
        except (ValidationError, ValueError) as exc:
            log.error("terminating undecodable message on %s: %s", msg.subject, exc)
            await msg.term()
            return
        delivery = Delivery(
            stream_seq=meta.sequence.stream,
            num_delivered=meta.num_delivered,
            subject=msg.subject,
            trace_id=trace_id_of(headers),
            headers=headers,
        )
        span_name = f"consume {type(event).__name__}"
        with self._tracer.start_as_current_span(
            span_name, context=extract_context(headers), kind=trace.SpanKind.CONSUMER
        ):
            try:
                await handler(event, delivery)
            except PermanentError as exc:
                log.warning("permanent error on %s (%s): %s", msg.subject, event.event_id, exc)
                await msg.term()
                return
            except Exception as exc:  # noqa: BLE001 - anything else may pass on redelivery
                delay = nak_delay(meta.num_delivered)
                log.warning(
                    "transient error on %s (delivery %d), redelivering in %.1fs: %r",
                    msg.subject,
                    meta.num_delivered,
                    delay,
                    exc,
                )
                await msg.nak(delay=delay)
                return
        await msg.ack()


# --- key-value buckets -----------------------------------------------------------------


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


async def key_value(bus: Bus, bucket: str) -> KvBucket:
    """The bucket, created on first use (one revision kept per key, file storage)."""
    try:
        return KvBucket(await bus.js.key_value(bucket))
    except BucketNotFoundError:
        pass
    try:
        kv = await bus.js.create_key_value(
            KeyValueConfig(bucket=bucket, history=1, storage=StorageType.FILE)
        )
    except BadRequestError:
        # Another process created it between our two calls.
        kv = await bus.js.key_value(bucket)
    return KvBucket(kv)
