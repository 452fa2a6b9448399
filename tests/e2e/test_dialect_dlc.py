"""PAI-DLC end to end, driven by the official SDK (alibabacloud_pai_dlc20201203) against
the gateway: its signatures, paths and response models, unchanged."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from alibabacloud_pai_dlc20201203 import models as dlc_models
from alibabacloud_pai_dlc20201203.client import Client
from alibabacloud_tea_openapi.exceptions import ClientException
from alibabacloud_tea_openapi.utils_models import Config, OpenApiRequest, Params
from darabonba.runtime import RuntimeOptions

from trainyard_stack.platform import Platform

from .conftest import Api

pytestmark = pytest.mark.e2e

DLC_TERMINAL = {"Succeeded", "Failed", "Stopped"}


def sdk(platform: Platform, key_id: str, secret: str, **config: Any) -> Client:
    endpoint = platform.url.split("://", 1)[1].rstrip("/")
    return Client(
        Config(
            access_key_id=key_id,
            access_key_secret=secret,
            endpoint=endpoint,
            protocol="http",
            read_timeout=30_000,
            **config,
        )
    )


def call(
    client: Client,
    action: str,
    method: str,
    path: str,
    body: dict | None = None,
    query: dict | None = None,
) -> dict[str, Any]:
    """A DLC action this SDK version has no method for (the data-source and code-source
    APIs of earlier versions), through the SDK's own signed call_api."""
    params = Params(
        action=action,
        version="2020-12-03",
        protocol="HTTP",
        pathname=path,
        method=method,
        auth_type="AK",
        style="ROA",
        req_body_type="json",
        body_type="json",
    )
    answer = client.call_api(params, OpenApiRequest(body=body, query=query), RuntimeOptions())
    return answer["body"]


@pytest.fixture(scope="module")
def access_key(api: Api) -> dict[str, str]:
    answer = api.http.post("/v1/access-keys", json={"user": "dlc-alice"})
    assert answer.status_code == 201, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def client(platform: Platform, access_key: dict[str, str]) -> Client:
    return sdk(platform, access_key["AccessKeyId"], access_key["AccessKeySecret"])


def cpu_job(name: str, command: str, **extra: Any) -> dlc_models.CreateJobRequest:
    return dlc_models.CreateJobRequest(
        display_name=name,
        job_type="PyTorchJob",
        user_command=command,
        job_specs=[
            dlc_models.JobSpec(
                type="Worker",
                image="python:3.11",
                pod_count=1,
                resource_config=dlc_models.ResourceConfig(cpu="1", memory="1Gi"),
            )
        ],
        **extra,
    )


def wait_for(
    client: Client, job_id: str, done: Callable[[Any], bool], timeout: float = 60.0
) -> Any:
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        # No 404 to wait out: CreateJob answers once a read shows the job.
        body = client.get_job(job_id, dlc_models.GetJobRequest()).body
        if done(body):
            return body
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not get there in {timeout}s: {body}")


def test_job_lifecycle_with_the_official_sdk(client: Client, api: Api) -> None:
    created = client.create_job(cpu_job("dlc-echo", "echo hello-from-dlc")).body
    assert created.job_id and created.request_id

    job = wait_for(client, created.job_id, lambda b: b.status in DLC_TERMINAL)
    assert job.status == "Succeeded", job.to_map()
    assert job.display_name == "dlc-echo" and job.job_type == "PyTorchJob"
    assert job.user_command == "echo hello-from-dlc"
    assert job.gmt_create_time and job.gmt_finish_time
    [pod] = job.pods
    assert pod.type == "Worker" and pod.status == "Succeeded"

    # The AccessKey's user owns the job, in Trainyard's own API too.
    assert api.job(created.job_id)["user"] == "dlc-alice"

    listed = client.list_jobs(
        dlc_models.ListJobsRequest(display_name="dlc-echo", page_size=10)
    ).body
    assert created.job_id in [j.job_id for j in listed.jobs]
    assert listed.total_count >= 1
    succeeded = client.list_jobs(dlc_models.ListJobsRequest(status="Succeeded")).body
    assert created.job_id in [j.job_id for j in succeeded.jobs]
    running = client.list_jobs(dlc_models.ListJobsRequest(status="Running")).body
    assert created.job_id not in [j.job_id for j in running.jobs]

    events = client.get_job_events(created.job_id, dlc_models.GetJobEventsRequest()).body
    assert events.job_id == created.job_id
    assert any("JobSubmitted" in e for e in events.events)
    assert any("SUCCEEDED" in e for e in events.events)

    logs = client.get_pod_logs(created.job_id, pod.pod_id, dlc_models.GetPodLogsRequest()).body
    assert "hello-from-dlc" in logs.logs


