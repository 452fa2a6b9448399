"""The PAI-DLC dialect: CreateJob bodies to the canonical job (the seed's example and
every rule), and GetJob / ListJobs views back."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.dialects import detect, dlc, translate
from trainyard_common.events import JobState, TaskState
from trainyard_common.jobspec import ALL_TASKS, EnvVar, JobKind, TaskRef
from trainyard_launcher.domain.completion import TaskOutcome, decide

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dlc"


def seed_example() -> dict[str, Any]:
    # The seed prints the body with a trailing comma (not strict JSON); YAML reads it.
    return yaml.safe_load((EXAMPLES / "createjob-tensorflow-gpu.seed.txt").read_text())


def cpu_job(**changes: Any) -> dict[str, Any]:
    job = {
        "DisplayName": "cpu-job",
        "JobType": "PyTorchJob",
        "UserCommand": "echo hi",
        "JobSpecs": [
            {
                "Type": "Worker",
                "Image": "python:3.11",
                "PodCount": 2,
                "ResourceConfig": {"CPU": "2", "Memory": "4Gi"},
            }
        ],
    }
    job.update(changes)
    return job


def paths(issues: list) -> list[str]:
    return [i.path for i in issues]


def test_seed_example_translates() -> None:
    payload = seed_example()
    assert detect(payload) == "dlc"
    t = translate(payload, user="alice")
    assert t.errors == []
    assert t.key is None
    spec = t.spec
    assert spec.name == "tf-mnist-test" and spec.kind is JobKind.TENSORFLOW
    assert spec.user == "alice" and spec.queue == "default" and spec.priority == 1
    [worker] = spec.roles
    assert (worker.name, worker.replicas) == ("Worker", 3)
    assert worker.image.startswith("registry.cn-hangzhou.aliyuncs.com/pai-dlc/tensorflow")
    assert worker.command == "python /root/code/mnist.py"
    r = worker.resources
    assert (r.cpu, r.memory_mb, r.gpu, r.gpu_type) == (12, 92 * 1024, 1, "V100")
    assert spec.pip_packages == ["numpy==1.16.1"]
    assert spec.pip_requirements_dir == "/root/code/"
    assert spec.max_running_minutes == 1024
    assert spec.code_source is not None
    assert (spec.code_source.repo, spec.code_source.branch, spec.code_source.commit) == (
        "code-****",
        "master",
        "44da109b5****",
    )
    assert [d.source for d in spec.data_sources] == ["d-*****"]
    assert paths(t.warnings) == ["$.UserVpc"]


def test_resolved_sources_replace_ids() -> None:
    sources = dlc.Sources(
        data={"d-*****": dlc.ResolvedData("nas://fs-1/data", "/root/data/nas1")},
        code={
            "code-****": dlc.ResolvedCode(
                "https://hub.fastgit.xyz/kubeflow/training-operator.git",
                "main",
                None,
                "/root/code/kubeflow",
            )
        },
    )
    spec = dlc.translate_dlc(seed_example(), "alice", sources).spec
    assert [(d.source, d.mount_path) for d in spec.data_sources] == [
        ("nas://fs-1/data", "/root/data/nas1")
    ]
    code = spec.code_source
    # The job's Branch/Commit win over the registered ones; the mount comes from the source.
    assert (code.repo, code.branch, code.commit, code.mount_path) == (
        "https://hub.fastgit.xyz/kubeflow/training-operator.git",
        "master",
        "44da109b5****",
        "/root/code/kubeflow",
    )
    payload = seed_example()
    payload["DataSources"][0]["MountPath"] = "/mnt/x"
    assert dlc.translate_dlc(payload, "a", sources).spec.data_sources[0].mount_path == "/mnt/x"


@pytest.mark.parametrize(
    "job_type,kind",
    [
        ("TFJob", JobKind.TENSORFLOW),
        ("PyTorchJob", JobKind.PYTORCH),
        ("XGBoostJob", JobKind.XGBOOST),
        ("MPIJob", JobKind.MPI),
        ("RayJob", JobKind.GENERIC),
        ("ElasticBatchJob", JobKind.GENERIC),
    ],
)
def test_job_types(job_type: str, kind: JobKind) -> None:
    assert dlc.translate_dlc(cpu_job(JobType=job_type), catalog={}).spec.kind is kind


def test_job_type_is_case_sensitive() -> None:
    t = dlc.translate_dlc(cpu_job(JobType="tfjob"), catalog={})
    assert paths(t.errors) == ["$.JobType"]
    assert "TFJob" in t.errors[0].message


def test_resource_config_overrides_catalog() -> None:
    job = cpu_job()
    job["JobSpecs"][0] = {
        "Type": "Worker",
        "Image": "i",
        "EcsSpec": "ecs.gn6e-c12g1.3xlarge",
        "ResourceConfig": {
            "CPU": "4",
            "Memory": "16Gi",
            "GPU": "2",
            "SharedMemory": "8Gi",
            "GPUType": "A100",
        },
    }
    r = dlc.translate_dlc(job).spec.roles[0].resources
    assert (r.cpu, r.memory_mb, r.gpu, r.shm_mb, r.gpu_type) == (4, 16384, 2, 8192, "A100")


def test_quantities() -> None:
    assert dlc.parse_cpu("500m") == 0.5 and dlc.parse_cpu(3) == 3 and dlc.parse_cpu("x") is None
    assert dlc.parse_memory_mb("512Mi") == 512 and dlc.parse_memory_mb("1G") == 954
    assert dlc.parse_memory_mb("2Gi") == 2048 and dlc.parse_memory_mb("12Q") is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("CPU", 10**310), ("Memory", 10**310), ("GPU", "9" * 310), ("SharedMemory", "9" * 320)],
)
def test_a_quantity_no_float_holds_is_the_fields_error(field: str, value: Any) -> None:
    # An integer of 310 digits overflowed float() (a 500 from CreateJob); a string of
    # them read as inf, which the capacity check could not round up (a 500 again).
    job = cpu_job()
    job["JobSpecs"][0]["ResourceConfig"][field] = value
    assert f"$.JobSpecs[0].ResourceConfig.{field}" in paths(dlc.translate_dlc(job).errors)


def test_resources_required_and_checked() -> None:
    job = cpu_job()
    job["JobSpecs"][0].pop("ResourceConfig")
    assert paths(dlc.translate_dlc(job).errors) == ["$.JobSpecs[0]"]
    job["JobSpecs"][0]["EcsSpec"] = "ecs.nope"
    assert paths(dlc.translate_dlc(job).errors) == ["$.JobSpecs[0].EcsSpec"]
    job["JobSpecs"][0]["ResourceConfig"] = {"CPU": "1", "Memory": "1Gi"}
    t = dlc.translate_dlc(job)
    assert t.errors == [] and paths(t.warnings) == ["$.JobSpecs[0].EcsSpec"]
    job["JobSpecs"][0]["ResourceConfig"] = {"CPU": "lots", "Memory": "1Gi"}
    assert paths(dlc.translate_dlc(job).errors) == [
        "$.JobSpecs[0].ResourceConfig.CPU",
        "$.JobSpecs[0].EcsSpec",
    ]


def test_catalog_file(tmp_path: Path) -> None:
    catalog = dlc.parse_catalog(
        yaml.safe_load("ecs.custom.big: {cpu: 64, memory_gib: 256, gpu: 8, gpu_type: H100}")
    )
    assert catalog["ecs.custom.big"] == dlc.EcsType(64, 256, 8, "H100")
    assert "ecs.gn6e-c12g1.3xlarge" in catalog
    with pytest.raises(ValueError, match="ecs.bad"):
        dlc.parse_catalog({"ecs.bad": {"cpu": "x"}})


@pytest.mark.parametrize(
    "key,value,path",
    [
        ("DisplayName", None, "$.DisplayName"),
        ("UserCommand", "  ", "$.UserCommand"),
        ("JobSpecs", [], "$.JobSpecs"),
        ("JobSpecs", "Worker", "$.JobSpecs"),
        ("Priority", 0, "$.Priority"),
        ("Priority", 10, "$.Priority"),
        ("Priority", "high", "$.Priority"),
        ("Envs", ["A=1"], "$.Envs"),
        ("ThirdpartyLibs", "numpy", "$.ThirdpartyLibs"),
        ("JobMaxRunningTimeMinutes", -1, "$.JobMaxRunningTimeMinutes"),
        ("DataSources", [{"MountPath": "/x"}], "$.DataSources[0].DataSourceId"),
        ("CodeSource", {"Branch": "main"}, "$.CodeSource.CodeSourceId"),
    ],
)
def test_rule_errors(key: str, value: Any, path: str) -> None:
    t = dlc.translate_dlc(cpu_job(**{key: value}), catalog={})
    assert path in paths(t.errors), t.errors


def test_job_spec_rules() -> None:
    job = cpu_job()
    job["JobSpecs"].append(copy.deepcopy(job["JobSpecs"][0]))
    job["JobSpecs"][0]["PodCount"] = 0
    del job["JobSpecs"][0]["Image"]
    assert paths(dlc.translate_dlc(job).errors) == [
        "$.JobSpecs[0].Image",
        "$.JobSpecs[0].PodCount",
        "$.JobSpecs[1].Type",
    ]


def test_fields_map() -> None:
    spec = dlc.translate_dlc(
        cpu_job(
            Priority=7,
            ResourceId="rs-1",
            WorkspaceId="ws-1",
            Envs={"A": "1", "B": 2},
            ThirdpartyLibs=["a==1"],
            ThirdpartyLibDir="/req",
            JobMaxRunningTimeMinutes=5,
        )
    ).spec
    assert (spec.priority, spec.queue) == (7, "rs-1")
    assert [(e.name, e.value) for e in spec.env] == [("A", "1"), ("B", "2")]
    assert spec.pip_packages == ["a==1"] and spec.pip_requirements_dir == "/req"
    assert spec.max_running_minutes == 5
    assert all(r.command == "echo hi" for r in spec.roles)
    only_workspace = dlc.translate_dlc(cpu_job(WorkspaceId="ws-1", JobType="TFJob")).spec
    assert only_workspace.queue == "default"
    assert {(label.name, label.value) for label in only_workspace.labels} == {
        (dlc.WORKSPACE_LABEL, "ws-1"),
        (dlc.JOB_TYPE_LABEL, "TFJob"),
    }
    assert dlc.translate_dlc(cpu_job(ResourceId="")).spec.queue == "default"


def test_success_follows_the_leader_role() -> None:
    job = cpu_job(JobType="TFJob")
    job["JobSpecs"] = [
        {"Type": "PS", "Image": "i", "PodCount": 2, "EcsSpec": "ecs.c6.large"},
        {"Type": "Worker", "Image": "i", "PodCount": 3, "EcsSpec": "ecs.c6.large"},
    ]
    roles = {r.name: r for r in dlc.translate_dlc(job).spec.roles}
    assert roles["Worker"].min_succeeded == 3 and roles["PS"].min_succeeded is None
    # ChiefWorker without a Chief: Worker 0 (KubeDL's default rule), not every Worker.
    job["SuccessPolicy"] = "ChiefWorker"
    spec = dlc.translate_dlc(job).spec
    assert spec.success_rules == [[TaskRef(role="Worker", index=0)]]
    assert all(r.min_succeeded is None for r in spec.roles)
    # With a Chief: DLC's SuccessPolicy, AllWorkers by default (the Chief and every
    # Worker, as KubeDL waits for both), ChiefWorker on request.
    del job["SuccessPolicy"]
    job["JobSpecs"].append({"Type": "Chief", "Image": "i", "EcsSpec": "ecs.c6.large"})
    job["JobSpecs"][-1]["PodCount"] = 2  # KubeDL waits for every Chief replica too
    spec = dlc.translate_dlc(job).spec
    assert spec.success_rules == [
        [TaskRef(role="Chief", index=ALL_TASKS), TaskRef(role="Worker", index=ALL_TASKS)]
    ]
    assert all(r.min_succeeded is None for r in spec.roles)
    done = TaskOutcome(TaskState.SUCCEEDED, exit_code=0)
    chiefs = {("Chief", 0): done, ("Chief", 1): done, ("Worker", 0): done}
    assert decide(spec, chiefs) is None  # the Workers 1 and 2 still run
    every = {**chiefs, ("Worker", 1): done, ("Worker", 2): done}
    assert decide(spec, {k: v for k, v in every.items() if k != ("Chief", 1)}) is None
    assert (verdict := decide(spec, every)) is not None and verdict.state is JobState.SUCCEEDED
    assert "every Chief, every Worker succeeded" in verdict.reason
    # However many Workers: one entry for them all, not a list as long as the job.
    job["JobSpecs"][1]["PodCount"] = 2**31 - 1
    assert len(dlc.translate_dlc(job).spec.success_rules[0]) == 2
    job["SuccessPolicy"] = "ChiefWorker"
    translated = dlc.translate_dlc(job)
    roles = {r.name: r for r in translated.spec.roles}
    assert roles["Chief"].min_succeeded == 2 and roles["Worker"].min_succeeded is None
    assert translated.spec.success_rules == [] and translated.warnings == []
    job["SuccessPolicy"] = "SomeWorkers"
    assert paths(dlc.translate_dlc(job).errors) == ["$.SuccessPolicy"]
    # SuccessPolicy is DLC's for TFJob only; other jobs end with their leader.
    xgb = cpu_job(JobType="XGBoostJob", SuccessPolicy="ChiefWorker")
    xgb["JobSpecs"].append({"Type": "Master", "Image": "i", "EcsSpec": "ecs.c6.large"})
    translated = dlc.translate_dlc(xgb)
    roles = {r.name: r for r in translated.spec.roles}
    assert roles["Master"].min_succeeded == 1 and roles["Worker"].min_succeeded is None
    assert paths(translated.warnings) == ["$.SuccessPolicy"]


def test_a_pytorch_job_succeeds_when_its_master_and_every_worker_have() -> None:
    """KubeDL's PyTorchJob rule (controllers/pytorch/status.go), which DLC runs: the
    Master's success ends the job only once every Worker has succeeded too."""
    torch = cpu_job(JobType="PyTorchJob")
    torch["JobSpecs"][0]["PodCount"] = 2
    torch["JobSpecs"].append({"Type": "Master", "Image": "i", "EcsSpec": "ecs.c6.large"})
    spec = dlc.translate_dlc(torch).spec
    assert spec.success_rules == [
        [TaskRef(role="Master", index=ALL_TASKS), TaskRef(role="Worker", index=ALL_TASKS)]
    ]
    assert all(r.min_succeeded is None for r in spec.roles)
    done = TaskOutcome(TaskState.SUCCEEDED, exit_code=0)
    assert decide(spec, {("Master", 0): done, ("Worker", 0): done}) is None  # Worker 1 runs
    every = {("Master", 0): done, ("Worker", 0): done, ("Worker", 1): done}
    assert (verdict := decide(spec, every)) is not None and verdict.state is JobState.SUCCEEDED
    failed = TaskOutcome(TaskState.FAILED, exit_code=1)
    verdict = decide(spec, {("Master", 0): done, ("Worker", 0): done, ("Worker", 1): failed})
    assert verdict is not None and verdict.state is JobState.FAILED
    # Workers alone: their success is the job's, as before.
    alone = dlc.translate_dlc(cpu_job(JobType="PyTorchJob")).spec
    assert alone.success_rules == [] and alone.roles[0].min_succeeded == alone.roles[0].replicas


