"""The bus and the store are the services' alone: against the real platform, a client
without credentials is refused by NATS, each service may publish only its own events
(a forged StopJob or JobPlaced is refused by the server), a producer submits only as
its own user, no secret crosses the bus in clear, the store has no TCP port and its
socket is the services' user's, and AccessKey secrets are sealed at rest."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import NoServersError

from trainyard_common.bus import Bus
from trainyard_common.events import JobPlaced, StopJob, TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_common.subjects import STREAM, submit_subject
from trainyard_stack.platform import Platform

from ..e2e.conftest import Api, start_platform

SECRET = "bus-secret-9c2e51"


@pytest.fixture(scope="module")
def platform(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Platform]:
    monkeypatch_module.setenv("YARD_PRODUCERS", "prodbot")
    platform = start_platform(tmp_path_factory.mktemp("bus-security"))
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def admin(platform: Platform) -> Api:
    return Api(platform.url, platform.token)


def plain_url(platform: Platform) -> str:
    assert platform.nats is not None
    return platform.nats.url  # no credentials in it


async def refused(url: str) -> bool:
    try:
        nc = await nats.connect(
            url, max_reconnect_attempts=0, connect_timeout=2, allow_reconnect=False
        )
    except (NoServersError, nats.errors.Error, OSError):
        return True
    await nc.close()
    return False


def test_no_credentials_no_bus(platform: Platform) -> None:
    url = plain_url(platform)
    assert asyncio.run(refused(url))
    wrong = url.replace("nats://", "nats://launcher:guessed@")
    assert asyncio.run(refused(wrong))


async def _publish(url: str, subject: str, data: bytes) -> tuple[bool, bool]:
    """Whether the server stored a publish of ``url``'s identity to ``subject``, and
    whether it said the publish was denied."""
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    user = url.split("//")[1].split(":")[0]
    nc = await nats.connect(url, error_cb=on_error, inbox_prefix=f"_INBOX_{user}".encode())
    js = nc.jetstream(timeout=2)
    stored = True
    try:
        await js.publish(subject, data, headers={"Nats-Msg-Id": uuid.uuid4().hex})
    except Exception:  # noqa: BLE001 - no ack: not stored
        stored = False
    await asyncio.sleep(0.3)
    await nc.close()
    return stored, any("permissions violation" in str(e).lower() for e in errors)


async def _publish_denied(url: str, subject: str, data: bytes) -> bool:
    """True when the server refuses ``url``'s identity a publish to ``subject``."""
    stored, denied = await _publish(url, subject, data)
    return not stored and denied


def test_a_service_may_not_forge_another_services_events(platform: Platform, admin: Api) -> None:
    job_id = admin.submit({"name": "victim", "roles": [{"name": "w", "command": "sleep 30"}]})
    admin.wait(job_id, {"RUNNING"}, timeout=60)
    stop = StopJob(job_id=job_id, requested_by="mallory").model_dump_json().encode()
    # The launcher (or a task that stole its password) cannot stop a user's job.
    assert asyncio.run(_publish_denied(platform.bus_url("launcher"), "yard.cmd.stop", stop))
    # Nor pass the command off under a subject it may publish: stored, but each consumer
    # takes it for what it is, a dead letter (placement's consumer of yard.job.task
    # once handled it as a StopJob).
    stored, _ = asyncio.run(_publish(platform.bus_url("launcher"), "yard.job.task", stop))
    assert stored
    deadline = time.monotonic() + 30
    while True:
        letters = admin.http.get("/v1/admin/dead-letters", params={"limit": 1000}).json()["items"]
        refused = {d["durable"] for d in letters if d["subject"] == "yard.job.task"}
        if {"placement", "status"} <= refused or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {"placement", "status"} <= refused, letters
    forged = JobPlaced(
        job_id=uuid.uuid4().hex,
        spec=JobSpec(name="forged", user="admin", roles=[RoleSpec(name="w", command="id")]),
        tasks=[TaskPlacement(role="w", index=0, node="node-cpu", host_ip="127.0.0.1")],
    )
    data = forged.model_dump_json().encode()
    for who in ("intake", "validation", "launcher", "status"):
        subject = "yard.job.placed"
        assert asyncio.run(_publish_denied(platform.bus_url(who), subject, data)), who
    assert admin.job(job_id)["state"] == "RUNNING"
    admin.stop(job_id)