def test_pod_logs_are_the_last_2000_lines_unless_max_lines_says(client: Client) -> None:
    """GetPodLogsRequest.max_lines: "Default value: 2000"."""
    created = client.create_job(cpu_job("dlc-lines", "seq 1 2500")).body
    job = wait_for(client, created.job_id, lambda b: b.status in DLC_TERMINAL)
    assert job.status == "Succeeded"
    [pod] = job.pods
    logs = client.get_pod_logs(created.job_id, pod.pod_id, dlc_models.GetPodLogsRequest()).body
    assert logs.logs == [str(n) for n in range(501, 2501)]
    request = dlc_models.GetPodLogsRequest(max_lines=3)
    assert client.get_pod_logs(created.job_id, pod.pod_id, request).body.logs == [
        "2498",
        "2499",
        "2500",
    ]


def test_stop_job(client: Client) -> None:
    created = client.create_job(cpu_job("dlc-sleep", "sleep 300")).body
    wait_for(client, created.job_id, lambda b: b.status == "Running")
    stopped = client.stop_job(created.job_id).body
    assert stopped.job_id == created.job_id
    job = wait_for(client, created.job_id, lambda b: b.status in DLC_TERMINAL)
    assert job.status == "Stopped"
    # DeleteJob answers as DLC does; Trainyard keeps the record (docs/dialects/dlc.md).
    assert client.delete_job(created.job_id).body.job_id == created.job_id
    with pytest.raises(ClientException) as exc:
        client.stop_job("no-such-job")
    assert exc.value.status_code == 404 and exc.value.code == "JobNotFound"


def test_wrong_secret_is_refused(platform: Platform, access_key: dict[str, str]) -> None:
    intruder = sdk(platform, access_key["AccessKeyId"], access_key["AccessKeySecret"] + "x")
    with pytest.raises(ClientException) as exc:
        intruder.list_jobs(dlc_models.ListJobsRequest())
    assert exc.value.status_code == 403
    assert exc.value.code == "SignatureDoesNotMatch"
    unknown = sdk(platform, "LTAI-unknown", "whatever")
    with pytest.raises(ClientException) as exc:
        unknown.create_job(cpu_job("x", "true"))
    assert exc.value.status_code == 401


def test_roa_v2_signatures_work_too(platform: Platform, access_key: dict[str, str]) -> None:
    old = sdk(
        platform, access_key["AccessKeyId"], access_key["AccessKeySecret"], signature_algorithm="v2"
    )
    assert old.list_jobs(dlc_models.ListJobsRequest(page_size=1)).body.request_id
    # pai-dlc's older clients sign only so, and their CreateJob carries no Content-MD5.
    created = old.create_job(cpu_job("dlc-roa-v2", "true")).body
    assert created.job_id
    job = wait_for(old, created.job_id, lambda b: b.status in DLC_TERMINAL)
    assert job.status == "Succeeded", job.to_map()