@pytest.mark.parametrize(
    "key",
    ["UserVpc", "Options", "ElasticSpec", "DebuggerConfigContent", "CredentialConfig"],
)
def test_unsupported_fields_warn(key: str) -> None:
    t = dlc.translate_dlc(cpu_job(**{key: {"x": 1}}))
    assert t.errors == [] and paths(t.warnings) == [f"$.{key}"]


def test_unsupported_job_spec_fields_warn() -> None:
    job = cpu_job()
    job["JobSpecs"][0].update(UseSpotInstance=True, ExtraPodSpec={"InitContainers": []})
    job["JobSpecs"][0]["ResourceConfig"]["Disk"] = "10Gi"
    assert paths(dlc.translate_dlc(job).warnings) == [
        "$.JobSpecs[0].ExtraPodSpec",
        "$.JobSpecs[0].UseSpotInstance",
        "$.JobSpecs[0].ResourceConfig.Disk",
    ]


def test_role_type_outside_the_job_type_warns() -> None:
    job = cpu_job(JobType="PyTorchJob")
    job["JobSpecs"][0]["Type"] = "PS"
    assert paths(dlc.translate_dlc(job).warnings) == ["$.JobSpecs[0].Type"]


def test_pod_ids_round_trip() -> None:
    pid = dlc.pod_id("abc-1", "Worker", 12)
    assert pid == "abc-1-Worker-12"
    assert dlc.parse_pod_id("abc-1", pid) == ("Worker", 12)
    assert dlc.parse_pod_id("abc-1", "abc-2-Worker-1") is None
    assert dlc.parse_pod_id("abc-1", "abc-1-Worker") is None


