"""A create is answered once status shows the job (bounded), as tictl and the Tencent
Cloud SDK, PAI-DLC's SDK and OpenPAI's clients expect when they read the job they just
made: intake's app with a collecting publisher and a recording ``settled``."""

from __future__ import annotations

import httpx
import pytest

from trainyard_common.auth import TokenStore
from trainyard_common.events import Event, JobSubmitted
from trainyard_intake.adapters.owners import InMemoryOwnerRegistry
from trainyard_intake.app import create_app
from trainyard_intake.dialect_api.ti import absent
from trainyard_intake.handlers import Deps

ADMIN = "ti-settle-admin-token"


TI_JOB = {"name": "made", "cluster": "default", "command": ["true"], "workerType": "1U1G0P"}
DLC_JOB = {
    "DisplayName": "made", "JobType": "TFJob", "UserCommand": "true",
    "JobSpecs": [{"Type": "Worker", "Image": "tensorflow:1.12", "PodCount": 1,
                  "EcsSpec": "ecs.c6.large"}],
}  # fmt: skip
OPENPAI_V2 = """protocolVersion: 2
name: made
type: job
prerequisites:
  - {type: dockerimage, uri: ubuntu, name: image}
taskRoles:
  main:
    instances: 1
    dockerImage: image
    resourcePerInstance: {cpu: 1, memoryMB: 512, gpu: 0}
    commands: ["true"]
"""
OPENPAI_V1 = {"jobName": "made", "image": "ubuntu",
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                             "memoryMB": 512, "gpuNumber": 0, "command": "true"}]}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/ti/v1/jobs", {"json": TI_JOB}),  # tictl's create, as the Tencent SDK's
        ("/api/v1/jobs", {"json": DLC_JOB}),  # PAI-DLC CreateJob (a bearer token here)
        ("/api/v2/jobs", {"content": OPENPAI_V2, "headers": {"Content-Type": "text/yaml"}}),
        ("/api/v1/user/admin/jobs", {"json": OPENPAI_V1}),
    ],
    ids=["ti", "dlc", "openpai-v2", "openpai-v1"],
)
async def test_every_create_waits_until_status_has_the_job(path: str, body: dict) -> None:
    # DLC's and OpenPAI's answered at once: a GetJob right after CreateJob was a 404
    # (JobNotFound, NoJobError) until status had read the bus.
    steps: list[tuple[str, int]] = []

    async def publish(event: Event) -> int:
        steps.append((type(event).__name__, 41))
        return 41

    async def settled(seq: int) -> bool:
        steps.append(("settled", seq))
        return True

    deps = Deps(publish=publish, owners=InMemoryOwnerRegistry(), settled=settled)
    app = create_app(deps, TokenStore(None, ADMIN))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://intake",
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as client:
        answer = await client.post(path, **body)
    assert answer.status_code in (200, 201, 202), answer.text
    assert steps == [(JobSubmitted.__name__, 41), ("settled", 41)]


def test_a_field_is_absent_only_when_left_out_on_the_way_to_it() -> None:
    body = {"Name": "", "Roles": [{"Command": []}], "Gone": None}
    assert not absent(body, "$.Name") and not absent(body, "$.Roles[0].Command")
    assert absent(body, "$.Cluster") and absent(body, "$.Roles[1].Command")
    assert absent(body, "$.Roles[0].Image") and absent(body, "$.Name.X") and absent(body, "$.Gone")


async def test_a_ti_create_reads_its_body_as_every_body_is_read() -> None:
    # FastAPI's own reading took any size and depth, and a lone surrogate made the
    # answer (or its 400) a 500.
    published: list[Event] = []

    async def publish(event: Event) -> int:
        published.append(event)
        return 1

    deps = Deps(publish=publish, owners=InMemoryOwnerRegistry())
    app = create_app(deps, TokenStore(None, ADMIN))
    job = '{"name":"t","cluster":"default","command":["true"],"workerType":"1U1G0P",'
    bodies = {
        job + '"x":"\\ud800"}': 400,  # a lone surrogate
        job + '"x":' + "[" * 300 + "]" * 300 + "}": 400,  # nested past the bound
        job + '"x":"' + "a" * (2 * 1024 * 1024) + '"}': 413,
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://intake",
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
    ) as client:
        for body, status in bodies.items():
            answer = await client.post("/ti/v1/jobs", content=body)
            assert answer.status_code == status, (status, answer.text[:200])
            assert answer.json()["detail"]["message"]
    assert published == []
