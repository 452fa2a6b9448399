"""Intake's service layer: turn a request into an event on the bus, and answer only after
JetStream has stored it (an accepted job is never lost)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trainyard_common.auth import Identity
from trainyard_common.bus import Delivery, EventHandler
from trainyard_common.cluster import ClusterSpec, current_runtime
from trainyard_common.dialects import (
    BY_NAME,
    Translation,
    dedupe,
    detect,
    field_path,
    translate,
)
from trainyard_common.dialects.translation import masked_secrets, too_many_tasks
from trainyard_common.errors import BusUnavailable
from trainyard_common.events import (
    Event,
    FieldIssue,
    JobRejected,
    JobSubmitted,
    PauseJob,
    RestartJob,
    ResumeJob,
    SetPriority,
    StopJob,
    derived_id,
    encode,
    new_id,
)
from trainyard_common.fit import check_against_cluster
from trainyard_common.jobspec import JobSpec
from trainyard_common.runtimes import runtime_errors, runtime_warnings
from trainyard_common.secrets_box import SecretBox

from .adapters.names import InMemoryNameClaims, NameClaims, outlives_its_job
from .adapters.owners import OwnerRegistry


class JobNotFound(LookupError):
    pass


class NameTaken(ValueError):
    """The job's name is held by another job of the same user (a 409 in every dialect)."""

    def __init__(self, key: str, holder: str) -> None:
        super().__init__(f"{key!r} is already used by job {holder}")
        self.key = key
        self.holder = holder


class PayloadTooLarge(ValueError):
    """The job is larger than the bus carries (an HTTP 413)."""


@dataclass
class Deps:
    publish: Callable[[Event], Awaitable[int]]
    owners: OwnerRegistry
    # Seals a job's secret values before they are published (None: they travel in
    # clear, which only a platform without YARD_SECRETS_KEY does).
    box: SecretBox | None = None
    # The largest event the bus takes (the server's max_payload, less room for headers).
    max_payload: int = 1024 * 1024 - 4096
    # Who holds which job name (adapters/names.py).
    names: NameClaims = field(default_factory=InMemoryNameClaims)
    # The cluster as configured (its file), to refuse at once a job that can never run
    # on it; None where the nodes are known only at run time (the Kubernetes backend).
    cluster: ClusterSpec | None = None
    # Waits (bounded) until status has stored the effect of the message at a stream
    # sequence, so a write answered is a write the next read shows (the Kubernetes
    # API's read-your-writes); None: answer at once.
    settled: Callable[[int], Awaitable[bool]] | None = None

    async def settle(self, seq: int | None) -> None:
        """Until a read shows the message at stream sequence ``seq`` (``settled``,
        bounded); at once without it or without a sequence."""
        if seq and self.settled is not None:
            await self.settled(seq)


@dataclass
class Submitted:
    job_id: str
    dialect: str
    warnings: list[FieldIssue] = field(default_factory=list)
    errors: list[FieldIssue] = field(default_factory=list)
    seq: int | None = None  # the JobSubmitted's stream sequence