def test_data_source_uri() -> None:
    assert dlc.data_source_uri({"Uri": "file:///data"}) == "file:///data"
    assert dlc.data_source_uri({"Path": "/srv/data"}) == "/srv/data"
    assert (
        dlc.data_source_uri({"DataSourceType": "nas", "FileSystemId": "fs-1", "Path": "/d"})
        == "nas://fs-1/d"
    )
    assert dlc.data_source_uri({"DataSourceType": "oss", "Path": "oss://b/p"}) == "oss://b/p"


def _view(state: str, **extra: Any) -> dict[str, Any]:
    spec = dlc.translate_dlc(seed_example(), "alice").spec.model_dump(mode="json")
    t0 = datetime(2024, 1, 1, 0, 0, 0, tzinfo=UTC)
    return {
        "id": "j1",
        "name": "tf-mnist-test",
        "user": "alice",
        "state": state,
        "priority": 1,
        "queue": "default",
        "attempt": 1,
        "submitted_at": t0,
        "updated_at": t0,
        "finished_at": None,
        "reason": None,
        "spec": spec,
        "tasks": [
            {
                "role": "Worker",
                "index": i,
                "attempt": 1,
                "state": "RUNNING",
                "host_ip": "10.0.0.1",
                "node": "n1",
                "updated_at": t0,
            }
            for i in range(3)
        ],
        **extra,
    }


