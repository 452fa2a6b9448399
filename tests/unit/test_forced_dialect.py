"""``?dialect=`` naming no dialect is the request's error (400 naming the parameter),
before anything is published: it was a job on record, rejected at "$" (found by an
input audit)."""

from __future__ import annotations

import httpx

from trainyard_common.auth import TokenStore
from trainyard_common.events import Event, JobSubmitted
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.app import create_app
from trainyard_intake.handlers import Deps

ADMIN = "forced-dialect-admin-token"
JOB = {"name": "forced", "image": "busybox", "roles": [{"name": "w", "command": "true"}]}


async def test_an_unknown_forced_dialect_is_refused_naming_the_parameter() -> None:
    published: list[Event] = []

    async def publish(event: Event) -> int:
        published.append(event)
        return len(published)

    app = create_app(Deps(publish=publish, owners=InMemoryOwnerRegistry()), TokenStore(None, ADMIN))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://intake",
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as client:
        for bogus in ("bogus", "x" * 5000):
            answer = await client.post("/v1/jobs", params={"dialect": bogus}, json=JOB)
            assert answer.status_code == 400, answer.text[:200]
            detail = answer.json()["detail"]
            assert detail.startswith("dialect: unknown dialect") and len(detail) < 300
        assert published == []
        # Empty is left out: detected, as before (a form that always sends it).
        detected = await client.post("/v1/jobs", params={"dialect": ""}, json=dict(JOB, name="e"))
        assert detected.status_code == 202, detected.text
        # A known one, in any case, is taken.
        taken = await client.post("/v1/jobs", params={"dialect": "Native"}, json=JOB)
        assert taken.status_code == 202, taken.text
        assert taken.json()["dialect"] == "native"
    assert [type(e) for e in published] == [JobSubmitted, JobSubmitted]
