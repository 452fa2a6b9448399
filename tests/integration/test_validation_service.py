"""The validation service against real servers: the Mongo name registry on FerretDB,
and ``python -m trainyard_validation`` as its own process, fed JobSubmitted events over
JetStream and answering with JobAccepted / JobRejected."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from trainyard_common.bus import Bus
from trainyard_common.dialects import translate
from trainyard_common.events import (
    Event,
    JobAccepted,
    JobRejected,
    JobSubmitted,
    decode,
    derived_id,
    new_id,
)
from trainyard_common.storage import Client
from trainyard_common.subjects import STREAM
from trainyard_stack.components import free_port
from trainyard_validation.adapters.names import DocNameRegistry

from ..seeds import seed_job

HELLOWORLD: dict[str, Any] = seed_job("helloworld_16be675e")

CLUSTER = {
    "nodes": [
        {"name": "gpu1", "cpu": 32, "memory_mb": 100000, "gpus": 2, "gpu_type": "TITANX"},
        {"name": "cpu1", "cpu": 16, "memory_mb": 32000},
    ],
    "queues": ["default"],
}


# ---------------------------------------------------------------------- name registry


@pytest.fixture
async def registry(doc_client: Client, db_prefix: str) -> DocNameRegistry:
    return DocNameRegistry(doc_client[f"{db_prefix}_validation"])


async def test_claim_is_idempotent_per_job(registry: DocNameRegistry) -> None:
    assert await registry.claim("alice", "train", "job1")
    assert await registry.claim("alice", "train", "job1")  # redelivery of the same job
    assert not await registry.claim("alice", "train", "job2")
    assert await registry.claim("bob", "train", "job3")  # unique per user
    assert await registry.claim("alice", "train.v2", "job4")


async def test_concurrent_claims_have_one_winner(registry: DocNameRegistry) -> None:
    results = await asyncio.gather(*(registry.claim("carol", "race", f"job{i}") for i in range(10)))
    assert sum(results) == 1


async def test_claim_document_shape(
    doc_client: Client, db_prefix: str, registry: DocNameRegistry
) -> None:
    await registry.claim("dave", "exp~1", "job9")
    doc = await doc_client[f"{db_prefix}_validation"]["names"].find_one({"_id": "dave~exp~1"})
    assert doc is not None
    assert (doc["user"], doc["name"], doc["job_id"]) == ("dave", "exp~1", "job9")


# ----------------------------------------------------------------------- the service


@pytest.fixture
def service(nats_url: str, mongo_url: str, db_prefix: str, tmp_path: Path) -> Iterator[str]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("YARD_TOKEN", "NATS_URL", "MONGO_URL")}
    env.update(
        YARD_NATS_URL=nats_url,
        YARD_MONGO_URL=mongo_url,
        YARD_DB_PREFIX=db_prefix,
        YARD_VALIDATION_PORT=str(port),
        YARD_CLUSTER=str(cluster),
        YARD_DATA_DIR=str(tmp_path / "data"),
        YARD_LOG_LEVEL="WARNING",
    )
    log = (tmp_path / "validation.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainyard_validation"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "validation.log").read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "validation did not become healthy"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "validation.log").read_text()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_url, name="test-validation")
    yield bus
    await bus.close()


def submission(payload: dict[str, Any], user: str) -> JobSubmitted:
    t = translate(payload, user=user)
    return JobSubmitted(
        job_id=new_id(),
        spec=t.spec,
        dialect=t.dialect,
        dialect_key=t.key,
        original=payload,
        translation_errors=t.errors,
        warnings=t.warnings,
    )


async def answers(bus: Bus, job_id: str, count: int = 1, timeout: float = 30.0) -> list[Event]:
    """The first ``count`` validation results of a job, read with an ephemeral consumer
    (of every job's: subjects do not name the job)."""
    sub = await bus.js.pull_subscribe("yard.job.*", stream=STREAM)
    found: list[Event] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(10, timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
                event = decode(msg.data)
                if isinstance(event, JobAccepted | JobRejected) and event.job_id == job_id:
                    found.append(event)
            if len(found) >= count:
                return found
    finally:
        await sub.unsubscribe()
    raise AssertionError(f"{len(found)} of {count} results for {job_id} within {timeout}s")


async def answer(bus: Bus, job_id: str) -> Event:
    return (await answers(bus, job_id))[0]


async def test_service_accepts_rejects_and_guards_names(service: str, bus: Bus) -> None:
    user = "alice" + uuid.uuid4().hex[:6]
    good = submission(HELLOWORLD, user)
    too_small = submission(
        {
            **HELLOWORLD,
            "jobName": "small",
            "taskRoles": [{**HELLOWORLD["taskRoles"][0], "memoryMB": 50}],
        },
        user,
    )
    wrong_gpu = submission({**HELLOWORLD, "jobName": "v100", "gpuType": "V100"}, user)
    same_name = submission(HELLOWORLD, user)
    for event in (good, too_small, wrong_gpu):
        await bus.publish(event)

    accepted = await answer(bus, good.job_id)
    assert isinstance(accepted, JobAccepted), accepted
    assert accepted.event_id == derived_id(good.event_id, "validated")
    assert accepted.spec.name == "helloworld_16be675e" and accepted.spec.user == user
    assert accepted.spec.roles[0].resources.gpu_type == "TITANX"

    rejected = await answer(bus, too_small.job_id)
    assert isinstance(rejected, JobRejected)
    assert [e.path for e in rejected.errors] == ["$.taskRoles[0].memoryMB"]

    rejected = await answer(bus, wrong_gpu.job_id)
    assert isinstance(rejected, JobRejected)
    assert [e.path for e in rejected.errors] == ["$.gpuType"]
    assert "TITANX" in rejected.errors[0].message

    # published only after the first was answered, so the order is certain
    await bus.publish(same_name)
    taken = await answer(bus, same_name.job_id)
    assert isinstance(taken, JobRejected)
    assert [(e.path, e.code) for e in taken.errors] == [("$.jobName", "name_taken")]

    # The same job submitted again under a new event id (not a JetStream duplicate):
    # its own name claim lets it through again, answered under the new derived id.
    resent = good.model_copy(update={"event_id": new_id()})
    await bus.publish(resent)
    first, second = await answers(bus, good.job_id, count=2)
    assert isinstance(second, JobAccepted)
    assert second.event_id == derived_id(resent.event_id, "validated") != first.event_id
