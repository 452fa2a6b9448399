"""Pause, resume, restart and scale through the whole platform: a paused job's tasks end
and its capacity goes to the next job in line; a resumed or restarted job runs as its
next attempt without spending a retry; a T9k job submitted paused waits for a resume; an
elastic job restarts at its new size."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .conftest import Api, start_platform, unique

pytestmark = pytest.mark.e2e

T9K = "/apis/batch.tensorstack.dev/v1beta1/namespaces/team-a"


@pytest.fixture(scope="module")
def control_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    platform = start_platform(
        tmp_path_factory.mktemp("control-platform"),
        extra_env={"YARD_RETRY_BACKOFF_S": "0.2", "YARD_LAUNCHER_KILL_GRACE_S": "2"},
    )
    yield Api(platform.url, platform.token)
    platform.stop()


def openpai(name: str, command: str, retries: int = 0, gpus: int = 2) -> dict[str, Any]:
    # Two GPUs: the whole of the one GPU node, so two such jobs cannot run at once.
    return {
        "jobName": unique(name),
        "image": "x",
        "retryCount": retries,
        "taskRoles": [
            {
                "name": "w",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": gpus,
                "command": command,
            }
        ],
    }


def post(api: Api, path: str, **kwargs: Any) -> Any:
    answer = api.http.post(path, **kwargs)
    assert answer.status_code == 202, answer.text
    return answer.json()


def history(api: Api, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [h["event"] for h in api.events(job_id) if h["type"] == kind]


def tasks_of(view: dict[str, Any], attempt: int) -> list[tuple[str, int, str]]:
    return sorted(
        (t["role"], t["index"], t["state"]) for t in view["tasks"] if t["attempt"] == attempt
    )


def test_a_paused_job_frees_its_capacity_and_its_resume_spends_no_retry(control_api: Api) -> None:
    api = control_api
    # One retry allowed: attempt 1 runs until paused, the resumed attempt 2 fails and
    # is still retried (the pause spent nothing), attempt 3 succeeds.
    first = api.submit(
        openpai(
            "paused",
            'case "$TRAINYARD_ATTEMPT" in 1) sleep 300;; 2) exit 3;; *) echo done;; esac',
            retries=1,
        )
    )
    api.wait(first, {"RUNNING"})
    second = api.submit(openpai("waiting", "sleep 300"))
    assert "GPU" in " ".join(api.wait(second, {"QUEUED"})["queue_reasons"])

    assert post(api, f"/v1/jobs/{first}/pause") == {"id": first, "pause": "requested"}
    view = api.wait(first, {"PAUSED"})
    assert view["attempt"] == 1 and view["reason"] == "paused by admin"
    # The freed GPUs go to the job that waited for them.
    api.wait(second, {"RUNNING"})
    view = api.job(first)
    assert view["state"] == "PAUSED" and tasks_of(view, 1) == [("w", 0, "STOPPED")], view
    [interrupted] = history(api, first, "JobInterrupted")
    assert (interrupted["attempt"], interrupted["cause"]) == (1, "paused")
    assert history(api, first, "JobFinished") == []

    api.stop(second)
    api.wait(second)
    assert post(api, f"/v1/jobs/{first}/resume") == {"id": first, "resume": "requested"}
    view = api.wait(first, timeout=90)
    assert (view["state"], view["attempt"], view["retries"]) == ("SUCCEEDED", 3, 1), view
    placed = [(p["attempt"], p["retries_used"]) for p in history(api, first, "JobPlaced")]
    assert placed == [(1, 0), (2, 0), (3, 1)]
    retrying = history(api, first, "JobRetrying")
    assert [(r["previous_attempt"], r["attempt"]) for r in retrying] == [(2, 3)]
    assert [(a["attempt"], a.get("interrupted")) for a in view["attempts"]] == [
        (1, "paused"),
        (2, None),
        (3, None),
    ]


def test_a_queued_job_is_paused_where_it_waits_and_runs_after_a_resume(control_api: Api) -> None:
    api = control_api
    holder = api.submit(openpai("holder", "sleep 300"))
    api.wait(holder, {"RUNNING"})
    # No retries asked for: a resume still runs it.
    waiting = api.submit(openpai("queued", "echo ran"))
    api.wait(waiting, {"QUEUED"})
    post(api, f"/v1/jobs/{waiting}/pause")
    view = api.wait(waiting, {"PAUSED"})
    assert view["tasks"] == [] and view["queue_reasons"] == []
    queue = api.http.get("/v1/placement/queue").json()["jobs"]
    assert waiting not in {row["job_id"] for row in queue}
    # Capacity coming back does not start a paused job.
    api.stop(holder)
    api.wait(holder)
    time.sleep(1.0)
    assert api.job(waiting)["state"] == "PAUSED"
    post(api, f"/v1/jobs/{waiting}/resume")
    view = api.wait(waiting)
    assert (view["state"], view["attempt"], view["retries"]) == ("SUCCEEDED", 2, 0), view


def test_a_restarted_job_runs_its_next_attempt_without_spending_a_retry(control_api: Api) -> None:
    api = control_api
    # No retries allowed: only a restart that spends none can run attempt 2.
    job = api.submit(
        openpai("restarted", 'echo "attempt $TRAINYARD_ATTEMPT"; sleep 300', retries=0, gpus=0)
    )
    view = api.wait(job, {"RUNNING"})
    assert view["attempt"] == 1
    answer = post(api, f"/v1/jobs/{job}/restart", json={"reason": "new data"})
    assert answer == {"id": job, "restart": "requested"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = api.job(job)
        if view["attempt"] == 2 and tasks_of(view, 2) == [("w", 0, "RUNNING")]:
            break
        time.sleep(0.2)
    assert (view["state"], view["attempt"], view["retries"]) == ("RUNNING", 2, 0), view
    assert tasks_of(view, 1) == [("w", 0, "STOPPED")]
    assert [(a["attempt"], a["interrupted"], a["reason"]) for a in view["attempts"]] == [
        (1, "restarted", "new data")
    ]
    [interrupted] = history(api, job, "JobInterrupted")
    assert (interrupted["attempt"], interrupted["cause"]) == (1, "restarted")
    placed = [(p["attempt"], p["retries_used"]) for p in history(api, job, "JobPlaced")]
    assert placed == [(1, 0), (2, 0)]
    assert history(api, job, "JobFinished") == [] and history(api, job, "JobRetrying") == []
    [command] = history(api, job, "RestartJob")
    assert command["requested_by"] == "admin"
    # The OpenPAI view counts no retry either.
    pai = api.http.get(f"/api/v2/jobs/admin~{view['name']}").json()["jobStatus"]
    assert (pai["retries"], pai["attemptId"]) == (0, 1), pai
    # The task that runs is attempt 2's own (its log is served for the current attempt).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        logs = api.http.get(f"/v1/jobs/{job}/logs", params={"role": "w", "index": 0})
        if "attempt 2" in logs.text:
            break
        time.sleep(0.2)
    assert "attempt 2" in logs.text, logs.text
    api.stop(job)
    assert api.wait(job)["state"] == "STOPPED"


def test_pause_and_resume_answer_404_for_a_job_that_is_not_yours(control_api: Api) -> None:
    api = control_api
    bob = api.as_token(api.http.post("/v1/tokens", json={"user": "bob"}).json()["token"])
    job = api.submit(openpai("mine", "sleep 300", gpus=0))
    for action in ("pause", "resume", "restart"):
        assert bob.http.post(f"/v1/jobs/{job}/{action}").status_code == 404
        assert api.http.post(f"/v1/jobs/{uuid.uuid4().hex}/{action}").status_code == 404
    assert (
        bob.http.post(
            f"/v1/placement/jobs/{job}/scale", json={"role": "w", "replicas": 1}
        ).status_code
        == 404
    )
    api.stop(job)
    api.wait(job)


def t9k_job(
    kind: str, name: str, command: list[str], replicas: int = 1, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {
            **spec,
            "replicaSpecs": [
                {
                    "type": "worker",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "python:3.11",
                                    "command": command,
                                    "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                                }
                            ]
                        }
                    },
                }
            ],
        },
    }


def create(api: Api, plural: str, payload: dict[str, Any]) -> str:
    answer = api.http.post(
        f"{T9K}/{plural}",
        content=yaml.safe_dump(payload),
        headers={"Content-Type": "application/yaml"},
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["metadata"]["uid"]


def phase(api: Api, plural: str, name: str) -> dict[str, Any]:
    answer = api.http.get(f"{T9K}/{plural}/{name}")
    assert answer.status_code == 200, answer.text
    return answer.json()["status"]


def test_a_t9k_job_submitted_paused_runs_only_after_a_resume(control_api: Api) -> None:
    api = control_api
    name = unique("paused-t9k")
    job = create(
        api,
        "genericjobs",
        t9k_job(
            "GenericJob",
            name,
            ["python3", "-c", "print('resumed')"],
            runMode={"pause": {"enabled": True}},
        ),
    )
    view = api.wait(job, {"PAUSED"})
    assert view["attempt"] == 1 and view["tasks"] == []
    status = phase(api, "genericjobs", name)
    assert status["phase"] == "Paused"
    assert any(c["type"] == "Paused" and c["status"] == "True" for c in status["conditions"])
    assert history(api, job, "JobPlaced") == []
    post(api, f"/v1/jobs/{job}/resume")
    view = api.wait(job)
    assert (view["state"], view["attempt"]) == ("SUCCEEDED", 2), view
    assert phase(api, "genericjobs", name)["phase"] == "Succeeded"


def test_an_elastic_job_scales_to_a_new_size_within_its_bounds(control_api: Api) -> None:
    api = control_api
    name = unique("elastic")
    job = create(
        api,
        "pytorchtrainingjobs",
        t9k_job(
            "PyTorchTrainingJob",
            name,
            ["sleep", "300"],
            elastic={"enabled": True, "minReplicas": 1, "maxReplicas": 2, "expectedReplicas": 1},
        ),
    )
    view = api.wait(job, {"RUNNING"})
    assert tasks_of(view, 1) == [("worker", 0, "RUNNING")]

    scale = f"/v1/placement/jobs/{job}/scale"
    for body, field in (
        ({"role": "worker", "replicas": 3}, "replicas"),
        ({"role": "worker", "replicas": 0}, "replicas"),
        ({"role": "ps", "replicas": 2}, "role"),
    ):
        answer = api.http.post(scale, json=body)
        assert answer.status_code == 400, answer.text
        detail = answer.json()["detail"]
        assert detail["errors"][0]["path"] == field and detail["message"].startswith(f"{field}:")
    assert (
        api.http.post(
            f"/v1/placement/jobs/{uuid.uuid4().hex}/scale", json={"role": "worker", "replicas": 2}
        ).status_code
        == 404
    )

    assert post(api, scale, json={"role": "worker", "replicas": 2})["replicas"] == 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = api.job(job)
        if tasks_of(view, 2) == [("worker", 0, "RUNNING"), ("worker", 1, "RUNNING")]:
            break
        time.sleep(0.2)
    assert tasks_of(view, 2) == [("worker", 0, "RUNNING"), ("worker", 1, "RUNNING")], view
    assert view["state"] == "RUNNING" and view["retries"] == 0
    assert tasks_of(view, 1) == [("worker", 0, "STOPPED")]
    [interrupted] = history(api, job, "JobInterrupted")
    assert (interrupted["attempt"], interrupted["cause"]) == (1, "scaled")
    # The T9k view shows the new size.
    replicas = phase(api, "pytorchtrainingjobs", name)["tasks"][0]["replicas"]
    assert [r["index"] for r in replicas] == [0, 1]
    api.stop(job)
    assert api.wait(job)["state"] == "STOPPED"
