"""OpenPAI end to end: protocol v2 YAML with parameters and secrets, and OpenPAI's own REST
API (submit, status, list, stop) on the whole platform."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ..seeds import seed_job
from .conftest import Api, unique

pytestmark = pytest.mark.e2e

SECRET = "s3cr3t-" + uuid.uuid4().hex[:12]


def openpai_status(
    api: Api, framework: str, states: set[str], timeout: float = 60.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        answer = api.http.get(f"/api/v2/jobs/{framework}")
        if answer.status_code == 200:
            last = answer.json()
            if last["jobStatus"]["state"] in states:
                return last
        else:
            last = answer.text
        time.sleep(0.2)
    raise AssertionError(f"{framework} not in {states} after {timeout}s: {last}")


def v2_job(name: str, out_dir: Path) -> str:
    return yaml.safe_dump(
        {
            "protocolVersion": 2,
            "name": name,
            "type": "job",
            "prerequisites": [{"name": "py", "type": "dockerimage", "uri": "python:3.11"}],
            "parameters": {"greeting": "hello-param"},
            "secrets": {"token": SECRET},
            "jobRetryCount": 0,
            "taskRoles": {
                "worker": {
                    "instances": 2,
                    "completion": {"minFailedInstances": 1, "minSucceededInstances": -1},
                    "dockerImage": "py",
                    "resourcePerInstance": {
                        "cpu": 1,
                        "memoryMB": 256,
                        "gpu": 0,
                        "ports": {"tb": 1},
                    },
                    "commands": [
                        f"cd {out_dir}",
                        'echo "<% $parameters.greeting %>" > param-$PAI_TASK_INDEX.txt',
                        'echo "<% $secrets.token %>" > secret-$PAI_TASK_INDEX.txt',
                        "env > worker-$PAI_TASK_INDEX.env",
                    ],
                },
            },
            "defaults": {"virtualCluster": "default"},
        },
        sort_keys=False,
    )


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_v2_yaml_is_read_as_openpais_js_yaml_reads_it(api: Api, out_dir: Path) -> None:
    """yes is a word to js-yaml (a boolean to YAML 1.1), 1e-4 a number: OpenPAI runs
    ``--amp yes --lr 0.0001``."""
    name = unique("v2-js-yaml")
    text = f"""\
protocolVersion: 2
name: {name}
type: job
parameters:
  amp: yes
  lr: 1e-4
prerequisites:
  - {{name: py, type: dockerimage, uri: python:3.11}}
taskRoles:
  worker:
    instances: 1
    dockerImage: py
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}
    commands:
      - echo "--amp <% $parameters.amp %> --lr <% $parameters.lr %>" > {out_dir}/{name}.txt