def test_another_users_job_is_not_found(platform: Platform, api: Api, client: Client) -> None:
    created = client.create_job(cpu_job("dlc-private", "true")).body
    answer = api.http.post("/v1/access-keys", json={"user": "dlc-bob"})
    bob = sdk(platform, answer.json()["AccessKeyId"], answer.json()["AccessKeySecret"])
    with pytest.raises(ClientException) as exc:
        bob.get_job(created.job_id, dlc_models.GetJobRequest())
    assert exc.value.status_code == 404
    assert created.job_id not in [
        j.job_id for j in bob.list_jobs(dlc_models.ListJobsRequest()).body.jobs
    ]
    # A revoked key signs nothing.
    assert api.http.delete(f"/v1/access-keys/{answer.json()['AccessKeyId']}").status_code == 204
    with pytest.raises(ClientException):
        bob.list_jobs(dlc_models.ListJobsRequest())


def test_data_and_code_sources(client: Client, tmp_path: Any) -> None:
    ds = call(
        client,
        "CreateDataSource",
        "POST",
        "/api/v1/datasources",
        {
            "DataSourceType": "local",
            "DisplayName": "mnist",
            "Path": str(tmp_path),
            "MountPath": "/root/data/mnist",
        },
    )
    ds_id = ds["DataSourceId"]
    got = call(client, "GetDataSource", "GET", f"/api/v1/datasources/{ds_id}")
    assert got["DisplayName"] == "mnist" and got["Path"] == str(tmp_path)
    listed = call(
        client,
        "ListDataSources",
        "GET",
        "/api/v1/datasources",
        query={"DisplayName": "mnist", "PageSize": "5"},
    )
    assert ds_id in [d["DataSourceId"] for d in listed["DataSources"]]
    call(
        client, "UpdateDataSource", "PUT", f"/api/v1/datasources/{ds_id}", {"Description": "digits"}
    )
    assert (
        call(client, "GetDataSource", "GET", f"/api/v1/datasources/{ds_id}")["Description"]
        == "digits"
    )

    cs = call(
        client,
        "CreateCodeSource",
        "POST",
        "/api/v1/codesources",
        {
            "DisplayName": "ops",
            "CodeRepo": "https://example.com/ops.git",
            "CodeBranch": "main",
            "MountPath": "/root/code/ops",
            "CodeRepoAccessToken": "tok",
        },
    )
    cs_id = cs["CodeSourceId"]
    got = call(client, "GetCodeSource", "GET", f"/api/v1/codesources/{cs_id}")
    assert got["CodeRepo"] == "https://example.com/ops.git"
    assert got["CodeRepoAccessToken"] != "tok"
    listed = call(client, "ListCodeSources", "GET", "/api/v1/codesources")
    assert cs_id in [c["CodeSourceId"] for c in listed["CodeSources"]]
    call(client, "UpdateCodeSource", "PUT", f"/api/v1/codesources/{cs_id}", {"CodeBranch": "dev"})

    # A job naming them gets them resolved: GetJob shows where the data really is.
    created = client.create_job(
        cpu_job(
            "dlc-sources",
            "true",
            data_sources=[dlc_models.CreateJobRequestDataSources(data_source_id=ds_id)],
            code_source=dlc_models.CreateJobRequestCodeSource(code_source_id=cs_id),
        )
    ).body
    job = wait_for(client, created.job_id, lambda b: True)
    assert job.data_sources[0].data_source_id == ds_id
    assert job.data_sources[0].uri == str(tmp_path)
    assert job.data_sources[0].mount_path == "/root/data/mnist"
    assert job.code_source.code_source_id == cs_id and job.code_source.branch == "dev"
    client.stop_job(created.job_id)

    # An unknown id is refused at once, naming the field.
    with pytest.raises(ClientException) as exc:
        client.create_job(
            cpu_job(
                "dlc-bad",
                "true",
                data_sources=[dlc_models.CreateJobRequestDataSources(data_source_id="d-missing")],
            )
        )
    assert exc.value.status_code == 400
    assert "$.DataSources[0].DataSourceId" in exc.value.message

    call(client, "DeleteDataSource", "DELETE", f"/api/v1/datasources/{ds_id}")
    call(client, "DeleteCodeSource", "DELETE", f"/api/v1/codesources/{cs_id}")
    with pytest.raises(ClientException) as exc:
        call(client, "GetDataSource", "GET", f"/api/v1/datasources/{ds_id}")
    assert exc.value.status_code == 404


