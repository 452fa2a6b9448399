"""A job without gang placement (OpenPAI ``extras.gangAllocation: false``) through the
whole platform: on a cluster with room for two of its three tasks it starts with two,
and its third is placed, launched and run once one of them ends, as OpenPAI places such
a job's pods one by one. The same job as a gang could never start here: refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Api, start_platform, unique

pytestmark = pytest.mark.e2e

# One node with two GPUs: two one-GPU tasks at a time.
CLUSTER = {
    "nodes": [{"name": "n1", "cpu": 8, "memory_mb": 16384, "gpus": 2, "gpu_type": "TITANX"}],
    "queues": ["default"],
}


@pytest.fixture(scope="module")
def small_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    platform = start_platform(tmp_path_factory.mktemp("partial"), cluster=CLUSTER)
    yield Api(platform.url, platform.token)
    platform.stop()


def v2_job(name: str, gang: bool | None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "protocolVersion": 2,
        "name": name,
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
        "taskRoles": {
            "worker": {
                "instances": 3,
                "dockerImage": "img",
                "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 1},
                # The first two tasks run a while; the third only once a GPU frees.
                "commands": ["sleep $((3 - PAI_TASK_INDEX)); echo task $PAI_TASK_INDEX done"],
            }
        },
    }
    if gang is not None:
        job["extras"] = {"gangAllocation": gang}
    return job


def test_tasks_are_placed_one_by_one_as_gpus_free(small_api: Api) -> None:
    job_id = small_api.submit(v2_job(unique("ungang"), gang=False))
    deadline = time.monotonic() + 30
    view = small_api.seen(job_id)
    while view["state"] not in ("RUNNING", "SUCCEEDED", "FAILED") and time.monotonic() < deadline:
        time.sleep(0.1)
        view = small_api.job(job_id)
    placed = [h["event"] for h in small_api.events(job_id) if h["type"] == "JobPlaced"]
    assert [len(e["tasks"]) for e in placed] == [2], placed
    assert placed[0]["spec"]["roles"][0]["replicas"] == 3
    view = small_api.wait(job_id, timeout=90)
    # Seen in full runs: FAILED, a task's port drawn in the kernel's ephemeral range
    # held by a connection (the default range is below it since). Say why if it comes back.
    history = [(h["type"], h["event"].get("reason") or h["event"].get("error"))
               for h in small_api.events(job_id)]  # fmt: skip
    assert view["state"] == "SUCCEEDED", (view, history)
    tasks = sorted((t["index"], t["state"]) for t in view["tasks"])
    assert tasks == [(0, "SUCCEEDED"), (1, "SUCCEEDED"), (2, "SUCCEEDED")], view["tasks"]
    # Task 1 ended first (it sleeps least) and gave its GPU back at once, while the job
    # went on: task 2 was placed there. TasksPlaced lists what the attempt holds then.
    more = [h["event"] for h in small_api.events(job_id) if h["type"] == "TasksPlaced"]
    assert [sorted(t["index"] for t in e["tasks"]) for e in more] == [[0, 2]], more
    gpus = {t["index"]: t["gpu_indices"] for t in view["tasks"]}
    assert gpus[2] == gpus[1] and gpus[0] != gpus[1], gpus
    ended = {t["index"]: t["ended_at"] for t in view["tasks"]}
    started = {t["index"]: t["started_at"] for t in view["tasks"]}
    assert ended[1] <= started[2] < ended[0], (started, ended)


def test_the_same_job_as_a_gang_is_refused_at_once(small_api: Api) -> None:
    answer = small_api.http.post("/v1/jobs", json=v2_job(unique("gang"), gang=None))
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["state"] == "REJECTED", body
    assert any(e["code"] == "never_fits" for e in body["errors"]), body