def test_render_job() -> None:
    body = dlc.render_job(_view("RUNNING"), seed_example(), running_at="2024-01-01T00:00:05+00:00")
    assert body["JobId"] == "j1" and body["Status"] == "Running"
    assert body["JobType"] == "TFJob" and body["DisplayName"] == "tf-mnist-test"
    assert body["GmtCreateTime"] == "2024-01-01T00:00:00Z"
    assert body["GmtRunningTime"] == "2024-01-01T00:00:05Z"
    assert [p["PodId"] for p in body["Pods"]] == [f"j1-Worker-{i}" for i in range(3)]
    assert {p["Status"] for p in body["Pods"]} == {"Running"}
    [spec] = body["JobSpecs"]
    assert spec["EcsSpec"] == "ecs.gn6e-c12g1.3xlarge" and spec["PodCount"] == 3
    assert spec["ResourceConfig"]["GPUType"] == "V100"
    assert body["DataSources"][0]["DataSourceId"] == "d-*****"
    assert body["CodeSource"]["CodeSourceId"] == "code-****"
    assert body["UserCommand"] == "python /root/code/mnist.py"
    assert body["RequestGPU"] == 3.0
    # "The number of retries used by the job and the maximum number of retries" ("0/10").
    assert body["RestartTimes"] == "0/0"
    view = _view("RUNNING", attempt=3)
    view["spec"] = {**view["spec"], "retry_limit": 5}
    assert dlc.render_job(view)["RestartTimes"] == "2/5"


