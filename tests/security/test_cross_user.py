"""Cross-user access on every dialect's read and write path, against the real platform.

Alice runs a job in each dialect; Bob, an ordinary user with his own token and his own
DLC AccessKey, tries every path that names one of her jobs. Each of his answers must be
exactly what he gets for a job that does not exist (no existence oracle: a 403 on a
real job and a 404 on a missing one would tell him which names are taken), her jobs
must be untouched by his writes, and the same request by Alice must work (so a refusal
cannot be a broken route). Admin-only routes refuse him with 403."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from alibabacloud_pai_dlc20201203 import models as dlc_models
from alibabacloud_pai_dlc20201203.client import Client
from alibabacloud_tea_openapi.exceptions import ClientException

from trainyard_stack.platform import Platform

from ..e2e.conftest import Api, start_platform, unique
from ..e2e.test_dialect_dlc import call, cpu_job, sdk

pytestmark = pytest.mark.e2e

T9K = "/apis/batch.tensorstack.dev/v1beta1/namespaces/team-a"
KUBEFLOW = "/apis/kubeflow.org/v1/namespaces/ml"
TI_CLUSTER = "default"
HOLD = "sleep 600"  # every job of Alice's runs until the end of the module


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(tmp_path_factory.mktemp("cross-user"))
    yield platform
    platform.stop()


@dataclass
class User:
    name: str
    api: Api
    dlc: Client
    key_id: str


def make_user(platform: Platform, admin: Api, name: str) -> User:
    token = admin.http.post("/v1/tokens", json={"user": name})
    assert token.status_code == 201, token.text
    key = admin.http.post("/v1/access-keys", json={"user": name})
    assert key.status_code == 201, key.text
    key_id, secret = key.json()["AccessKeyId"], key.json()["AccessKeySecret"]
    return User(name, admin.as_token(token.json()["token"]), sdk(platform, key_id, secret), key_id)


@dataclass
class AliceJobs:
    """Alice's running jobs: their ids, names, and her data source."""

    native: str
    openpai: str  # the job name (its framework name is alice~name)
    openpai_id: str
    t9k: str
    t9k_id: str
    kubeflow: str
    kubeflow_id: str
    ti: str
    ti_id: str
    dlc: str
    data_source: str


@pytest.fixture(scope="module")
def admin(platform: Platform) -> Api:
    return Api(platform.url, platform.token)


@pytest.fixture(scope="module")
def alice(platform: Platform, admin: Api) -> User:
    return make_user(platform, admin, unique("alice"))


@pytest.fixture(scope="module")
def bob(platform: Platform, admin: Api) -> User:
    return make_user(platform, admin, unique("bob"))


def container(command: str) -> dict[str, Any]:
    return {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "python:3.11",
                        "command": ["sh", "-c", command],
                        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
                    }
                ]
            }
        }
    }


@pytest.fixture(scope="module")
def jobs(alice: User, tmp_path_factory: pytest.TempPathFactory) -> AliceJobs:
    api = alice.api
    native = api.submit(
        {
            "name": unique("native"),
            "roles": [
                {"name": "main", "command": HOLD, "resources": {"cpu": 0.25, "memory_mb": 128}}
            ],
        }
    )
    openpai = unique("pai")
    answer = api.http.post(
        "/api/v2/jobs",
        content=yaml.safe_dump(
            {
                "protocolVersion": 2,
                "name": openpai,
                "type": "job",
                "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
                "taskRoles": {
                    "worker": {
                        "instances": 1,
                        "dockerImage": "img",
                        "resourcePerInstance": {"cpu": 1, "memoryMB": 128, "gpu": 0},
                        "commands": [HOLD],
                    }
                },
            }
        ),
        headers={"Content-Type": "text/yaml"},
    )
    assert answer.status_code == 202, answer.text
    openpai_id = answer.headers["X-Trainyard-Job-Id"]
    t9k = unique("t9k")
    answer = api.http.post(
        f"{T9K}/genericjobs",
        json={
            "apiVersion": "batch.tensorstack.dev/v1beta1",
            "kind": "GenericJob",
            "metadata": {"name": t9k},
            "spec": {
                "successRules": [{"worker": [0]}],
                "replicaSpecs": [{"type": "worker", "replicas": 1, **container(HOLD)}],
            },
        },
    )
    assert answer.status_code == 201, answer.text
    t9k_id = answer.json()["metadata"]["uid"]
    kubeflow = unique("torch")
    answer = api.http.post(
        f"{KUBEFLOW}/pytorchjobs",
        json={
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": kubeflow},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, **container(HOLD)}}},
        },
    )
    assert answer.status_code == 201, answer.text
    kubeflow_id = answer.json()["metadata"]["uid"]
    ti = unique("ti")
    answer = api.http.post(
        "/ti/v1/jobs", json={"name": ti, "cluster": TI_CLUSTER, "command": ["sh", "-c", HOLD]}
    )
    assert answer.status_code == 202, answer.text
    ti_id = answer.json()["id"]
    data_source = call(
        alice.dlc,
        "CreateDataSource",
        "POST",
        "/api/v1/datasources",
        {
            "DataSourceType": "local",
            "DisplayName": "alice-data",
            "Path": str(tmp_path_factory.mktemp("alice-data")),
            "MountPath": "/root/data/alice",
        },
    )["DataSourceId"]
    dlc = alice.dlc.create_job(cpu_job("alice-dlc", HOLD)).body.job_id
    made = AliceJobs(
        native, openpai, openpai_id, t9k, t9k_id, kubeflow, kubeflow_id, ti, ti_id, dlc, data_source
    )
    for job_id in (native, openpai_id, t9k_id, kubeflow_id, ti_id, dlc):
        view = api.wait(job_id, {"RUNNING"}, timeout=90)
        assert view["user"] == alice.name, view
    return made


