"""Intake's handlers with an in-memory owner registry and a collecting publisher."""

from __future__ import annotations

import pytest

from trainyard_common.auth import Identity
from trainyard_common.cluster import ClusterSpec
from trainyard_common.dialects import UnknownDialect
from trainyard_common.errors import BusUnavailable
from trainyard_common.events import (
    Event,
    JobSubmitted,
    PauseJob,
    RestartJob,
    ResumeJob,
    StopJob,
    derived_id,
)
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.handlers import (
    Deps,
    JobNotFound,
    NameTaken,
    release_rejected_name,
    request_pause,
    request_restart,
    request_resume,
    request_stop,
    submit_job,
)
from trainyard_intake.producers import Submission, decode_submission, submit_published
from trainyard_validation.domain.rules import decide

from ..support.bus import RECEIVED
from ..support.payloads import openpai_v2

JOB = {
    "jobName": "j1",
    "image": "img",
    "taskRoles": [
        {
            "name": "r",
            "taskNumber": 2,
            "cpuNumber": 1,
            "memoryMB": 256,
            "gpuNumber": 0,
            "command": "true",
        }
    ],
}


class Published(list):
    async def __call__(self, event: Event) -> int:
        self.append(event)
        return len(self)


@pytest.fixture
def deps() -> Deps:
    return Deps(publish=Published(), owners=InMemoryOwnerRegistry())


async def test_submit_publishes_the_translated_job_owned_by_the_caller(deps: Deps) -> None:
    result = await submit_job(JOB, Identity("alice"), deps)
    [event] = deps.publish
    assert isinstance(event, JobSubmitted) and event.job_id == result.job_id
    assert event.dialect == "openpai" and event.spec.user == "alice"
    assert event.spec.roles[0].replicas == 2 and event.original == JOB
    assert await deps.owners.owner(result.job_id) == "alice"


async def test_idempotency_key_gives_the_same_job_and_event(deps: Deps) -> None:
    a = await submit_job(JOB, Identity("alice"), deps, idempotency_key="k1")
    b = await submit_job(JOB, Identity("alice"), deps, idempotency_key="k1")
    c = await submit_job(JOB, Identity("bob"), deps, idempotency_key="k1")
    assert a.job_id == b.job_id != c.job_id
    assert deps.publish[0].event_id == deps.publish[1].event_id  # JetStream drops the repeat


async def test_unknown_payload_is_refused_before_anything_is_published(deps: Deps) -> None:
    with pytest.raises(UnknownDialect):
        await submit_job({"hello": "world"}, Identity("alice"), deps)
    assert deps.publish == []


async def test_only_the_owner_or_an_admin_can_stop(deps: Deps) -> None:
    job_id = (await submit_job(JOB, Identity("alice"), deps)).job_id
    with pytest.raises(JobNotFound):
        await request_stop(job_id, Identity("bob"), deps)
    with pytest.raises(JobNotFound):
        await request_stop("nope", Identity("admin", admin=True), deps)
    await request_stop(job_id, Identity("alice"), deps)
    await request_stop(job_id, Identity("root", admin=True), deps)
    stops = [e for e in deps.publish if isinstance(e, StopJob)]
    assert [s.requested_by for s in stops] == ["alice", "root"]


async def test_only_the_owner_or_an_admin_can_pause_and_resume(deps: Deps) -> None:
    job_id = (await submit_job(JOB, Identity("alice"), deps)).job_id
    for request in (request_pause, request_resume):
        with pytest.raises(JobNotFound):
            await request(job_id, Identity("bob"), deps)
        with pytest.raises(JobNotFound):
            await request("nope", Identity("admin", admin=True), deps)
    await request_pause(job_id, Identity("alice"), deps)
    await request_pause(job_id, Identity("root", admin=True), deps, "maintenance")
    await request_resume(job_id, Identity("alice"), deps)
    pauses = [e for e in deps.publish if isinstance(e, PauseJob)]
    assert [(p.job_id, p.requested_by, p.reason) for p in pauses] == [
        (job_id, "alice", "paused by alice"),
        (job_id, "root", "maintenance"),
    ]
    [resume] = [e for e in deps.publish if isinstance(e, ResumeJob)]
    assert (resume.job_id, resume.requested_by) == (job_id, "alice")