@pytest.mark.parametrize(
    "state,status",
    [
        ("SUBMITTED", "Creating"),
        ("QUEUED", "Queuing"),
        ("PLACED", "EnvPreparing"),
        ("SUCCEEDED", "Succeeded"),
        ("FAILED", "Failed"),
        ("STOPPED", "Stopped"),
        ("REJECTED", "Failed"),
    ],
)
def test_statuses(state: str, status: str) -> None:
    assert dlc.render_job(_view(state))["Status"] == status
    assert state in dlc.states_for(status)


def test_render_list_and_events() -> None:
    body = dlc.render_list([(_view("SUCCEEDED"), None)], 7)
    assert body["TotalCount"] == 7 and body["Jobs"][0]["JobMaxRunningTimeMinutes"] == 1024
    # DLC's ReasonCode for a stop: "JobStoppedByUser" ("Job is stopped by user.").
    assert dlc.render_job(_view("STOPPED"))["ReasonCode"] == "JobStoppedByUser"
    lines = dlc.render_events(
        [
            {"type": "JobSubmitted", "occurred_at": datetime(2024, 1, 1, tzinfo=UTC), "event": {}},
            {
                "type": "TaskStateChanged",
                "occurred_at": "2024-01-01T00:00:01Z",
                "event": {"role": "Worker", "index": 0, "state": "SUCCEEDED", "exit_code": 0},
            },
        ]
    )
    assert lines == [
        "2024-01-01T00:00:00Z JobSubmitted",
        "2024-01-01T00:00:01Z TaskStateChanged Worker[0] SUCCEEDED (exit 0)",
    ]


def test_code_source_token_hidden() -> None:
    item = dlc.render_code_source({"_id": "code-1", "CodeRepo": "r", "CodeRepoAccessToken": "tok"})
    assert item["CodeRepoAccessToken"] == "******" and item["CodeSourceId"] == "code-1"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