def test_a_producer_submits_only_as_itself(platform: Platform, admin: Api) -> None:
    creds = json.loads((platform.data_dir / "producers" / "prodbot.json").read_text())
    assert Path(platform.data_dir / "producers" / "prodbot.json").stat().st_mode & 0o077 == 0
    url = plain_url(platform).replace("nats://", f"nats://{creds['user']}:{creds['password']}@")
    payload = {
        "name": "from-the-bus",
        "user": "admin",  # claims to be someone else: ignored
        "roles": [{"name": "w", "command": "echo produced"}],
    }
    submission = uuid.uuid4().hex
    data = json.dumps(payload).encode()

    async def publish() -> None:
        nc = await nats.connect(url, inbox_prefix=creds["inbox_prefix"].encode())
        await nc.jetstream().publish(
            submit_subject("prodbot", submission), data, headers={"Nats-Msg-Id": submission}
        )
        await nc.close()

    asyncio.run(publish())
    # The job id is the one POST /v1/jobs with that Idempotency-Key would give prodbot.
    jobs = []
    for _ in range(100):
        jobs = [j for j in admin.http.get("/v1/jobs", params={"user": "prodbot"}).json()["items"]]
        if jobs:
            break
        asyncio.run(asyncio.sleep(0.2))
    assert [j["name"] for j in jobs] == ["from-the-bus"]
    view = admin.wait(jobs[0]["id"], timeout=60)
    assert view["state"] == "SUCCEEDED" and view["user"] == "prodbot"
    # Not as another user, and not as a JobSubmitted of its own.
    assert asyncio.run(_publish_denied(url, submit_subject("admin", uuid.uuid4().hex), data))
    assert asyncio.run(_publish_denied(url, "yard.job.submitted", data))


def test_no_secret_crosses_the_bus_in_clear(platform: Platform, admin: Api) -> None:
    job_id = admin.submit(
        {
            "name": "with-secret",
            "secrets": [{"name": "token", "value": SECRET}],
            # The task checks it got the value without the value being in its command.
            "roles": [
                {
                    "name": "w",
                    "command": "test \"$(printf %s '<% $secrets.token %>' | sha256sum | cut -c1-16)\""
                    f" = {hashlib.sha256(SECRET.encode()).hexdigest()[:16]}",
                }
            ],
        }
    )
    view = admin.wait(job_id, timeout=60)
    assert view["state"] == "SUCCEEDED", view  # the launcher opened it

    async def stream_bytes() -> bytes:
        bus = await Bus.connect(platform.bus_url(), name="security-test")
        info = await bus.js.stream_info(STREAM)
        seen = b""
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await bus.js.get_msg(STREAM, seq)
            if job_id.encode() in (msg.data or b""):  # the job's messages
                seen += msg.data or b""
        await bus.close()
        return seen

    carried = asyncio.run(stream_bytes())
    assert b"enc:v1:" in carried and SECRET.encode() not in carried


def test_the_store_is_files_only_the_services_user_opens(platform: Platform, admin: Api) -> None:
    assert platform.mongo is None  # the embedded default: one SQLite file per service
    store = platform.data_dir / "store"
    files = sorted(p.name for p in store.glob("*.sqlite3"))
    prefix = platform.config.db_prefix
    assert {f"{prefix}_{name}.sqlite3" for name in ("intake", "status", "launcher")} <= set(files)
    assert store.stat().st_mode & 0o077 == 0
    assert all((store / name).stat().st_mode & 0o077 == 0 for name in files)
    if os.geteuid() == 0:
        # A task (its own uid) cannot even reach the files.
        target = store / f"{prefix}_status.sqlite3"
        command = f"python3 -c \"open('{target}', 'rb')\" 2>&1 | tail -1"
        job_id = admin.submit({"name": "store-probe", "roles": [{"name": "w", "command": command}]})
        admin.wait(job_id, timeout=60)
        out = admin.http.get(f"/v1/jobs/{job_id}/logs").text
        assert "PermissionError" in out or "Permission denied" in out, out


def test_access_key_secrets_are_sealed_at_rest(platform: Platform, admin: Api) -> None:
    answer = admin.http.post("/v1/access-keys", json={"user": "dlc-user"})
    assert answer.status_code in (200, 201), answer.text
    key = answer.json()
    secret = key.get("AccessKeySecret") or key.get("secret")
    key_id = key.get("AccessKeyId") or key.get("id")
    assert secret and key_id
    doc = asyncio.run(find_stored(platform, "auth", "access_keys", key_id))
    assert doc is not None and secret not in json.dumps(doc, default=str)
    assert str(doc["secret"]).startswith("enc:v1:")


async def find_stored(platform: Platform, db: str, collection: str, doc_id: str) -> Any:
    client = platform.store_client()
    try:
        return await client[f"{platform.config.db_prefix}_{db}"][collection].find_one(
            {"_id": doc_id}
        )
    finally:
        await client.close()