async def test_only_the_owner_or_an_admin_can_restart(deps: Deps) -> None:
    job_id = (await submit_job(JOB, Identity("alice"), deps)).job_id
    with pytest.raises(JobNotFound):
        await request_restart(job_id, Identity("bob"), deps)
    with pytest.raises(JobNotFound):
        await request_restart("nope", Identity("admin", admin=True), deps)
    await request_restart(job_id, Identity("alice"), deps)
    await request_restart(job_id, Identity("root", admin=True), deps, "new data")
    restarts = [e for e in deps.publish if isinstance(e, RestartJob)]
    assert [(r.job_id, r.requested_by, r.reason) for r in restarts] == [
        (job_id, "alice", "restarted by alice"),
        (job_id, "root", "new data"),
    ]
    assert restarts[0].event_id != restarts[1].event_id  # two asks, two restarts


async def test_a_used_name_is_refused_at_once_and_a_bus_submission_is_rejected_for_it(
    deps: Deps,
) -> None:
    first = await submit_job(JOB, Identity("alice"), deps)
    assert deps.publish[0].name_claimed is True
    with pytest.raises(NameTaken) as taken:
        await submit_job(JOB, Identity("alice"), deps)
    assert taken.value.holder == first.job_id and len(deps.publish) == 1
    # Another user's job of the same name is theirs to have.
    await submit_job(JOB, Identity("bob"), deps)
    # A submission from the bus has no one to answer: it is published with the error.
    late = await submit_job(JOB, Identity("alice"), deps, refuse_used_name=False)
    event = deps.publish[-1]
    assert event.job_id == late.job_id and event.name_claimed is False
    assert [e.code for e in event.translation_errors] == ["name_taken"]
    assert event.translation_errors[0].path == "$.jobName"


async def test_a_name_is_freed_when_its_job_never_reached_the_bus() -> None:
    async def down(event: Event) -> int:
        raise ConnectionError("bus down")

    deps = Deps(publish=down, owners=InMemoryOwnerRegistry())
    with pytest.raises(ConnectionError):
        await submit_job(JOB, Identity("alice"), deps)
    assert await deps.names.get("alice", "j1") is None


async def test_a_retry_of_a_rejected_job_does_not_take_its_name_again(deps: Deps) -> None:
    """The same Idempotency-Key after the job was rejected: the same job (202 again, its
    publish a duplicate the bus drops), and the name stays free for the mended job."""
    first = await submit_job(JOB, Identity("alice"), deps, idempotency_key="k1")
    assert await release_rejected_name(first.job_id, deps)  # validation rejected it
    published = len(deps.publish)  # type: ignore[arg-type]
    retry = await submit_job(JOB, Identity("alice"), deps, idempotency_key="k1")
    assert retry.job_id == first.job_id
    assert await deps.names.get("alice", "j1") is None
    # Nor is it published again: past the bus's duplicate window it would be validated
    # anew, and could run without its name.
    assert len(deps.publish) == published  # type: ignore[arg-type]
    mended = await submit_job(JOB, Identity("alice"), deps)
    assert (await deps.names.get("alice", "j1")).job_id == mended.job_id
    # A retry of a job still waiting for validation keeps the name it holds.
    other = {**JOB, "jobName": "j2"}
    held = await submit_job(other, Identity("alice"), deps, idempotency_key="k2")
    await submit_job(other, Identity("alice"), deps, idempotency_key="k2")
    assert (await deps.names.get("alice", "j2")).job_id == held.job_id