dlc_keys = st.sampled_from(sorted(dlc.JOB_KEYS | {"UserVpc", "JobSpecs"}))
spec_like = st.dictionaries(st.sampled_from(sorted(dlc.SPEC_KEYS | {"X"})), json_values, max_size=6)
payloads = st.dictionaries(dlc_keys, json_values | st.lists(spec_like, max_size=3), max_size=10)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(payloads | json_values)
def test_translate_never_raises(payload: Any) -> None:
    t = dlc.translate_dlc(payload, "u")
    assert t.dialect == "dlc"
    for role in [None, "nobody", *(r.name for r in t.spec.roles)]:
        for field in (
            "role",
            "cpu",
            "memory_mb",
            "gpu",
            "gpu_type",
            "image",
            "command",
            "replicas",
            "shm_mb",
            "name",
            "queue",
        ):
            assert dlc.field_path(payload, role, field).startswith("$")
    for issue in t.errors + t.warnings:
        assert issue.path.startswith("$")


def test_sdk_models_read_the_views() -> None:
    """The official SDK's response models parse what we render (its from_map errors
    are swallowed by the client, leaving body None, so they are checked here)."""
    import json

    from alibabacloud_pai_dlc20201203 import models as sdk

    rendered = dlc.render_job(_view("RUNNING"), seed_example(), running_at="2024-01-01T00:00:05Z")
    body = sdk.GetJobResponseBody().from_map(json.loads(json.dumps(rendered)))
    assert body.pods[1].pod_id == "j1-Worker-1" and body.pods[0].pod_ips[0].ip == "10.0.0.1"
    assert body.job_specs[0].resource_config.gpu == "1"
    listed = sdk.ListJobsResponseBody().from_map(
        json.loads(json.dumps(dlc.render_list([(_view("SUCCEEDED"), seed_example())], 1)))
    )
    assert listed.jobs[0].job_id == "j1" and listed.total_count == 1
    # A JobItem's RequestGPU is text in every SDK (Go's *string fails on a number).
    assert listed.jobs[0].request_gpu == "3" and listed.jobs[0].request_memory == "276Gi"
    item = sdk.DataSourceItem().from_map(
        dlc.render_data_source(
            {"_id": "d-1", "DisplayName": "x", "created_at": datetime(2024, 1, 1, tzinfo=UTC)}
        )
    )
    assert item.data_source_id == "d-1" and item.gmt_create_time == "2024-01-01T00:00:00Z"
    code = sdk.CodeSourceItem().from_map(dlc.render_code_source({"_id": "code-1"}))
    assert code.code_source_id == "code-1"


@pytest.mark.parametrize(
    ("instance_type", "expected"),
    [
        # Figures of Alibaba Cloud's "GPU-accelerated compute-optimized instance families".
        ("ecs.gn5-c8g1.2xlarge", dlc.EcsType(8, 60, 1, "P100", 16)),
        ("ecs.gn5i-c2g1.large", dlc.EcsType(2, 8, 1, "P4", 8)),
        ("ecs.gn6v-c8g1.16xlarge", dlc.EcsType(64, 256, 8, "V100", 16)),
        ("ecs.gn6e-c12g1.3xlarge", dlc.EcsType(12, 92, 1, "V100", 32)),
        ("ecs.gn6i-c4g1.xlarge", dlc.EcsType(4, 15, 1, "T4", 16)),
        ("ecs.gn7-c13g1.26xlarge", dlc.EcsType(104, 756, 8, "A100", 40)),
        ("ecs.gn7i-c8g1.2xlarge", dlc.EcsType(8, 30, 1, "A10", 24)),
        ("ecs.gn7i-c32g1.32xlarge", dlc.EcsType(128, 752, 4, "A10", 24)),
        ("ecs.gn7s-c8g1.2xlarge", dlc.EcsType(8, 60, 1, "A30", 24)),
        ("ecs.gn8is.2xlarge", dlc.EcsType(8, 64, 1, "L20", 48)),
        # The table gives 80 GB per GPU but names no model: any GPU of the cluster.
        ("ecs.gn7e-c16g1.4xlarge", dlc.EcsType(16, 125, 1, None, 80)),
        ("ecs.gn8v-8x.48xlarge", dlc.EcsType(192, 1024, 8, None, 96)),
        ("ecs.g6.large", dlc.EcsType(2, 8)),
    ],
)
def test_the_built_in_catalog_has_alibabas_gpu_families(
    instance_type: str, expected: dlc.EcsType
) -> None:
    assert dlc.BUILTIN_CATALOG[instance_type] == expected


def test_every_built_in_gpu_type_says_how_many_gpus_and_their_memory() -> None:
    families = {name.split(".")[1].split("-")[0] for name in dlc.BUILTIN_CATALOG}
    assert {"gn5", "gn5i", "gn6v", "gn6e", "gn6i", "gn7", "gn7i", "gn7e", "gn7s"} <= families
    assert {"gn8is", "gn8v", "ebmgn7e"} <= families
    for name, ecs in dlc.BUILTIN_CATALOG.items():
        if ".gn" in name or "ebmgn" in name or "sccgn" in name:
            assert ecs.gpu >= 1 and ecs.gpu_memory_gib, name