def normalized(answer: httpx.Response, *names: str) -> tuple[int, str]:
    """An answer with the names it was asked about, and request ids, blotted out."""
    text = answer.text
    for name in names:
        text = text.replace(name, "<name>")
    return answer.status_code, re.sub(r'"(RequestId|requestId)"\s*:\s*"[^"]*"', "", text)


def same_as_missing(
    bob: Api, method: str, real: str, missing: str, names: tuple[str, str], **request: Any
) -> int:
    """Bob's answer on Alice's ``real`` path equals his answer on ``missing``; its status."""
    on_real = bob.http.request(method, real, **request)
    on_missing = bob.http.request(method, missing, **request)
    assert normalized(on_real, *names) == normalized(on_missing, *names), (
        method,
        real,
        on_real.text,
        on_missing.text,
    )
    assert on_real.status_code in (403, 404), (method, real, on_real.status_code, on_real.text)
    return on_real.status_code


def test_bob_cannot_tell_alices_jobs_from_missing_ones_on_any_path(
    alice: User, bob: User, jobs: AliceJobs
) -> None:
    ghost = uuid.uuid4().hex
    ghost_name = unique("ghost")
    # (method, path with {}, the real key, the missing key, extra request arguments)
    attempts: list[tuple[str, str, str, str, dict[str, Any]]] = [
        # Trainyard's own API.
        ("GET", "/v1/jobs/{}", jobs.native, ghost, {}),
        ("GET", "/v1/jobs/{}/events", jobs.native, ghost, {}),
        ("GET", "/v1/jobs/{}/tasks", jobs.native, ghost, {}),
        ("GET", "/v1/jobs/{}/logs", jobs.native, ghost, {}),
        ("GET", "/v1/jobs/{}/logs", jobs.native, ghost, {"params": {"role": "main", "index": 0}}),
        ("POST", "/v1/jobs/{}/stop", jobs.native, ghost, {}),
        ("POST", "/v1/jobs/{}/pause", jobs.native, ghost, {}),
        ("POST", "/v1/jobs/{}/resume", jobs.native, ghost, {}),
        ("POST", "/v1/jobs/{}/restart", jobs.native, ghost, {}),
        ("POST", "/v1/jobs/{}/tasks/main/0/exec", jobs.native, ghost, {"json": {"command": "id"}}),
        (
            "POST",
            "/v1/placement/jobs/{}/scale",
            jobs.native,
            ghost,
            {"json": {"role": "main", "replicas": 2}},
        ),
        # Every dialect's job is a job of Trainyard's API too.
        ("GET", "/v1/jobs/{}", jobs.openpai_id, ghost, {}),
        ("POST", "/v1/jobs/{}/stop", jobs.t9k_id, ghost, {}),
        ("GET", "/v1/jobs/{}/logs", jobs.dlc, ghost, {}),
        # OpenPAI: her framework names, v2 and v1.
        (
            "GET",
            "/api/v2/jobs/{}",
            f"{alice.name}~{jobs.openpai}",
            f"{alice.name}~{ghost_name}",
            {},
        ),
        (
            "GET",
            "/api/v2/jobs/{}/config",
            f"{alice.name}~{jobs.openpai}",
            f"{alice.name}~{ghost_name}",
            {},
        ),
        (
            "PUT",
            "/api/v2/jobs/{}/executionType",
            f"{alice.name}~{jobs.openpai}",
            f"{alice.name}~{ghost_name}",
            {"json": {"value": "STOP"}},
        ),
        ("GET", f"/api/v1/user/{alice.name}/jobs/{{}}", jobs.openpai, ghost_name, {}),
        # T9k and Kubeflow: read, patch (pause), delete.
        ("GET", f"{T9K}/genericjobs/{{}}", jobs.t9k, ghost_name, {}),
        (
            "PATCH",
            f"{T9K}/genericjobs/{{}}",
            jobs.t9k,
            ghost_name,
            {
                "json": {"spec": {"runMode": {"pause": {"enabled": True}}}},
                "headers": {"Content-Type": "application/merge-patch+json"},
            },
        ),
        ("DELETE", f"{T9K}/genericjobs/{{}}", jobs.t9k, ghost_name, {}),
        ("GET", f"{KUBEFLOW}/pytorchjobs/{{}}", jobs.kubeflow, ghost_name, {}),
        ("DELETE", f"{KUBEFLOW}/pytorchjobs/{{}}", jobs.kubeflow, ghost_name, {}),
        # TI.
        ("GET", f"/ti/v1/jobs/{TI_CLUSTER}/{{}}", jobs.ti, ghost_name, {}),
        ("DELETE", f"/ti/v1/jobs/{TI_CLUSTER}/{{}}", jobs.ti, ghost_name, {}),
    ]
    for method, path, real, missing, request in attempts:
        same_as_missing(
            bob.api, method, path.format(real), path.format(missing), (real, missing), **request
        )

    # PAI-DLC, through the official SDK signed with Bob's own AccessKey.
    pod = alice.dlc.get_job(jobs.dlc, dlc_models.GetJobRequest()).body.pods[0].pod_id
    dlc_attempts = [
        lambda job: bob.dlc.get_job(job, dlc_models.GetJobRequest()),
        lambda job: bob.dlc.get_job_events(job, dlc_models.GetJobEventsRequest()),
        lambda job: bob.dlc.get_pod_logs(job, pod, dlc_models.GetPodLogsRequest()),
        lambda job: bob.dlc.stop_job(job),
        lambda job: bob.dlc.delete_job(job),
    ]
    for attempt in dlc_attempts:
        assert sdk_refusal(attempt, jobs.dlc) == sdk_refusal(attempt, ghost)
    for method, action in (("GET", "GetDataSource"), ("DELETE", "DeleteDataSource")):
        refusals = [
            sdk_refusal(
                lambda ds, m=method, a=action: call(bob.dlc, a, m, f"/api/v1/datasources/{ds}"),
                ds,
            )
            for ds in (jobs.data_source, f"ds-{ghost}")
        ]
        assert refusals[0] == refusals[1], refusals
    # Nor can he mount her data source into a job of his own.
    mounted = [
        sdk_refusal(
            lambda ds: bob.dlc.create_job(
                cpu_job(
                    "bob-dlc",
                    "true",
                    data_sources=[dlc_models.CreateJobRequestDataSources(data_source_id=ds)],
                )
            ),
            ds,
        )
        for ds in (jobs.data_source, f"ds-{ghost}")
    ]
    assert mounted[0] == mounted[1] and mounted[0][0] in (400, 403, 404), mounted

    # Every one of her jobs runs on, untouched: no command of Bob's reached the bus.
    for job_id in (
        jobs.native,
        jobs.openpai_id,
        jobs.t9k_id,
        jobs.kubeflow_id,
        jobs.ti_id,
        jobs.dlc,
    ):
        view = alice.api.job(job_id)
        assert view["state"] == "RUNNING", view
        commands = {e["type"] for e in alice.api.events(job_id)} - {
            "JobSubmitted",
            "JobAccepted",
            "JobQueued",
            "JobPlaced",
            "TaskStateChanged",
        }
        assert commands == set(), (job_id, commands)

    # The same requests by Alice work: the refusals were about Bob, not broken routes.
    for path in (
        f"/v1/jobs/{jobs.native}",
        f"/v1/jobs/{jobs.native}/events",
        f"/v1/jobs/{jobs.native}/tasks",
        f"/api/v2/jobs/{alice.name}~{jobs.openpai}",
        f"/api/v2/jobs/{alice.name}~{jobs.openpai}/config",
        f"/api/v1/user/{alice.name}/jobs/{jobs.openpai}",
        f"{T9K}/genericjobs/{jobs.t9k}",
        f"{KUBEFLOW}/pytorchjobs/{jobs.kubeflow}",
        f"/ti/v1/jobs/{TI_CLUSTER}/{jobs.ti}",
    ):
        assert alice.api.http.get(path).status_code == 200, path
    ran = alice.api.http.post(f"/v1/jobs/{jobs.native}/tasks/main/0/exec", json={"command": "id"})
    assert ran.status_code == 200 and ran.json()["exit_code"] == 0, ran.text
    assert alice.dlc.get_pod_logs(jobs.dlc, pod, dlc_models.GetPodLogsRequest()).body is not None
    assert call(alice.dlc, "GetDataSource", "GET", f"/api/v1/datasources/{jobs.data_source}")


