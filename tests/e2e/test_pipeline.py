"""One real job at a time through all five services, as a user sees it."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..seeds import seed_job
from .conftest import Api

pytestmark = pytest.mark.e2e

# The seed's first example (openpai-scm-submit-job.md §2.3), verbatim.
HELLOWORLD = seed_job("helloworld_16be675e")


def two_role_job(name: str, out_dir: Path) -> dict[str, Any]:
    dump = (
        'env > "$OUT_DIR/$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX.env"'
    )
    return {
        "jobName": name,
        "image": "python:3.11",
        "taskRoles": [
            {
                "name": "main",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 256,
                "gpuNumber": 0,
                "command": f"{dump} && python3 -c 'print(sum(i * i for i in range(10**5)))'",
                "portList": [{"label": "http", "beginAt": 0, "portNumber": 2}],
            },
            {
                "name": "worker",
                "taskNumber": 2,
                "cpuNumber": 1,
                "memoryMB": 256,
                "gpuNumber": 0,
                "command": f"{dump} && echo worker $PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX done",
                "minSucceededTaskCount": None,
            },
        ],
        "jobEnvs": {"OUT_DIR": str(out_dir), "PAI_JOB_NAME": "must-not-override"},
    }


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_two_role_cpu_job_succeeds_and_tasks_see_their_pai_environment(
    api: Api, out_dir: Path
) -> None:
    job_id = api.submit(two_role_job("two-roles", out_dir))
    view = api.wait(job_id)
    assert view["state"] == "SUCCEEDED", view
    tasks = {(t["role"], t["index"]): t for t in view["tasks"]}
    assert set(tasks) == {("main", 0), ("worker", 0), ("worker", 1)}
    assert all(t["state"] == "SUCCEEDED" and t["exit_code"] == 0 for t in tasks.values())

    env = read_env(out_dir / "main-0.env")
    assert env["PAI_JOB_NAME"] == "two-roles"  # jobEnvs cannot replace it
    assert env["PAI_USER_NAME"] == "admin"
    assert env["PAI_TASK_ROLE_COUNT"] == "2"
    assert env["PAI_TASK_ROLE_LIST"] == "main,worker"
    assert env["PAI_TASK_ROLE_TASK_COUNT_main"] == "1"
    assert env["PAI_TASK_ROLE_TASK_COUNT_worker"] == "2"
    assert env["PAI_CURRENT_TASK_ROLE_NAME"] == "main"
    assert env["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == "0"
    assert env["PAI_RESOURCE_main"] == "0,1,256,64"
    assert env["PAI_MIN_FAILED_TASK_COUNT_main"] == "1"
    assert env["PAI_MIN_SUCCEEDED_TASK_COUNT_worker"] == ""
    assert env["OUT_DIR"] == str(out_dir)
    assert env["TRAINYARD_JOB_ID"] == job_id and env["TRAINYARD_ATTEMPT"] == "1"
    ports = [
        p
        for group in tasks[("main", 0)]["ports"]
        if group["label"] == "http"
        for p in group["ports"]
    ]
    assert len(ports) == 2
    assert env["PAI_PORT_LIST_main_0_http"] == ",".join(map(str, ports))
    assert env["PAI_CONTAINER_HOST_http_PORT_LIST"] == ",".join(map(str, ports))
    for index in (0, 1):
        worker = read_env(out_dir / f"worker-{index}.env")
        assert worker["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == str(index)
        assert worker["PAI_HOST_IP_main_0"] == tasks[("main", 0)]["host_ip"]
        assert worker["PAI_HOST_IP_worker_1"] == tasks[("worker", 1)]["host_ip"]

    logs = api.http.get(f"/v1/jobs/{job_id}/logs", params={"role": "worker", "index": 1})
    assert logs.status_code == 200 and logs.text.strip() == "worker 1 done"

    history = api.events(job_id)
    types = [h["type"] for h in history]
    assert types[:3] == ["JobSubmitted", "JobAccepted", "JobPlaced"] and types[-1] == "JobFinished"
    assert types.count("TaskStateChanged") == 9  # 3 tasks x STARTING, RUNNING, SUCCEEDED
    assert [h["seq"] for h in history] == sorted(h["seq"] for h in history)
    # One trace follows the job through every service.
    assert len({h["trace_id"] for h in history}) == 1 and history[0]["trace_id"]


def test_seed_helloworld_verbatim_ends_with_its_real_exit_code(api: Api) -> None:
    job_id = api.submit(copy.deepcopy(HELLOWORLD))
    view = api.wait(job_id)
    assert view["dialect"] == "openpai"
    task = view["tasks"][0]
    assert task["node"] == "node-gpu" and len(task["gpu_indices"]) == 1
    # No nvidia-smi on this machine: the command fails, it does not hang.
    assert task["state"] == "FAILED" and task["exit_code"] == 127
    assert "command not found" in task["reason"]
    # minFailedTaskCount is null: OpenPAI says the job succeeds regardless of task failures.
    assert view["state"] == "SUCCEEDED", view
    assert view["reason"]


def test_seed_helloworld_with_default_min_failed_fails(api: Api) -> None:
    payload = copy.deepcopy(HELLOWORLD)
    del payload["taskRoles"][0]["minFailedTaskCount"]  # absent: OpenPAI's default of 1
    payload["jobName"] = "helloworld-strict"
    view = api.wait(api.submit(payload))
    assert view["state"] == "FAILED" and view["exit_code"] == 127
    assert "command not found" in view["reason"] or "task_1" in view["reason"]


def test_a_job_breaking_a_rule_is_rejected_with_the_field_named(api: Api) -> None:
    payload = copy.deepcopy(HELLOWORLD)
    payload["jobName"] = "bad name!"
    payload["taskRoles"][0]["memoryMB"] = 50
    view = api.wait(api.submit(payload))
    assert view["state"] == "REJECTED"
    paths = {e["path"] for e in view["errors"]}
    assert {"$.jobName", "$.taskRoles[0].memoryMB"} <= paths, view["errors"]
    assert view["tasks"] == []


def test_stop_ends_a_running_job_and_its_processes(api: Api, out_dir: Path) -> None:
    marker = f"sleep 313.{out_dir.name[-4:].encode().hex()}"
    payload = {
        "jobName": "sleeper",
        "image": "x",
        "taskRoles": [
            {
                "name": "w",
                "taskNumber": 2,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": f"bash -c 'exec -a \"{marker}\" sleep 313'",
            }
        ],
    }
    job_id = api.submit(payload)
    api.wait(job_id, {"RUNNING"})
    api.stop(job_id)
    view = api.wait(job_id)
    assert view["state"] == "STOPPED"
    assert {t["state"] for t in view["tasks"]} == {"STOPPED"}
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == "", "a stopped job's process survived"


def test_capacity_returns_when_a_job_ends(api: Api) -> None:
    hog = {
        "jobName": "gpu-hog",
        "image": "x",
        "gpuType": "TITANX",
        "taskRoles": [
            {
                "name": "t",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 2,
                "command": "sleep 120",
            }
        ],
    }
    waiter = {
        "jobName": "gpu-waiter",
        "image": "x",
        "taskRoles": [
            {
                "name": "t",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 1,
                "command": "true",
            }
        ],
    }
    hog_id = api.submit(hog)
    api.wait(hog_id, {"RUNNING"})
    waiter_id = api.submit(waiter)
    queued = api.wait(waiter_id, {"QUEUED"})
    assert queued["queue_reasons"] and "GPU" in " ".join(queued["queue_reasons"]), queued
    api.stop(hog_id)
    assert api.wait(hog_id)["state"] == "STOPPED"
    assert api.wait(waiter_id)["state"] == "SUCCEEDED"


def test_users_see_only_their_own_jobs(api: Api) -> None:
    answer = api.http.post("/v1/tokens", json={"user": "alice"})
    assert answer.status_code == 201, answer.text
    alice = api.as_token(answer.json()["token"])
    mine = alice.submit(
        {
            "jobName": "alices",
            "image": "x",
            "taskRoles": [
                {
                    "name": "t",
                    "taskNumber": 1,
                    "cpuNumber": 1,
                    "memoryMB": 128,
                    "gpuNumber": 0,
                    "command": "echo $PAI_USER_NAME",
                }
            ],
        }
    )
    theirs = api.submit(
        {
            "jobName": "admins",
            "image": "x",
            "taskRoles": [
                {
                    "name": "t",
                    "taskNumber": 1,
                    "cpuNumber": 1,
                    "memoryMB": 128,
                    "gpuNumber": 0,
                    "command": "true",
                }
            ],
        }
    )
    assert alice.wait(mine)["user"] == "alice"
    listed = alice.http.get("/v1/jobs").json()
    assert {j["user"] for j in listed["items"]} == {"alice"}
    assert alice.http.get(f"/v1/jobs/{theirs}").status_code == 404
    assert alice.http.post(f"/v1/jobs/{theirs}/stop").status_code == 404
    assert alice.http.post("/v1/tokens", json={"user": "mallory", "admin": True}).status_code == 403
    logs = alice.http.get(f"/v1/jobs/{mine}/logs")
    assert logs.status_code == 200 and logs.text.strip() == "alice"
    assert api.http.get("/v1/jobs", params={"user": "alice"}).json()["total"] >= 1
    assert alice.as_token("not-a-token").http.get("/v1/jobs").status_code == 401


def test_garbage_is_refused_at_the_door(api: Api) -> None:
    assert (
        api.http.post(
            "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    answer = api.http.post("/v1/jobs", json={"hello": "world"})
    assert answer.status_code == 400 and "openpai" in answer.text.lower()


def test_a_native_jobspec_in_yaml_runs(api: Api) -> None:
    spec = {
        "name": "native-yaml",
        "kind": "generic",
        "env": [{"name": "GREETING", "value": "hi"}],
        "roles": [
            {
                "name": "solo",
                "replicas": 2,
                "command": "echo $GREETING $TRAINYARD_INDEX",
                "resources": {"cpu": 1, "memory_mb": 128},
            }
        ],
    }
    answer = api.http.post(
        "/v1/jobs",
        content=yaml.safe_dump(spec).encode(),
        headers={"content-type": "application/yaml"},
    )
    assert answer.status_code == 202, answer.text
    assert answer.json()["dialect"] == "native"
    view = api.wait(answer.json()["id"])
    assert view["state"] == "SUCCEEDED" and view["spec"]["roles"][0]["replicas"] == 2
    logs = api.http.get(f"/v1/jobs/{view['id']}/logs", params={"role": "solo", "index": 1})
    assert logs.text.strip() == "hi 1"


def test_a_retried_submission_with_the_same_idempotency_key_is_one_job(api: Api) -> None:
    payload = {
        "jobName": "idempotent",
        "image": "x",
        "taskRoles": [
            {
                "name": "t",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": "true",
            }
        ],
    }
    first = api.http.post("/v1/jobs", json=payload, headers={"Idempotency-Key": "retry-1"})
    second = api.http.post("/v1/jobs", json=payload, headers={"Idempotency-Key": "retry-1"})
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    view = api.wait(first.json()["id"])
    assert view["state"] == "SUCCEEDED"  # not rejected as a duplicate name: it is the same job
    assert [h["type"] for h in api.events(view["id"])].count("JobSubmitted") == 1


def test_validate_is_a_dry_run_with_every_problem_and_its_path(api: Api) -> None:
    good = api.http.post(
        "/v1/jobs:validate", json=copy.deepcopy(HELLOWORLD) | {"jobName": "dry-run-ok"}
    )
    assert good.status_code == 200, good.text
    assert (
        good.json()["valid"]
        and good.json()["spec"]["roles"][0]["resources"]["gpu_type"] == "TITANX"
    )
    bad = copy.deepcopy(HELLOWORLD)
    bad["taskRoles"][0]["memoryMB"] = 50
    bad["gpuType"] = "H100"
    answer = api.http.post("/v1/jobs:validate", json=bad).json()
    assert not answer["valid"]
    assert "$.taskRoles[0].memoryMB" in {e["path"] for e in answer["errors"]}
    # Nothing was submitted: the name is still free, and no job carries it.
    assert api.http.post(
        "/v1/jobs:validate", json=copy.deepcopy(HELLOWORLD) | {"jobName": "dry-run-ok"}
    ).json()["valid"]
    names = {j["name"] for j in api.http.get("/v1/jobs", params={"limit": 500}).json()["items"]}
    assert "dry-run-ok" not in names
    unknown = api.http.post("/v1/jobs:validate", json={"hello": "world"})
    assert unknown.status_code == 400 and "tried" in unknown.text