NOW = datetime(2026, 11, 26, tzinfo=UTC)


def listing(admin: bool = False, **params: str) -> dlc.ListQuery:
    return dlc.list_query(params, user="alice", admin=admin, now=NOW)


def test_list_jobs_defaults_to_the_callers_jobs_of_the_last_seven_days_newest_first() -> None:
    query = listing()
    assert query.where == {
        "dialect": dlc.DIALECT,
        "user": "alice",
        "submitted_at": {"$gte": NOW - timedelta(days=7)},
    }
    assert (query.sort, query.ascending, query.empty) == ("submitted_at", False, False)
    # An admin sees everyone's; StartTime alone lifts the 7-day window.
    assert "user" not in listing(admin=True).where
    window = listing(StartTime="2020-01-01T00:00:00Z").where["submitted_at"]
    assert window == {"$gte": datetime(2020, 1, 1, tzinfo=UTC)}
    # EndTime alone keeps StartTime's default (the SDK: "the current time minus 7 days").
    window = listing(EndTime="2026-11-27T00:00:00Z").where["submitted_at"]
    assert window == {"$gte": NOW - timedelta(days=7), "$lte": datetime(2026, 11, 27, tzinfo=UTC)}


def test_list_jobs_filters_as_dlc_documents_them() -> None:
    q = listing(
        DisplayName="Train", JobId="ABC", JobIds="x,y", ResourceId="quota1", ImageSearch="a.b",
        ReasonSearch="OOM", SortBy="GmtFinishTime", Order="asc", TimeRangeField="GmtFinishTime",
        Tags='{"team": "nlp"}', Accessibility="PUBLIC", TemplateId="t-1",
    )  # fmt: skip
    w = q.where
    assert w["name"] == {"$regex": "Train", "$options": "i"}
    assert w["_id"] == "abc"  # JobId before JobIds, case-insensitive
    assert w["labels.dlc_resource_id"] == {"$in": ["quota1"]}
    assert w["search.images"] == {"$regex": r"a\.b", "$options": "i"}
    assert w["reason"] == {"$regex": "OOM", "$options": "i"}
    assert w["labels.team"] == "nlp" and w["labels.dlc_template_id"] == "t-1"
    assert w["labels.dlc_accessibility"] == "PUBLIC"
    assert "finished_at" in w and "submitted_at" not in w
    assert (q.sort, q.ascending) == ("finished_at", True)
    assert listing(Accessibility="PRIVATE").where["labels.dlc_accessibility"] == {"$ne": "PUBLIC"}
    assert listing(DisplayName="t", DisplayNameSearchMode="exact").where["name"] == "t"
    assert listing(PaymentType="PrePaid").where["labels.dlc_resource_id"] == {"$ne": None}
    assert listing(PaymentType="PostPaid").where["labels.dlc_resource_id"] is None
    # Username "supports fuzzy match" (the SDK); the ids are exact.
    assert listing(admin=True, Username="Ob").where["user"] == {"$regex": "Ob", "$options": "i"}
    assert listing(admin=True, UserIdForFilter="bob").where["user"] == "bob"
    assert listing(admin=True, Username="o", UserIdForFilter="bob").where["user"] == "bob"
    own = listing(Username="LIC")  # a part of the caller's own name: their jobs
    assert own.where["user"] == "alice" and not own.empty


@pytest.mark.parametrize(
    ("params", "admin"),
    [
        ({"Username": "bob"}, False),  # another user's jobs, to a user
        ({"Username": "bob", "UserIdForFilter": "carol"}, True),
        ({"UserIdForFilter": "bob", "BusinessUserId": "carol"}, True),
        ({"Username": "ALICE", "UserIdForFilter": "bob"}, False),
        ({"PaymentType": "Spot"}, False),
        ({"EnableAssignNode": "true"}, False),
        ({"ResourceId": "q", "PaymentType": "PostPaid"}, False),
    ],
)
def test_list_jobs_that_nothing_can_match_are_empty(params: dict[str, str], admin: bool) -> None:
    assert listing(admin=admin, **params).empty