async def test_a_rejected_job_gives_its_name_back_once_and_only_its_own(deps: Deps) -> None:
    """Rejected after its 202 (a check against the cluster), the job gives its name back
    so the mended job can take it; a job rejected for a name another holds takes
    nothing from the holder, and a Kubernetes-style resource keeps its name."""
    first = await submit_job(JOB, Identity("alice"), deps)
    late = await submit_job(JOB, Identity("alice"), deps, refuse_used_name=False)
    assert not await release_rejected_name(late.job_id, deps)  # not the holder
    assert (await deps.names.get("alice", "j1")).job_id == first.job_id
    assert await release_rejected_name(first.job_id, deps)
    assert await deps.names.get("alice", "j1") is None
    assert not await release_rejected_name(first.job_id, deps)  # delivered again
    again = await submit_job(JOB, Identity("alice"), deps)
    assert (await deps.names.get("alice", "j1")).job_id == again.job_id
    assert not await release_rejected_name("no-such-job", deps)

    await deps.owners.record("k8s-job", "alice", "ns/pytorchjobs/train")
    await deps.names.claim("alice", "ns/pytorchjobs/train", "k8s-job", {"kind": "PyTorchJob"})
    assert not await release_rejected_name("k8s-job", deps)
    assert (await deps.names.get("alice", "ns/pytorchjobs/train")).job_id == "k8s-job"


def submission(payload: object, submission_id: str = "s1") -> Submission:
    return Submission("bot", submission_id, payload)


async def test_a_published_submission_too_large_for_the_bus_is_a_rejected_job(
    deps: Deps,
) -> None:
    # Retried, it would only fail again, and end in the dead letters with its producer
    # never told: it is a job, rejected with the reason, under the id its key gives.
    deps.max_payload = 4096
    big = {**JOB, "taskRoles": [{**JOB["taskRoles"][0], "command": "x" * 5000}]}
    await submit_published(submission(big), RECEIVED, deps)
    [event] = deps.publish
    assert isinstance(event, JobSubmitted) and event.spec.user == "bot"
    assert event.job_id == derived_id("job", "bot", "s1") and event.original == {}
    [issue] = event.translation_errors
    assert (issue.path, issue.code) == ("$", "too_large")
    assert "more than the bus carries (4096 bytes)" in issue.message
    [error] = decide(event, ClusterSpec(nodes=[])).errors  # type: ignore[union-attr]
    assert error == issue  # the reason, alone: nothing said of the stand-in spec


async def test_a_published_submission_that_cannot_be_read_is_rejected_saying_why(
    deps: Deps,
) -> None:
    unread = decode_submission(b"{not json", "yard.submit.bot.s2", {})
    await submit_published(unread, RECEIVED, deps)
    [event] = deps.publish
    [issue] = event.translation_errors
    assert issue.code == "unreadable" and "the submission cannot be read" in issue.message


async def test_a_job_whose_ack_was_lost_keeps_its_name() -> None:
    # The bus stored the job but its ack timed out: freeing the name then let the
    # client's retry (without an Idempotency-Key) make a second job of the same name.
    stored: list[Event] = []

    async def ack_lost_once(event: Event) -> int:
        if event.event_id not in {e.event_id for e in stored}:
            stored.append(event)
            raise BusUnavailable("the bus did not store the message: TimeoutError()")
        return len(stored)  # a duplicate: JetStream answers with the stored sequence

    deps = Deps(publish=ack_lost_once, owners=InMemoryOwnerRegistry())
    result = await submit_job(JOB, Identity("alice"), deps)
    assert [e.job_id for e in stored] == [result.job_id]
    assert (await deps.names.get("alice", "j1")).job_id == result.job_id
    with pytest.raises(NameTaken):
        await submit_job(JOB, Identity("alice"), deps)


async def test_a_secret_holding_the_views_mask_is_the_jobs_error_before_it_is_sealed(
    deps: Deps,
) -> None:
    # Sealed, the mask could no longer be told from a value: intake is where it is seen.
    job = openpai_v2(secrets={"token": "******"})
    await submit_job(job, Identity("alice"), deps)
    [event] = deps.publish
    assert [(e.path, e.code) for e in event.translation_errors] == [("$.secrets", "hidden")]