"""
    answer = api.http.post("/api/v2/jobs", content=text, headers={"Content-Type": "text/yaml"})
    assert answer.status_code == 202, answer.text
    status = openpai_status(api, f"admin~{name}", {"SUCCEEDED", "FAILED", "STOPPED"})
    assert status["jobStatus"]["state"] == "SUCCEEDED", status
    assert (out_dir / f"{name}.txt").read_text().strip() == "--amp yes --lr 0.0001"


def test_v2_yaml_job_runs_with_its_parameter_and_secret_never_shown(
    api: Api, out_dir: Path
) -> None:
    name = unique("v2-secret")
    answer = api.http.post(
        "/api/v2/jobs", content=v2_job(name, out_dir), headers={"Content-Type": "text/yaml"}
    )
    assert answer.status_code == 202, answer.text
    assert answer.json() == {
        "status": 202,
        "message": f"Update job {name} for user admin successfully.",
    }
    job_id = answer.headers["X-Trainyard-Job-Id"]

    status = openpai_status(api, f"admin~{name}", {"SUCCEEDED", "FAILED", "STOPPED"})
    assert status["jobStatus"]["state"] == "SUCCEEDED", status
    for index in (0, 1):
        assert (out_dir / f"param-{index}.txt").read_text().strip() == "hello-param"
        # Substituted at launch, inside the task.
        assert (out_dir / f"secret-{index}.txt").read_text().strip() == SECRET
    env = read_env(out_dir / "worker-1.env")
    assert env["PAI_TASK_ROLE_INSTANCES"] == "worker:0,worker:1"
    assert env["PAI_FRAMEWORK_NAME"] == f"admin~{name}"
    tasks = {t["taskIndex"]: t for t in status["taskRoles"]["worker"]["taskStatuses"]}
    ports = tasks[1]["containerPorts"]
    assert set(ports) == {"tb", "ssh", "http"}  # ssh and http added as OpenPAI does
    assert env["PAI_CONTAINER_SSH_PORT"] == ports["ssh"]
    assert env["PAI_CURRENT_CONTAINER_PORT"] == ports["http"] == env["PAI_CONTAINER_HOST_PORT"]
    assert env["PAI_worker_1_tb_PORT"] == ports["tb"] == env["PAI_PORT_LIST_worker_1_tb"]
    assert env["PAI_TASK_ROLE_worker_HOST_LIST"].count(":") == 2

    # No answer of any API holds the secret value.
    view = api.job(job_id)
    assert view["dialect"] == "openpai_v2"
    assert "<% $secrets.token %>" in view["spec"]["roles"][0]["command"]
    answers = [
        api.http.get(f"/v1/jobs/{job_id}"),
        api.http.get(f"/v1/jobs/{job_id}/events"),
        api.http.get("/v1/jobs", params={"limit": 500}),
        api.http.get(f"/api/v2/jobs/admin~{name}"),
        api.http.get("/api/v2/jobs"),
        api.http.get(f"/v1/jobs/{job_id}/logs", params={"role": "worker", "index": 0}),
    ]
    for reply in answers:
        assert reply.status_code == 200, reply.text
        assert SECRET not in reply.text, reply.request.url
    events = api.events(job_id)
    submitted = next(e["event"] for e in events if e["type"] == "JobSubmitted")
    assert submitted["original"]["secrets"] == {"token": "******"}
    config = api.http.get(f"/api/v2/jobs/admin~{name}/config").json()
    assert (
        config["secrets"] == {"token": "******"}
        and config["parameters"]["greeting"] == "hello-param"
    )
    assert submitted["spec"]["secrets"] == [{"name": "token", "value": "******"}]


def test_openpai_rest_flow_submit_status_list(api: Api) -> None:
    name = unique("rest-v1")
    payload = {
        "jobName": name,
        "image": "python:3.11",
        "taskRoles": [
            {
                "name": "main",
                "taskNumber": 2,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": "echo hi $PAI_TASK_ROLE_INDEX",
            }
        ],
    }
    answer = api.http.post("/api/v1/user/admin/jobs", json=payload)
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"message": f"update job {name} successfully"}
    assert answer.headers["Location"] == f"/api/v1/user/admin/jobs/{name}"

    status = openpai_status(api, f"admin~{name}", {"SUCCEEDED", "FAILED", "STOPPED"})
    js = status["jobStatus"]
    assert (status["name"], js["username"], js["state"], js["executionType"]) == (
        name,
        "admin",
        "SUCCEEDED",
        "START",
    )
    assert js["appExitCode"] == 0 and js["completedTime"] >= js["createdTime"] > 0
    tasks = status["taskRoles"]["main"]["taskStatuses"]
    assert [(t["taskIndex"], t["taskState"], t["containerExitCode"]) for t in tasks] == [
        (0, "SUCCEEDED", 0),
        (1, "SUCCEEDED", 0),
    ]
    assert all(t["containerIp"] for t in tasks)
    assert api.http.get(f"/api/v1/user/admin/jobs/{name}").json()["name"] == name
    # The round trip: the config read back is the job as submitted, and means the same job.
    config = api.http.get(f"/api/v2/jobs/admin~{name}/config")
    assert config.status_code == 200 and config.json() == payload

    listed = api.http.get("/api/v2/jobs", params={"username": "admin"}).json()
    mine = [item for item in listed if item["name"] == name]
    assert len(mine) == 1
    assert (
        mine[0]["username"],
        mine[0]["state"],
        mine[0]["totalTaskNumber"],
        mine[0]["totalTaskRoleNumber"],
    ) == ("admin", "SUCCEEDED", 2, 1)
    counted = api.http.get(
        "/api/v2/jobs", params={"withTotalCount": "true", "state": "SUCCEEDED"}
    ).json()
    assert counted["totalCount"] >= 1 and {i["state"] for i in counted["data"]} == {"SUCCEEDED"}
    waiting = api.http.get("/api/v2/jobs", params={"state": "WAITING"}).json()
    assert name not in {i["name"] for i in waiting}


def test_v1_paths_under_a_user_and_the_stopping_filter(api: Api) -> None:
    """OpenPAI's rest-server rewrites /api/v1/user/{user}/jobs[/{name}/...] to the v2
    routes of {user}~{name}: the v1 clients' list, config, ssh and stop. A job whose stop
    was asked for, still running, is listed as STOPPING and found by that state only."""
    name = unique("v1-paths")
    payload = {
        "jobName": name,
        "image": "python:3.11",
        "taskRoles": [
            {
                "name": "main",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                # Deaf to SIGTERM: it stays STOPPING until the kill grace is over.
                "command": "trap '' TERM; sleep 300",
            }
        ],
    }
    assert api.http.post("/api/v1/user/admin/jobs", json=payload).status_code == 202
    openpai_status(api, f"admin~{name}", {"RUNNING"})
    listed = api.http.get("/api/v1/user/admin/jobs")
    assert listed.status_code == 200 and name in {i["name"] for i in listed.json()}
    config = api.http.get(f"/api/v1/user/admin/jobs/{name}/config")
    assert config.status_code == 200 and config.json() == payload
    for path in (f"/api/v1/user/admin/jobs/{name}/ssh", f"/api/v2/jobs/admin~{name}/ssh"):
        ssh = api.http.get(path)
        assert ssh.status_code == 404 and ssh.json()["code"] == "NoJobSshInfoError", ssh.text
    nothing = api.http.get("/api/v1/user/admin/jobs/no-such-job/ssh")
    assert nothing.status_code == 404 and nothing.json()["code"] == "NoJobError"

    stop = api.http.put(f"/api/v1/user/admin/jobs/{name}/executionType", json={"value": "STOP"})
    assert stop.status_code == 202, stop.text
    assert stop.json()["message"] == f"Execute job admin~{name} successfully."

    def names(state: str) -> set[str]:
        answer = api.http.get("/api/v2/jobs", params={"state": state, "keyword": name})
        assert answer.status_code == 200, answer.text
        return {i["name"] for i in answer.json()}

    deadline = time.monotonic() + 8
    while name not in names("STOPPING"):
        assert time.monotonic() < deadline, "a job being stopped was never listed as STOPPING"
        time.sleep(0.2)
    assert name not in names("RUNNING") | names("WAITING")
    assert name in names("RUNNING,STOPPING")
    assert names("UNKNOWN") == set()
    openpai_status(api, f"admin~{name}", {"STOPPED"})
    assert name in names("STOPPED") and name not in names("STOPPING")


def test_the_list_takes_openpais_limits(api: Api) -> None:
    """Up to OpenPAI's 50000 (all in one list: tests/integration/test_status_views.py);
    above it, OpenPAI's 400."""
    assert api.http.get("/api/v2/jobs", params={"limit": 10000}).status_code == 200
    above = api.http.get("/api/v2/jobs", params={"limit": 60000})
    assert above.status_code == 400, above.text
    assert above.json() == {
        "code": "InvalidParametersError",
        "message": "Limit exceeds max number 50000.",
    }