def test_empty_fields_the_sdk_always_sends_are_not_warned_of() -> None:
    job = seed_example()
    job["JobSpecs"][0].update(ElasticSpotSpecs=[], LocalMountSpecs=[], StartupDependencies=None)
    assert dlc.translate_dlc(job).warnings == dlc.translate_dlc(seed_example()).warnings
    job["JobSpecs"][0]["LocalMountSpecs"] = [{"MountPath": "/x"}]
    paths = {w.path for w in dlc.translate_dlc(job).warnings}
    assert "$.JobSpecs[0].LocalMountSpecs" in paths


def test_every_status_dlc_lists_is_taken_those_never_shown_matching_nothing() -> None:
    """ListJobsRequest.status: Stopping, Restarting, Bidding... are DLC's too."""
    assert listing(Status="Stopping").where["state"] == {"$in": []}
    assert listing(Status="SucceededReserving,Running").where["state"] == {"$in": ["RUNNING"]}
    assert listing(Status="queuing").where["state"] == {"$in": ["QUEUED"]}
    for status in dlc.LIST_STATUSES:
        listing(Status=status)


@pytest.mark.parametrize(
    "params",
    [
        {"NumericRangeField": "RequestGPU"},
        {"OversoldInfo": "ForceQuotaOverSold"},
        {"SortBy": "Priority"},
        {"Order": "up"},
        {"TimeRangeField": "GmtRunningTime"},
        {"Tags": "[1]"},
        {"Tags": '{"$where": "x"}'},
        {"Tags": '{"a.b": "x"}'},
        {"Tags": "[" * 9000 + "]" * 9000},  # deep enough to exhaust json's recursion
        {"Tags": '{"a": "\\ud800"}'},  # a lone surrogate, escaped: no store holds it
        {"StartTime": "yesterday"},
        {"Status": "Dancing"},
        {"PaymentType": "Free"},
        {"DisplayName": "x", "DisplayNameSearchMode": "regex"},
    ],
)
def test_list_jobs_refuses_what_it_cannot_honour_naming_the_parameter(
    params: dict[str, str],
) -> None:
    with pytest.raises(dlc.ListJobsError) as refused:
        listing(**params)
    assert refused.value.field in params


def test_ecs_specs_sort_by_the_sdks_fields_and_list_ecs_resources_only() -> None:
    """ListEcsSpecsRequest: SortBy CPU, GPU, Memory or GmtCreateTime; ResourceType ECS
    or Lingjun (none here)."""
    catalog = dlc.catalog_from_env()

    def names(sort_by: str, ascending: bool = True, resource_type: str | None = None) -> list:
        body = dlc.render_ecs_specs(catalog, None, [], sort_by, ascending, 1, 1000, resource_type)
        return [(s["InstanceType"], s["Cpu"]) for s in body["EcsSpecs"]]

    by_cpu = names("CPU")
    assert [cpu for _, cpu in by_cpu] == sorted(cpu for _, cpu in by_cpu)
    assert names("cpu") == names("Cpu") == by_cpu
    assert [n for n, _ in names("GmtCreateTime")] == list(catalog)
    assert [n for n, _ in names("GmtCreateTime", False)] == list(catalog)[::-1]
    assert names("CPU", resource_type="ECS") == by_cpu
    assert names("CPU", resource_type="Lingjun") == []


@pytest.mark.parametrize(
    ("name", "ok"),
    [("tf-mnist_1.0", True), ("a" * 256, True), ("a" * 257, False), ("my job", False),
     ("测试", False), ("a/b", False)],
)  # fmt: skip
def test_display_name_follows_dlcs_naming_rule(name: str, ok: bool) -> None:
    """CreateJobRequest.display_name: at most 256 characters; digits, letters, '_', '.'
    and '-'."""
    errors = dlc.translate_dlc(cpu_job(DisplayName=name)).errors
    assert (paths(errors) == []) is ok and (ok or paths(errors) == ["$.DisplayName"])


def test_a_jobs_pipeline_is_kept_for_list_jobs_pipeline_filter() -> None:
    # Settings.PipelineId was warned as unsupported and dropped, so ListJobs'
    # PipelineId filter matched nothing (found by an audit of the seeds).
    t = dlc.translate_dlc(cpu_job(Settings={"PipelineId": "flow-1", "Caller": "sdk"}))
    assert t.errors == []
    assert EnvVar(name=dlc.PIPELINE_LABEL, value="flow-1") in t.spec.labels
    assert paths(t.warnings) == ["$.Settings.Caller"]
    assert listing(PipelineId="flow-1").where[f"labels.{dlc.PIPELINE_LABEL}"] == "flow-1"
    refused = dlc.translate_dlc(cpu_job(Settings="flow-1"))
    assert paths(refused.errors) == ["$.Settings"]