def sdk_refusal(attempt: Any, key: str) -> tuple[int, str]:
    """The HTTP status and Alibaba error code the SDK raised for ``attempt(key)``."""
    with pytest.raises(ClientException) as refused:
        attempt(key)
    return refused.value.status_code, refused.value.code


def test_bob_lists_none_of_alices_jobs_and_cannot_ask_for_hers(
    alice: User, bob: User, jobs: AliceJobs
) -> None:
    ids = {jobs.native, jobs.openpai_id, jobs.t9k_id, jobs.kubeflow_id, jobs.ti_id, jobs.dlc}
    names = {jobs.openpai, jobs.t9k, jobs.kubeflow, jobs.ti}
    listed = bob.api.http.get("/v1/jobs", params={"limit": 500})
    assert listed.status_code == 200
    assert not ids & {j["id"] for j in listed.json()["items"]}
    for path in (
        "/api/v2/jobs",
        f"{T9K}/genericjobs",
        "/apis/batch.tensorstack.dev/v1beta1/genericjobs",
        f"{KUBEFLOW}/pytorchjobs",
        "/ti/v1/jobs",
    ):
        answer = bob.api.http.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert not any(name in answer.text for name in names | ids), (path, answer.text)
    assert jobs.dlc not in {
        j.job_id for j in bob.dlc.list_jobs(dlc_models.ListJobsRequest()).body.jobs
    }
    listed_sources = call(bob.dlc, "ListDataSources", "GET", "/api/v1/datasources")
    assert jobs.data_source not in str(listed_sources)
    # Asking for her jobs by name is refused outright (OpenPAI's own answers).
    assert bob.api.http.get("/api/v2/jobs", params={"username": alice.name}).status_code == 403
    # Submitting in her name is refused; the same name in his own name is his job.
    v1 = {
        "jobName": jobs.openpai,
        "image": "python:3.11",
        "taskRoles": [
            {
                "name": "w",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 128,
                "gpuNumber": 0,
                "command": "true",
            }
        ],
    }
    impersonated = bob.api.http.post(f"/api/v1/user/{alice.name}/jobs", json=v1)
    assert impersonated.status_code == 403, impersonated.text
    assert impersonated.json()["code"] == "ForbiddenUserError"
    # Names are per user: hers being taken does not show in his answers.
    own = bob.api.http.post(f"/api/v1/user/{bob.name}/jobs", json=v1)
    assert own.status_code == 202, own.text
    again = bob.api.http.post(
        f"{T9K}/genericjobs",
        json={
            "apiVersion": "batch.tensorstack.dev/v1beta1",
            "kind": "GenericJob",
            "metadata": {"name": jobs.t9k},
            "spec": {"replicaSpecs": [{"type": "worker", "replicas": 1, **container("true")}]},
        },
    )
    assert again.status_code == 201, again.text
    mine = bob.api.wait(again.json()["metadata"]["uid"])
    assert mine["user"] == bob.name and mine["state"] == "SUCCEEDED", mine
    assert alice.api.job(jobs.t9k_id)["state"] == "RUNNING"