def test_the_platforms_own_errors_on_openpais_paths_are_in_openpais_shape(api: Api) -> None:
    """OpenPAI's clients read {"code", "message"}: an unknown path, a bad query
    parameter and a missing token answer so on its paths, and as before elsewhere."""
    cases = {
        "/api/v2/jobs/admin~x/no-such-thing": (404, "NoApiError"),
        "/api/v1/user/admin/jobs/x/no-such-thing": (404, "NoApiError"),
        "/api/v2/jobs?offset=abc": (400, "InvalidParametersError"),
    }
    for path, (status, code) in cases.items():
        answer = api.http.get(path)
        assert (answer.status_code, answer.json().get("code")) == (status, code), answer.text
        assert answer.json()["message"], answer.text
    # A method a path does not take: OpenPAI's router falls through to its catch-all.
    for method, path in (("DELETE", "/api/v2/jobs/admin~x"), ("PATCH", "/api/v2/jobs")):
        answer = api.http.request(method, path)
        assert answer.status_code == 404, (method, answer.text)
        assert answer.json() == {"code": "NoApiError", "message": f"API {path} is not found."}
    assert "offset" in api.http.get("/api/v2/jobs?offset=abc").json()["message"]
    # The rest-server's catch-all names the whole URL it was asked for.
    unknown = api.http.get("/api/v2/no-such-api?x=1").json()
    assert unknown == {"code": "NoApiError", "message": "API /api/v2/no-such-api?x=1 is not found."}
    anonymous = httpx.get(f"{api.url}/api/v2/jobs", timeout=30)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["code"] == "UnauthorizedUserError", anonymous.text
    # Trainyard's own API keeps FastAPI's shape.
    assert "detail" in api.http.get("/v1/jobs?limit=abc").json()