def test_invalid_create_job_names_the_field(client: Client) -> None:
    with pytest.raises(ClientException) as exc:
        client.create_job(cpu_job("dlc-bad", "true", priority=10))
    assert exc.value.status_code == 400 and "$.Priority" in exc.value.message


def test_update_job_pod_events_ecs_specs_and_list_filters(client: Client, api: Api) -> None:
    created = client.create_job(
        cpu_job("dlc-update", "sleep 30", workspace_id="ws-1", priority=3)
    ).body
    job = wait_for(client, created.job_id, lambda b: b.status == "Running")
    assert job.priority == 3

    # UpdateJob: the priority (placement's, at once), nothing else of a submitted job.
    updated = client.update_job(created.job_id, dlc_models.UpdateJobRequest(priority=8)).body
    assert updated.job_id == created.job_id
    assert wait_for(client, created.job_id, lambda b: b.priority == 8).status == "Running"
    with pytest.raises(ClientException) as refused:
        client.update_job(created.job_id, dlc_models.UpdateJobRequest(user_command="rm -rf /"))
    assert refused.value.status_code == 400 and refused.value.code == "InvalidParameter"
    assert "UserCommand" in refused.value.message
    with pytest.raises(ClientException) as bad:
        client.update_job(created.job_id, dlc_models.UpdateJobRequest(priority=10))
    assert bad.value.status_code == 400

    # ListJobs honours WorkspaceId, JobType, JobIds and the creation time window.
    def listed(**query: Any) -> list[str]:
        body = client.list_jobs(dlc_models.ListJobsRequest(page_size=100, **query)).body
        return [j.job_id for j in body.jobs]

    assert created.job_id in listed(workspace_id="ws-1")
    assert created.job_id not in listed(workspace_id="ws-2")
    assert created.job_id in listed(job_type="PyTorchJob")
    assert created.job_id not in listed(job_type="TFJob")
    assert listed(job_ids=created.job_id) == [created.job_id]
    assert created.job_id in listed(start_time="2020-01-01T00:00:00Z")
    assert created.job_id not in listed(start_time="2099-01-01T00:00:00Z")
    assert created.job_id not in listed(end_time="2020-01-01T00:00:00Z")
    # ... and the rest DLC documents: DisplayName fuzzy and case-insensitive (exact on
    # request), searches, quota, payment, visibility, tags as labels, sort and order.
    assert created.job_id in listed(display_name="DLC-UPD")
    assert created.job_id not in listed(display_name="dlc-upd", display_name_search_mode="exact")
    assert created.job_id in listed(display_name="dlc-update", display_name_search_mode="exact")
    assert created.job_id in listed(image_search="PYTHON:3.11")
    assert created.job_id in listed(user_command_search="sleep 30")
    assert created.job_id not in listed(user_command_search="rm -rf")
    assert created.job_id in listed(payment_type="PostPaid")
    assert created.job_id not in listed(payment_type="PrePaid")
    assert created.job_id in listed(accessibility="PRIVATE")
    assert created.job_id not in listed(accessibility="PUBLIC")
    assert created.job_id in listed(tags={"dlc_workspace_id": "ws-1"})
    assert created.job_id not in listed(tags={"dlc_workspace_id": "ws-2"})
    assert created.job_id in listed(username=job.user_id, time_range_field="GmtCreateTime")
    assert created.job_id not in listed(username=job.user_id + "-not")
    assert created.job_id not in listed(resource_quota_name="team")
    names = [
        j.display_name
        for j in client.list_jobs(
            dlc_models.ListJobsRequest(sort_by="DisplayName", order="asc", page_size=100)
        ).body.jobs
    ]
    assert names == sorted(names) and "dlc-update" in names
    with pytest.raises(ClientException) as unsupported:
        listed(numeric_range_field="RequestGPU", numeric_range_min=1)
    assert unsupported.value.status_code == 400 and "NumericRangeField" in unsupported.value.message

    # GetPodEvents: the pod's own history.
    [pod] = job.pods
    events = client.get_pod_events(
        created.job_id, pod.pod_id, dlc_models.GetPodEventsRequest()
    ).body
    assert events.pod_id == pod.pod_id and any("RUNNING" in e for e in events.events)
    with pytest.raises(ClientException) as missing:
        client.get_pod_events(
            created.job_id, f"{created.job_id}-nobody-0", dlc_models.GetPodEventsRequest()
        )
    assert missing.value.status_code == 404

    # GetJobMetrics: the running pod's memory and CPU now (GPU and the rest are not
    # collected here, and said so).
    memory = client.get_job_metrics(
        created.job_id, dlc_models.GetJobMetricsRequest(metric_type="MemoryUsage")
    ).body
    [pod_metrics] = memory.pod_metrics
    assert pod_metrics.pod_id == pod.pod_id and pod_metrics.metrics[0].value > 1_000_000
    cpu = client.get_job_metrics(
        created.job_id, dlc_models.GetJobMetricsRequest(metric_type="CpuCoreUsage")
    ).body
    assert 0 <= cpu.pod_metrics[0].metrics[0].value < 2
    with pytest.raises(ClientException) as uncollected:
        client.get_job_metrics(
            created.job_id, dlc_models.GetJobMetricsRequest(metric_type="GpuCoreUsage")
        )
    assert uncollected.value.status_code == 400 and "MemoryUsage" in uncollected.value.message

    # ListEcsSpecs: the catalog the platform sizes EcsSpec with.
    gpus = client.list_ecs_specs(
        dlc_models.ListEcsSpecsRequest(accelerator_type="GPU", page_size=100)
    ).body
    assert gpus.total_count > len(gpus.ecs_specs) == 100  # Alibaba's GPU families
    assert all(spec.gpu > 0 for spec in gpus.ecs_specs)
    a10 = client.list_ecs_specs(
        dlc_models.ListEcsSpecsRequest(instance_types="ecs.gn7i-c8g1.2xlarge,ecs.g6.large")
    ).body
    assert [(s.cpu, s.memory, s.gpu, s.gpu_type, s.gpu_memory) for s in a10.ecs_specs] == [
        (2, 8, 0, "", 0),
        (8, 30, 1, "A10", 24),
    ]
    # The SDK's SortBy values (CPU, GPU, Memory, GmtCreateTime) and ResourceType.
    by_cpu = client.list_ecs_specs(
        dlc_models.ListEcsSpecsRequest(sort_by="CPU", order="desc", page_size=5)
    ).body
    cpus = [s.cpu for s in by_cpu.ecs_specs]
    assert cpus == sorted(cpus, reverse=True) and len(cpus) == 5
    lingjun = client.list_ecs_specs(dlc_models.ListEcsSpecsRequest(resource_type="Lingjun")).body
    assert lingjun.ecs_specs == [] and lingjun.total_count == 0
    client.stop_job(created.job_id)


def test_a_resource_id_is_a_quota_an_administrator_maps_to_a_queue(client: Client) -> None:
    mapped = client.create_job(
        cpu_job("dlc-quota", "echo quota", resource_id="quota1ci8g793pgm")
    ).body
    job = wait_for(client, mapped.job_id, lambda b: b.status in DLC_TERMINAL)
    assert job.status == "Succeeded", job.to_map()
    assert job.resource_id == "quota1ci8g793pgm"
    # A quota no queue stands for is refused at once, as DLC refuses an unknown one.
    with pytest.raises(ClientException) as unknown:
        client.create_job(cpu_job("dlc-noquota", "echo", resource_id="quota-nope"))
    assert unknown.value.status_code == 400 and "$.ResourceId" in unknown.value.message