def test_admin_routes_refuse_an_ordinary_user(
    admin: Api, alice: User, bob: User, jobs: AliceJobs
) -> None:
    refused = [
        ("GET", "/v1/admin/tasks", {}),
        ("GET", "/v1/admin/dead-letters", {}),
        ("POST", "/v1/admin/dead-letters/1/replay", {}),
        ("POST", "/v1/tokens", {"json": {"user": alice.name}}),
        ("POST", "/v1/tokens", {"json": {"user": bob.name, "admin": True}}),
        ("POST", "/v1/access-keys", {"json": {"user": alice.name}}),
        ("DELETE", f"/v1/access-keys/{alice.key_id}", {}),
        ("DELETE", f"/v1/users/{alice.name}/credentials", {}),
        ("GET", "/v1/placement/nodes", {}),
        ("POST", "/v1/placement/nodes", {"json": {"name": "evil", "cpu": 64, "memory_mb": 1}}),
        ("POST", "/v1/placement/nodes/node-cpu/drain", {}),
        ("DELETE", "/v1/placement/nodes/node-cpu", {}),
        ("POST", "/v1/placement/shutdown", {}),
    ]
    for method, path, request in refused:
        answer = bob.api.http.request(method, path, **request)
        assert answer.status_code == 403, (method, path, answer.status_code, answer.text)
    # Nothing of it happened: the nodes are as they were, Alice's key still signs, and
    # placement still places.
    nodes = admin.http.get("/v1/placement/nodes").json()
    text = str(nodes)
    assert "evil" not in text and "node-cpu" in text, nodes
    assert alice.dlc.get_job(jobs.dlc, dlc_models.GetJobRequest()).body.status == "Running"
    quick = alice.api.submit(
        {
            "name": unique("after"),
            "roles": [{"name": "main", "command": "true", "resources": {"cpu": 0.1}}],
        }
    )
    assert alice.api.wait(quick, timeout=60)["state"] == "SUCCEEDED"