async def submit_job(
    payload: Any,
    identity: Identity,
    deps: Deps,
    *,
    dialect: str | None = None,
    idempotency_key: str | None = None,
    translation: Translation | None = None,
    refuse_used_name: bool = True,
) -> Submitted:
    """Translate, record the owner, publish ``JobSubmitted``.

    With an ``Idempotency-Key`` the job id and event id derive from it, so a client that
    retries after a lost answer gets the same job instead of a second one (the owner
    record and JetStream's duplicate window both see the repeat).

    A name another job of the user holds raises ``NameTaken`` (each API answers 409 in
    its own shape); with ``refuse_used_name`` False (a submission from the bus, which has
    no one to answer) the job is published with that error, and validation rejects it.

    A ``translation`` given is one the caller ``checked`` (a dialect's API that answers
    its errors before submitting)."""
    # An unrecognisable payload is refused at the door (400), not turned into a job.
    if translation is None:
        found = translate(payload, dialect=dialect or detect(payload), user=identity.user)
        translation = checked(found, payload, deps)
    if idempotency_key:
        job_id = derived_id("job", identity.user, idempotency_key)
        event_id = derived_id("submitted", job_id)
    else:
        job_id, event_id = new_id(), new_id()
    if translation.key is not None and not translation.errors and not refuse_used_name:
        held = await deps.names.get(identity.user, translation.key)
        if held is not None and held.job_id != job_id:
            issue = FieldIssue(
                path=field_path(translation.dialect, payload, None, "name"),
                code="name_taken",
                message=f"job name {translation.spec.name!r} is already used by job "
                f"{held.job_id}; job names are unique per user",
            )
            translation = replace(translation, errors=[*translation.errors, issue])
    chosen = BY_NAME.get(translation.dialect)
    # What this platform's runtime makes of the job, said at once (validation too).
    warnings = dedupe(
        [
            *translation.warnings,
            *runtime_warnings(
                translation.spec,
                current_runtime(),
                lambda role, name: field_path(translation.dialect, payload, role, name),
            ),
        ]
    )
    original = payload if isinstance(payload, dict) else {"payload": payload}
    event = JobSubmitted(
        event_id=event_id,
        job_id=job_id,
        # Nothing secret travels in clear: the spec's secret values sealed for the
        # launcher, the payload as the dialect shows it back (its secrets hidden).
        spec=seal_secrets(translation.spec, deps.box, job_id),
        dialect=translation.dialect,
        dialect_key=translation.key,
        original=chosen.redact(original) if chosen is not None else original,
        translation_errors=translation.errors,
        warnings=warnings,
        # A job refused at the door never holds its name.
        name_claimed=translation.key is not None and not translation.errors,
    )
    # Refused before anything is written: the bus would refuse it after the owner record.
    size = len(encode(event))
    if size > deps.max_payload:
        raise PayloadTooLarge(
            f"the job is {size} bytes as an event, more than the bus carries "
            f"({deps.max_payload} bytes): a command or payload this large belongs in a file "
            "of the job's code or data"
        )
    if event.name_claimed and translation.key is not None:
        holder = await deps.names.claim(identity.user, translation.key, job_id, original)
        if holder != job_id:
            raise NameTaken(translation.key, holder)
    retry = not await deps.owners.record(job_id, identity.user, translation.key)
    if retry and await deps.owners.rejected(job_id):
        # The same Idempotency-Key again, for a job validation has since rejected: it
        # is that job, rejected, and nothing is published again (JetStream would drop
        # it as a duplicate, so no second rejection would free the name claimed just
        # now; past its duplicate window it would be validated again, and might run
        # without holding its name).
        key = translation.key
        if event.name_claimed and key is not None and not outlives_its_job(key):
            await deps.names.release(identity.user, key, job_id)
        return Submitted(job_id, translation.dialect, warnings, translation.errors)
    try:
        try:
            seq = await deps.publish(event)
        except BusUnavailable:
            # An ack that did not come may be that of a message stored: asked again
            # (the same id, stored once), the bus says so when it answers, and the name
            # stays with the job (given back, a retry would make a second job of it).
            seq = await deps.publish(event)
    except BaseException:
        # Not on the bus, so not a job: its name is free for the retry (one with the
        # same Idempotency-Key gets the same id and would find its own claim anyway).
        if event.name_claimed and translation.key is not None:
            await deps.names.release(identity.user, translation.key, job_id)
        raise
    return Submitted(job_id, translation.dialect, warnings, translation.errors, seq)


def checked(translation: Translation, payload: Any, deps: Deps) -> Translation:
    """The translation with what the cluster as configured says of a job that broke no
    rule of its dialect: the runtime cannot run it, its queue does not exist, or it can
    never fit (validation says the same later; a submission is answered with it at once).
    And, whatever the cluster, a job too large for any view of it to list its tasks."""
    if translation.errors:
        return translation

    def locate(role: str | None, name: str) -> str:
        return field_path(translation.dialect, payload, role, name)

    spec = translation.spec
    errors = too_many_tasks(spec, locate) + masked_secrets(spec, locate)
    if not errors and deps.cluster is not None:
        errors = runtime_errors(spec, deps.cluster, locate) or check_against_cluster(
            spec, deps.cluster, locate
        )
    return replace(translation, errors=errors) if errors else translation


