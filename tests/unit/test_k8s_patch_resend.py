"""A Kubernetes-style PATCH whose commands did not all reach the bus (a crash between
storing the resource and publishing, the bus down: answered 503) sends them with the
next write of the resource, the client's retry of the same patch included. The retry
once found the resource already as asked, answered 200 and sent nothing: a Kubeflow
``suspend: true`` lost (the job kept its GPUs), a resume lost (paused for ever), and
status, which serves the reads, never told of the change (found by a crash audit).

Intake's app over a publisher that behaves as JetStream does with ``Nats-Msg-Id``: a
message whose id it holds already is a duplicate, answered with the stored sequence,
stored once."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from trainyard_common.auth import TokenStore
from trainyard_common.errors import BusUnavailable
from trainyard_common.events import Event, JobResourceChanged, JobSubmitted, PauseJob, ResumeJob
from trainyard_intake.adapters.names import InMemoryNameClaims
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.app import create_app
from trainyard_intake.handlers import Deps

ADMIN = "k8s-patch-resend-admin-token"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PYTORCH = yaml.safe_load((EXAMPLES / "kubeflow" / "pytorchjob-simple.yaml").read_text())
JOBS = "/apis/kubeflow.org/v1/namespaces/kubeflow/pytorchjobs"
MERGE = {"Content-Type": "application/merge-patch+json"}
SUSPEND = {"spec": {"runPolicy": {"suspend": True}}}
RESUME = {"spec": {"runPolicy": {"suspend": False}}}


class Stream:
    """JetStream as far as a publisher sees it: deduplicated by event id, and made to
    fail the next publish of one kind of message (before or after storing it)."""

    def __init__(self) -> None:
        self.stored: list[Event] = []
        self.fail: tuple[type[Event], bool] | None = None  # (kind, stored before failing)
        # Past the duplicate window: a message sent again is stored again.
        self.forgetful = False

    async def publish(self, event: Event) -> int:
        if self.fail is not None and isinstance(event, self.fail[0]):
            kind, stored = self.fail
            self.fail = None
            if stored:  # stored, the ack lost
                self.stored.append(event)
            raise BusUnavailable(f"the bus did not store the message: {kind.__name__}")
        for seq, held in enumerate(self.stored, 1):
            if held.event_id == event.event_id and not self.forgetful:
                return seq  # a duplicate
        self.stored.append(event)
        return len(self.stored)

    def after_submission(self) -> list[Event]:
        return [e for e in self.stored if not isinstance(e, JobSubmitted)]


@pytest.fixture
def stream() -> Stream:
    return Stream()


@pytest.fixture
async def client(stream: Stream) -> AsyncIterator[httpx.AsyncClient]:
    deps = Deps(publish=stream.publish, owners=InMemoryOwnerRegistry(), names=InMemoryNameClaims())
    app = create_app(deps, TokenStore(None, ADMIN))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://intake",
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as http:
        made = await http.post(JOBS, json=copy.deepcopy(PYTORCH))
        assert made.status_code == 201, made.text
        yield http


async def patch(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.patch(f"{JOBS}/pytorch-simple", json=body, headers=MERGE)


def suspended(event: Event) -> object:
    assert isinstance(event, JobResourceChanged)
    return event.resource["spec"].get("runPolicy", {}).get("suspend")


@pytest.mark.parametrize("stored", [False, True], ids=["not-stored", "ack-lost"])
async def test_a_suspend_whose_command_failed_is_sent_by_the_retry(
    client: httpx.AsyncClient, stream: Stream, stored: bool
) -> None:
    stream.fail = (PauseJob, stored)
    assert (await patch(client, SUSPEND)).status_code == 503
    retried = await patch(client, SUSPEND)
    assert retried.status_code == 200, retried.text
    pause, changed = stream.after_submission()
    assert isinstance(pause, PauseJob) and suspended(changed) is True
    assert retried.json()["metadata"]["resourceVersion"] == str(len(stream.stored))
    # Sent, the claim keeps nothing more to send: a third call sends nothing.
    assert (await patch(client, SUSPEND)).status_code == 200
    assert len(stream.after_submission()) == 2


@pytest.mark.parametrize("late", [False, True], ids=["retried", "retried-late"])
async def test_a_change_whose_resource_event_failed_is_told_to_status_by_the_retry(
    client: httpx.AsyncClient, stream: Stream, late: bool
) -> None:
    # The command went out; its JobResourceChanged did not: the retry sends the latter
    # alone, even past the bus's duplicate window (a pause sent again then would pause
    # a job resumed since).
    stream.fail = (JobResourceChanged, False)
    assert (await patch(client, SUSPEND)).status_code == 503
    stream.forgetful = late
    assert (await patch(client, SUSPEND)).status_code == 200
    pause, changed = stream.after_submission()
    assert isinstance(pause, PauseJob) and suspended(changed) is True


async def test_a_later_change_sends_what_an_earlier_one_left_first(
    client: httpx.AsyncClient, stream: Stream
) -> None:
    # Not retried: the next write (a resume) sends the lost pause before its own resume,
    # in that order, and the resource as it is now (the earlier one's is outdated).
    stream.fail = (PauseJob, False)
    assert (await patch(client, SUSPEND)).status_code == 503
    assert (await patch(client, RESUME)).status_code == 200
    pause, resume, changed = stream.after_submission()
    assert isinstance(pause, PauseJob) and isinstance(resume, ResumeJob)
    assert suspended(changed) is False


async def test_two_pauses_of_one_resource_are_two_commands(
    client: httpx.AsyncClient, stream: Stream
) -> None:
    # Ids derive from the change, not from what it says: a second suspend after a
    # resume is a new command, not a duplicate of the first.
    for body in (SUSPEND, RESUME, SUSPEND):
        assert (await patch(client, body)).status_code == 200
    kinds = [type(e).__name__ for e in stream.after_submission()]
    assert kinds == ["PauseJob", "JobResourceChanged", "ResumeJob", "JobResourceChanged"] + [
        "PauseJob",
        "JobResourceChanged",
    ]
