"""Tencent TI jobs through the whole platform: POST /ti/v1/jobs, the tasks' TF_CONFIG,
TI's view of the job, DELETE to stop, and ``yard ti job`` as a user runs it."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import pytest

from trainyard_stack.platform import Platform

from .conftest import Api, unique, yard

pytestmark = pytest.mark.e2e

# The e2e cluster has one queue, "default"; a TI cluster is a queue.
CLUSTER = "default"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")

# Run by every worker: exits non-zero unless TF_CONFIG describes a two-worker cluster
# with real ports and names this very task.
CHECK_TF_CONFIG = """
import json, os, sys
c = json.loads(os.environ["TF_CONFIG"])
print(json.dumps(c))
workers = c["cluster"]["worker"]
ok = (set(c["cluster"]) == {"worker"} and len(workers) == 2 and len(set(workers)) == 2
      and all(int(w.rsplit(":", 1)[1]) > 0 for w in workers)
      and c["task"] == {"type": "worker", "index": int(os.environ["TRAINYARD_INDEX"])}
      and workers[c["task"]["index"]].endswith(
          ":" + os.environ["PAI_CONTAINER_HOST_tfport_PORT_LIST"]))
sys.exit(0 if ok else 3)
"""


def ti_job(
    api: Api,
    name: str,
    cluster: str = CLUSTER,
    timeout: float = 60.0,
    states: tuple[str, ...] = ("Succeeded", "Failed"),
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = api.http.get(f"/ti/v1/jobs/{cluster}/{name}")
        if answer.status_code == 200:
            view = answer.json()
            if view["state"] in states:
                return view
        time.sleep(0.2)
    raise AssertionError(f"TI job {name} not in {states} after {timeout}s: {view}")


def test_a_two_worker_tensorflow_job_sees_its_cluster_in_tf_config(api: Api) -> None:
    name = unique("tf-config")
    payload = {
        "name": name,
        "cluster": CLUSTER,
        "runtimeVersion": "tf-1.7.0-py3",
        "workerCount": 2,
        "workerType": "1U1G0P",
        "command": ["python3", "-c", CHECK_TF_CONFIG],
    }
    answer = api.http.post("/ti/v1/jobs", json=payload)
    assert answer.status_code == 202, answer.text
    created = answer.json()
    assert created["state"] == "Created" and created["name"] == name
    assert created["cluster"] == CLUSTER and created["workerCount"] == 2

    view = ti_job(api, name)
    assert view["state"] == "Succeeded", view
    for key in ("createTime", "startTime", "endTime"):
        assert RFC3339.match(view[key] or ""), (key, view[key])
    times = [
        datetime.fromisoformat(view[k].replace("Z", "+00:00"))
        for k in ("createTime", "startTime", "endTime")
    ]
    assert times == sorted(times)
    assert view["runtimeVersion"] == "tf-1.7.0-py3" and view["workerType"] == "1U1G0P"

    # The canonical job agrees: two workers, both succeeded, each with its tfport.
    job = api.job(created["id"])
    assert job["dialect"] == "ti" and job["spec"]["kind"] == "tensorflow"
    assert [(t["role"], t["state"]) for t in job["tasks"]] == [("worker", "SUCCEEDED")] * 2
    assert all(p["label"] == "tfport" for t in job["tasks"] for p in t["ports"])

    listed = api.http.get("/ti/v1/jobs", params={"cluster": CLUSTER})
    assert listed.status_code == 200
    assert name in [j["name"] for j in listed.json()["jobs"]]


def test_an_invalid_ti_job_is_answered_at_once_field_by_field(api: Api) -> None:
    answer = api.http.post(
        "/ti/v1/jobs",
        json={
            "name": unique("bad"),
            "cluster": CLUSTER,
            "command": ["true"],
            "runtimeVersion": "tfplus-1.6.0-gpu",
            "workerType": "1U2G0P",
            "parameterServerCount": 1,
        },
    )
    assert answer.status_code == 400
    paths = {e["path"] for e in answer.json()["detail"]["errors"]}
    assert paths == {"$.workerType", "$.parameterServerCount"}


def test_a_job_on_an_unknown_cluster_is_refused_at_once_naming_the_field(api: Api) -> None:
    name = unique("nowhere")
    answer = api.http.post(
        "/ti/v1/jobs", json={"name": name, "cluster": "cls-nowhere", "command": ["true"]}
    )
    assert answer.status_code == 400, answer.text
    errors = answer.json()["detail"]["errors"]
    assert [(e["path"], e["code"]) for e in errors] == [("$.cluster", "unknown_queue")]
    assert api.http.get(f"/ti/v1/jobs/cls-nowhere/{name}").status_code == 404
    # Nor can a job larger than the whole cluster ever start: refused as well.
    huge = api.http.post(
        "/ti/v1/jobs",
        json={"name": unique("huge"), "cluster": CLUSTER, "command": ["true"],
              "workerCount": 40, "workerType": "8U30G0P"},
    )  # fmt: skip
    assert huge.status_code == 400, huge.text
    assert huge.json()["detail"]["errors"][0]["code"] == "never_fits"


def test_delete_stops_the_job(api: Api) -> None:
    name = unique("sleepy")
    answer = api.http.post(
        "/ti/v1/jobs",
        json={
            "name": name,
            "cluster": CLUSTER,
            "command": ["sleep", "300"],
            "workerType": "1U1G0P",
        },
    )
    assert answer.status_code == 202, answer.text
    ti_job(api, name, states=("Running",))
    deleted = api.http.delete(f"/ti/v1/jobs/{CLUSTER}/{name}")
    assert deleted.status_code == 202, deleted.text
    view = ti_job(api, name)
    assert view["state"] == "Failed" and view["message"].startswith("stopped")
    # Deleted, the name is free again in its cluster; the new job is the one read back.
    again = api.http.post(
        "/ti/v1/jobs",
        json={"name": name, "cluster": CLUSTER, "command": ["true"], "workerType": "1U1G0P"},
    )
    assert again.status_code == 202, again.text
    assert ti_job(api, name, states=("Succeeded",))["state"] == "Succeeded"
    assert api.http.delete(f"/ti/v1/jobs/{CLUSTER}/{unique('none')}").status_code == 404
    assert api.http.get(f"/ti/v1/jobs/{CLUSTER}/{unique('none')}").status_code == 404


def test_another_user_does_not_see_the_job(api: Api) -> None:
    name = unique("private")
    assert (
        api.http.post(
            "/ti/v1/jobs", json={"name": name, "cluster": CLUSTER, "command": ["true"]}
        ).status_code
        == 202
    )
    ti_job(api, name)
    token = api.http.post("/v1/tokens", json={"user": unique("bob")}).json()["token"]
    bob = api.as_token(token)
    assert bob.http.get(f"/ti/v1/jobs/{CLUSTER}/{name}").status_code == 404
    assert name not in [j["name"] for j in bob.http.get("/ti/v1/jobs").json()["jobs"]]
    assert bob.http.delete(f"/ti/v1/jobs/{CLUSTER}/{name}").status_code == 404


def test_yard_ti_job_create_get_list(platform: Platform, api: Api) -> None:
    name = unique("cli")
    created = yard(
        platform,
        "ti",
        "job",
        "create",
        name,
        f"--cluster={CLUSTER}",
        "--region=ap-guangzhou",
        "--command=python3 -c 'import os; print(os.environ[\"TF_CONFIG\"])'",
        "--runtime=tf-1.7.0-py3",
        "--wcount=2",  # distributed: a job of one task gets no TF_CONFIG
        "--workertype=1U1G0P",
    )
    assert f"job {name} created in cluster {CLUSTER}: Created" in created.stdout
    view = ti_job(api, name)
    assert view["state"] == "Succeeded" and view["region"] == "ap-guangzhou"
    shown = yard(platform, "ti", "job", "get", name, "--cluster", CLUSTER).stdout
    assert re.search(r"state\s+Succeeded", shown)
    listed = yard(platform, "ti", "job", "list", "--cluster", CLUSTER).stdout
    assert name in listed
    failed = yard(platform, "ti", "job", "get", unique("none"), "--cluster", CLUSTER, check=False)
    assert failed.returncode == 1 and "no TI job" in failed.stderr


def test_tencent_cloud_sdk_creates_describes_lists_and_deletes(
    api: Api, platform: Platform
) -> None:
    """The Tencent Cloud API itself (``tccli tia CreateJob``), through Tencent's own TIA
    SDK unchanged: TC3-HMAC-SHA256 signatures with an access key, PascalCase bodies,
    ``{"Response": ...}`` answers and errors."""
    from tencentcloud.common import credential
    from tencentcloud.common.exception.tencent_cloud_sdk_exception import (
        TencentCloudSDKException,
    )
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile
    from tencentcloud.tia.v20180226 import models, tia_client

    key = api.http.post("/v1/access-keys", json={"user": "ti-carol"}).json()
    http = HttpProfile(endpoint=platform.url.split("://", 1)[1], protocol="http")
    client = tia_client.TiaClient(
        credential.Credential(key["AccessKeyId"], key["AccessKeySecret"]),
        "ap-guangzhou",
        ClientProfile(httpProfile=http),
    )

    def request(kind: Any, **fields: Any) -> Any:
        made = kind()
        made.from_json_string(json.dumps(fields))
        return made

    name = unique("cloud")
    created = client.CreateJob(request(
        models.CreateJobRequest, Name=name, Cluster=CLUSTER, RuntimeVersion="tf-1.7.0-py3",
        Command=["python3", "-c", "print('from the cloud api')"], ScaleTier="BASIC",
        Debug=False,
    )).Job  # fmt: skip
    assert (created.Name, created.Cluster, created.State) == (name, CLUSTER, "Created")
    assert created.ScaleTier == "BASIC" and created.Id

    deadline = time.monotonic() + 60
    described = client.DescribeJob(request(models.DescribeJobRequest, Name=name, Cluster=CLUSTER))
    while described.Job.State not in ("Succeeded", "Failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        described = client.DescribeJob(
            request(models.DescribeJobRequest, Name=name, Cluster=CLUSTER)
        )
    job = described.Job
    assert job.State == "Succeeded", job.Message
    assert job.CreateTime.endswith(" +0000 UTC") and job.EndTime
    assert job.Command == ["python3", "-c", "print('from the cloud api')"]
    assert job.Uin == "ti-carol"
    # Trainyard's own API shows the same job, owned by the access key's user.
    assert api.job(created.Id)["state"] == "SUCCEEDED"

    listed = client.ListJobs(request(models.ListJobsRequest, Cluster=CLUSTER, Limit=100))
    assert name in [j.Name for j in listed.Jobs]

    with pytest.raises(TencentCloudSDKException) as taken:
        client.CreateJob(request(
            models.CreateJobRequest, Name=name, Cluster=CLUSTER, Command=["true"],
        ))  # fmt: skip
    assert taken.value.code == "FailedOperation.AlreadyExists"
    with pytest.raises(TencentCloudSDKException) as bad:
        client.CreateJob(request(
            models.CreateJobRequest, Name=unique("bad"), Cluster=CLUSTER, Command=["true"],
            ScaleTier="PREMIUM_1", WorkerCount=0,
        ))  # fmt: skip
    assert bad.value.code == "InvalidParameterValue"
    assert "$.ScaleTier" in bad.value.message and "$.WorkerCount" in bad.value.message
    # A parameter left out is Tencent's MissingParameter, named as the Cloud API names it.
    with pytest.raises(TencentCloudSDKException) as left_out:
        client.CreateJob(request(models.CreateJobRequest, Name=unique("half")))
    assert left_out.value.code == "MissingParameter"
    assert "$.Cluster" in left_out.value.message and "$.Command" in left_out.value.message
    # Sent, but empty: there, with a value it cannot take.
    with pytest.raises(TencentCloudSDKException) as empty:
        client.CreateJob(request(models.CreateJobRequest, Name="", Cluster=CLUSTER, Command=[]))
    assert empty.value.code == "InvalidParameterValue", empty.value.message
    assert "$.Name" in empty.value.message and "$.Command" in empty.value.message
    with pytest.raises(TencentCloudSDKException) as missing:
        client.DescribeJob(request(models.DescribeJobRequest, Name="none", Cluster=CLUSTER))
    assert missing.value.code == "ResourceNotFound"

    client.DeleteJob(request(models.DeleteJobRequest, Name=name, Cluster=CLUSTER))
    # DeleteJob frees the name in its cluster.
    client.CreateJob(request(models.CreateJobRequest, Name=name, Cluster=CLUSTER, Command=["true"]))
    forged = tia_client.TiaClient(
        credential.Credential(key["AccessKeyId"], "not-the-secret"),
        "ap-guangzhou",
        ClientProfile(httpProfile=http),
    )
    with pytest.raises(TencentCloudSDKException) as refused:
        forged.ListJobs(request(models.ListJobsRequest, Cluster=CLUSTER))
    assert refused.value.code == "AuthFailure.SignatureFailure"