def seal_secrets(spec: JobSpec, box: SecretBox | None, job_id: str) -> JobSpec:
    if box is None or not spec.secrets:
        return spec
    sealed = [s.model_copy(update={"value": box.seal(s.value, job_id)}) for s in spec.secrets]
    return spec.model_copy(update={"secrets": sealed})


async def request_stop(
    job_id: str,
    identity: Identity,
    deps: Deps,
    reason: str | None = None,
    *,
    delete: bool = False,
) -> int:
    """``delete``: the job's Kubernetes-style resource goes too. Returns the command's
    stream sequence."""
    await _check_owner(job_id, identity, deps)
    return await deps.publish(
        StopJob(
            job_id=job_id,
            requested_by=identity.user,
            reason=reason or f"stopped by {identity.user}",
            delete=delete,
        )
    )


async def release_rejected_name(job_id: str, deps: Deps) -> bool:
    """A job validation rejected gives its name back: the platforms Trainyard imitates
    refuse such a job at submission, before it holds one, and the user submits it again,
    mended, under the same name (its checks against the cluster come after the 202
    here). A Kubernetes-style resource keeps its name until it is deleted, as there.
    Only while this job holds the name (a job rejected for a name another holds leaves
    it be), so doing it twice is doing it once. Whether a name was freed."""
    entry = await deps.owners.entry(job_id)
    if entry is None:
        return False
    # Marked first: a retry of its submission that claims the name between the two
    # sees the mark and gives the name back itself (submit_job).
    await deps.owners.mark_rejected(job_id)
    if entry[1] is None or outlives_its_job(entry[1]):
        return False
    user, key = entry[0], entry[1]
    return await deps.names.release(user, key, job_id)


async def on_rejected(event: JobRejected, _delivery: Delivery, deps: Deps) -> None:
    await release_rejected_name(event.job_id, deps)


# What intake consumes from the bus (besides producers' submissions): its durable
# "intake-names" subscribes to exactly these.
EVENT_HANDLERS: dict[type[Event], EventHandler[Deps]] = {JobRejected: on_rejected}
NAMES_DURABLE = "intake-names"


async def request_priority(job_id: str, identity: Identity, deps: Deps, priority: int) -> None:
    """A new priority for the job (PAI-DLC's UpdateJob); placement applies it while the
    job waits or runs, and drops it for a job that has ended."""
    await _check_owner(job_id, identity, deps)
    await deps.publish(SetPriority(job_id=job_id, requested_by=identity.user, priority=priority))


async def request_pause(
    job_id: str, identity: Identity, deps: Deps, reason: str | None = None
) -> None:
    """Placement decides what a pause means where the job is (docs/lifecycle.md)."""
    await _check_owner(job_id, identity, deps)
    await deps.publish(
        PauseJob(
            job_id=job_id, requested_by=identity.user, reason=reason or f"paused by {identity.user}"
        )
    )


async def request_resume(job_id: str, identity: Identity, deps: Deps) -> None:
    await _check_owner(job_id, identity, deps)
    await deps.publish(ResumeJob(job_id=job_id, requested_by=identity.user))


async def request_restart(
    job_id: str, identity: Identity, deps: Deps, reason: str | None = None
) -> None:
    """Placement decides what a restart means where the job is (docs/lifecycle.md)."""
    await _check_owner(job_id, identity, deps)
    await deps.publish(
        RestartJob(
            job_id=job_id,
            requested_by=identity.user,
            reason=reason or f"restarted by {identity.user}",
        )
    )


async def _check_owner(job_id: str, identity: Identity, deps: Deps) -> None:
    owner = await deps.owners.owner(job_id)
    # Someone else's job is reported exactly like a missing one: ids are not to be probed.
    if owner is None or not identity.can_see(owner):
        raise JobNotFound(job_id)