def test_openpai_account_calls_keep_bob_to_his_own(alice: User, bob: User) -> None:
    mine = bob.api.http.get(f"/api/v2/users/{bob.name}")
    assert mine.status_code == 200 and mine.json()["admin"] is False, mine.text
    for method, path in (
        ("GET", f"/api/v2/users/{alice.name}"),
        ("GET", "/api/v2/users"),
        ("GET", "/api/v2/groups/default/userlist"),
        ("POST", "/api/v2/users"),
        ("DELETE", f"/api/v2/users/{alice.name}"),
        ("PUT", f"/api/v2/users/{bob.name}/grouplist"),
    ):
        answer = bob.api.http.request(method, path, json={"grouplist": ["admingroup"]})
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["code"] == "ForbiddenUserError"
    # Alice's token cannot be revoked by Bob, nor read back by him.
    alice_token = alice.api.http.headers["Authorization"].split()[1]
    revoke = bob.api.http.delete(f"/api/v2/tokens/{alice_token}")
    assert revoke.status_code == 403, revoke.text
    assert alice.api.http.get(f"/api/v2/users/{alice.name}").status_code == 200
    assert bob.api.http.get("/api/v2/tokens").json()["tokens"] != [alice_token]
    # A token Bob mints is his and no admin's.
    minted = bob.api.http.post("/api/v2/tokens/application", json={}).json()["token"]
    as_minted = bob.api.as_token(minted).http.get(f"/api/v2/users/{bob.name}")
    assert as_minted.json()["username"] == bob.name and as_minted.json()["admin"] is False
    assert bob.api.as_token(minted).http.get("/v1/admin/tasks").status_code == 403


def test_an_admin_revokes_every_credential_of_a_user_those_it_minted_too(
    platform: Platform, admin: Api
) -> None:
    # Revoking the token an admin issued left the tokens its holder had minted for
    # itself (OpenPAI's application tokens, which can mint more) working.
    carol = make_user(platform, admin, unique("carol"))
    minted = [
        carol.api.http.post("/api/v2/tokens/application", json={}).json()["token"] for _ in range(2)
    ]
    everyone = [carol.api, *(carol.api.as_token(token) for token in minted)]
    for api in everyone:  # intake's own route: its cache is cleared at once
        assert api.http.get(f"/api/v2/users/{carol.name}").status_code == 200
    answer = admin.http.delete(f"/v1/users/{carol.name}/credentials")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"user": carol.name, "tokens": 3, "access_keys": 1}
    for api in everyone:
        assert api.http.get(f"/api/v2/users/{carol.name}").status_code == 401
    with pytest.raises(ClientException):  # her AccessKey no longer signs
        carol.dlc.list_jobs(dlc_models.ListJobsRequest())
    # The bootstrap admin's name is no one else's to be given.
    refused = admin.http.post("/v1/tokens", json={"user": "admin"})
    assert refused.status_code == 422 and "bootstrap admin" in refused.text
    # The bootstrap admin itself may mint an application token in its own name (OpenPAI's
    # SDK does): its own, with no admin rights.
    minted = admin.http.post("/api/v2/tokens/application", json={})
    assert minted.status_code == 200, minted.text
    own = admin.as_token(minted.json()["token"]).http.get("/v1/admin/tasks")
    assert own.status_code == 403
