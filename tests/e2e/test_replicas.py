"""Services as several replicas: they share the work (each message to one replica, each
HTTP request to one), no job is lost or handled twice, and when a replica dies its
siblings carry on."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard_common.bus import Bus
from trainyard_common.subjects import STREAM
from trainyard_stack.platform import Platform, PlatformConfig, parse_replicas

from .conftest import Api, platform_config

REPLICAS = {"intake": 2, "validation": 2, "status": 2, "placement": 2}
# Each service's durable consumer, shared by its replicas.
DURABLES = {"intake": "intake", "validation": "validation", "status": "status"}


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    config = dataclasses.replace(
        platform_config(tmp_path_factory.mktemp("replicas")), replicas=dict(REPLICAS)
    )
    platform = Platform(config).start()
    yield platform
    platform.stop()


def job(name: str) -> dict:
    return {"name": name, "roles": [{"name": "w", "command": "true"}]}


async def waiting_pulls(platform: Platform) -> dict[str, int]:
    bus = await Bus.connect(platform.bus_url(), name="test-replicas")
    try:
        return {
            name: (await bus.js.consumer_info(STREAM, durable)).num_waiting or 0
            for name, durable in DURABLES.items()
        }
    finally:
        await bus.close()


def settle_history(api: Api, job_id: str) -> collections.Counter[str]:
    events = api.http.get(f"/v1/jobs/{job_id}/events").json()["items"]
    return collections.Counter(e["type"] for e in events)


def test_replicas_share_the_work_and_survive_each_other(replicated: Platform) -> None:
    assert set(replicated.procs) >= {"status", "status-2", "intake-2", "placement-2"}
    # Both replicas of each consumer are pulling from the one durable (a pull lasts a
    # second and the next follows it: on a loaded machine one may be between the two
    # at a given look, so look again for a while).
    deadline = time.monotonic() + 15
    pulls = asyncio.run(waiting_pulls(replicated))
    while not all(n >= 2 for n in pulls.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        pulls = asyncio.run(waiting_pulls(replicated))
    assert all(n >= 2 for n in pulls.values()), pulls

    api = Api(replicated.url, replicated.token)
    first = [api.submit(job(f"rep-{i}")) for i in range(16)]
    for job_id in first:
        assert api.wait(job_id, timeout=120)["state"] == "SUCCEEDED"
    for job_id in first:
        seen = settle_history(api, job_id)
        for kind in ("JobSubmitted", "JobAccepted", "JobPlaced", "JobFinished"):
            assert seen[kind] == 1, (job_id, seen)

    # One replica of each replicated service dies: the others take all the work (the
    # gateway sends a request that may be repeated on to the next replica).
    for name in ("intake-2", "validation-2", "status-2"):
        replicated.kill_service(name)
    later = []
    for i in range(8):
        answer = api.http.post(
            "/v1/jobs", json=job(f"rep-late-{i}"), headers={"Idempotency-Key": f"late-{i}"}
        )
        assert answer.status_code == 202, answer.text
        later.append(answer.json()["id"])
    for job_id in later:
        assert api.wait(job_id, timeout=120)["state"] == "SUCCEEDED"


def test_replica_counts_are_checked() -> None:
    assert parse_replicas("status=2, intake=3") == {"status": 2, "intake": 3}
    for bad, message in [
        ("launcher=2", "cannot run as replicas"),
        ("gateway=2", "cannot run as replicas"),
        ("status=0", "must be 1 to 8"),
        ("status=x", "must be 1 to 8"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_replicas(bad)
    config = PlatformConfig(Path("/nonexistent"), replicas={"status": 3})
    assert [i for i in config.instances() if i.startswith("status")] == [
        "status",
        "status-2",
        "status-3",
    ]