def test_seed_json_through_api_v2_jobs(api: Api) -> None:
    payload = seed_job("helloworld_16be675e")
    payload["jobName"] = unique("seed")
    answer = api.http.post(
        "/api/v2/jobs", content=json.dumps(payload), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 202, answer.text
    status = openpai_status(api, f"admin~{payload['jobName']}", {"SUCCEEDED", "FAILED"})
    # minFailedTaskCount null: the job succeeds although nvidia-smi is missing here.
    assert status["jobStatus"]["state"] == "SUCCEEDED"
    assert status["taskRoles"]["task_1"]["taskStatuses"][0]["containerExitCode"] == 127


def test_stop_through_execution_type(api: Api) -> None:
    name = unique("sleeper")
    job = yaml.safe_dump(
        {
            "protocolVersion": 2,
            "name": name,
            "type": "job",
            "prerequisites": [{"name": "i", "type": "dockerimage", "uri": "x"}],
            "taskRoles": {
                "w": {
                    "dockerImage": "i",
                    "commands": ["sleep 300"],
                    "resourcePerInstance": {"cpu": 1, "memoryMB": 128, "gpu": 0},
                }
            },
        }
    )
    assert (
        api.http.post(
            "/api/v2/jobs", content=job, headers={"Content-Type": "text/yaml"}
        ).status_code
        == 202
    )
    openpai_status(api, f"admin~{name}", {"RUNNING"})
    answer = api.http.put(f"/api/v2/jobs/admin~{name}/executionType", json={"value": "STOP"})
    assert answer.status_code == 202, answer.text
    assert answer.json()["message"] == f"Execute job admin~{name} successfully."
    status = openpai_status(api, f"admin~{name}", {"STOPPED"})
    assert status["jobStatus"]["executionType"] == "STOP"
    assert status["jobStatus"]["appExitCode"] == -210
    assert status["taskRoles"]["w"]["taskStatuses"][0]["taskState"] == "STOPPED"
    missing = api.http.put("/api/v2/jobs/admin~no-such-job/executionType", json={"value": "STOP"})
    assert missing.status_code == 404 and missing.json()["code"] == "NoJobError"
    bad = api.http.put(f"/api/v2/jobs/admin~{name}/executionType", json={"value": "PAUSE"})
    assert bad.status_code == 400


def test_an_invalid_protocol_is_refused_with_its_field(api: Api) -> None:
    job = {
        "protocolVersion": 2,
        "name": unique("bad"),
        "type": "job",
        "taskRoles": {
            "w": {
                "instances": 0,
                "dockerImage": "nope",
                "commands": ["x"],
                "resourcePerInstance": {"cpu": 1, "memoryMB": 128, "gpu": 0},
            }
        },
    }
    answer = api.http.post(
        "/api/v2/jobs", content=yaml.safe_dump(job), headers={"Content-Type": "text/yaml"}
    )
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "InvalidProtocolError"
    assert {"$.taskRoles.w.instances", "$.taskRoles.w.dockerImage"} <= {
        e["path"] for e in body["errors"]
    }
    garbage = api.http.post("/api/v2/jobs", content="[1, 2", headers={"Content-Type": "text/yaml"})
    assert garbage.status_code == 400


def test_other_users_get_403_on_paths_and_404_on_jobs(api: Api) -> None:
    token = api.http.post("/v1/tokens", json={"user": "paiuser"}).json()["token"]
    user = api.as_token(token)
    name = unique("theirs")
    payload = {
        "jobName": name,
        "image": "x",
        "taskRoles": [
            {
                "name": "m",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": "true",
            }
        ],
    }
    refused = user.http.post("/api/v1/user/admin/jobs", json=payload)
    assert refused.status_code == 403 and refused.json()["code"] == "ForbiddenUserError"
    assert user.http.post("/api/v1/user/paiuser/jobs", json=payload).status_code == 202
    openpai_status(user, f"paiuser~{name}", {"SUCCEEDED"})
    # An admin sees it; the same name is free for another user.
    assert api.http.get(f"/api/v2/jobs/paiuser~{name}").status_code == 200
    mine = unique("mine")
    assert (
        api.http.post("/api/v1/user/admin/jobs", json={**payload, "jobName": mine}).status_code
        == 202
    )
    openpai_status(api, f"admin~{mine}", {"SUCCEEDED"})
    assert user.http.get(f"/api/v2/jobs/admin~{mine}").status_code == 404
    stop = user.http.put(f"/api/v2/jobs/admin~{mine}/executionType", json={"value": "STOP"})
    assert stop.status_code == 403
    assert user.http.get("/api/v2/jobs", params={"username": "admin"}).status_code == 403
    assert {i["username"] for i in user.http.get("/api/v2/jobs").json()} == {"paiuser"}
