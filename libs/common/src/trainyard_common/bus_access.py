"""Who may do what on the bus: each service's own NATS identity and its least privilege.

A service may publish only the subjects it owns (the events and commands it produces),
consume only through its own durable consumer, and read replies only on its own inbox
prefix (``_INBOX_<service>``): a forged ``JobPlaced`` or ``StopJob`` from anything but
placement or intake is refused by the server, as is a client without credentials. An
external producer publishes submissions only under its own name
(``yard.submit.<user>.<submission id>``): intake takes the submitting user from that
subject, never from the payload. The stack writes the server's configuration from
:func:`server_permissions`; docs/security.md explains each boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .subjects import (
    DEAD_LETTER_STREAM,
    STREAM,
    SUBMIT_PREFIX,
    commands_of,
    dead_letter_subject,
    events_of,
    replay_subject,
)


@dataclass(frozen=True)
class Grant:
    """What one identity may do."""

    # Stream subjects it publishes (its events, commands or submissions).
    publish: tuple[str, ...] = ()
    # Durable consumers of the YARD stream it consumes through.
    durables: tuple[str, ...] = ()
    # Key-value buckets it reads and writes.
    buckets: tuple[str, ...] = ()
    # Other raw subjects it may publish (JetStream API calls beyond the above).
    extra_publish: tuple[str, ...] = ()
    # Reads the dead-letter stream (and replays from it).
    dead_letters: bool = False


# The services. Placement's HTTP publishes ScaleJob for its own consumer; placement also
# ends jobs it never placed (JobFinished, JobInterrupted). Intake consumes producers'
# submissions. Status reads everything and holds the dead letters for admins.
GRANTS: dict[str, Grant] = {
    "intake": Grant(
        publish=(
            *events_of("submitted", "resource", "tag"),
            *commands_of("stop", "pause", "resume", "restart", "scale", "priority"),
        ),
        # intake-names: rejected jobs give their names back.
        durables=("intake", "intake-names"),
        buckets=("yard_nonces",),
        # How far status has projected (Bus.consumed): the Kubernetes API's writes
        # answer once their effect can be read.
        extra_publish=("$JS.API.CONSUMER.INFO.YARD.status",),
    ),
    "validation": Grant(publish=tuple(events_of("accepted", "rejected")), durables=("validation",)),
    "placement": Grant(
        publish=(
            *events_of("queued", "placed", "tasks", "finished", "interrupted"),
            *commands_of("interrupt", "scale"),
        ),
        durables=("placement",),
        buckets=("yard_leases",),
    ),
    "launcher": Grant(
        publish=tuple(events_of("task", "finished", "retrying", "interrupted")),
        durables=("launcher",),
        buckets=("yard_nonces",),
    ),
    # status-rebuild: the whole stream read again into fresh views (`yard admin rebuild`).
    "status": Grant(
        durables=("status", "status-rebuild"),
        buckets=("yard_nonces",),
        dead_letters=True,
        extra_publish=("$JS.API.CONSUMER.DELETE.YARD.status-rebuild",),
    ),
}

INBOX_PREFIX = "_INBOX_"


def inbox_prefix(identity: str) -> str:
    return f"{INBOX_PREFIX}{identity}"


def producer_identity(user: str) -> str:
    return f"producer-{user}"


def producer_grant(user: str) -> Grant:
    """An external producer submitting jobs as ``user``, and nothing else."""
    return Grant(publish=(f"{SUBMIT_PREFIX}.{user}.*",))


def _stream_api(stream: str) -> list[str]:
    return [f"$JS.API.STREAM.INFO.{stream}"]


def _durable_api(stream: str, durable: str) -> list[str]:
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _bucket_api(bucket: str) -> list[str]:
    stream = f"KV_{bucket}"
    return [
        f"$KV.{bucket}.>",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
    ]


@dataclass(frozen=True)
class ServerPermissions:
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)


def server_permissions(identity: str, grant: Grant) -> ServerPermissions:
    """The nats-server ``permissions`` block of ``identity`` (allow lists: everything
    else is denied)."""
    publish = [
        "$JS.API.INFO",
        *_stream_api(STREAM),
        *_stream_api(DEAD_LETTER_STREAM),
        *grant.publish,
        *grant.extra_publish,
    ]
    for durable in grant.durables:
        publish += _durable_api(STREAM, durable)
        # What it cannot process goes to the dead letters, under its own name only.
        publish.append(dead_letter_subject(durable, ">"))
    for bucket in grant.buckets:
        publish += _bucket_api(bucket)
    if grant.dead_letters:
        # An admin reads the dead letters and replays one to the durable that gave up.
        publish += [
            f"$JS.API.STREAM.MSG.GET.{DEAD_LETTER_STREAM}",
            f"$JS.API.STREAM.MSG.DELETE.{DEAD_LETTER_STREAM}",
            replay_subject("*", ">"),
        ]
    return ServerPermissions(publish=publish, subscribe=[f"{inbox_prefix(identity)}.>"])
