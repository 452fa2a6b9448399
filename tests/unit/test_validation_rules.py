"""Every OpenPAI §4 rule and canonical rule (one failing and one passing case each),
the cluster checks, decide(), and the validate_job handler over in-memory fakes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainyard_common.cluster import ClusterSpec, NodeSpec, QueueQuota, QueueSpec
from trainyard_common.dialects import openpai_warnings, translate, validate_native, validate_openpai
from trainyard_common.events import (
    Event,
    FieldIssue,
    JobAccepted,
    JobRejected,
    JobSubmitted,
    derived_id,
)
from trainyard_common.jobspec import JobSpec, PortSpec, Resources, RoleSpec
from trainyard_validation.adapters.names import InMemoryNameRegistry
from trainyard_validation.domain.rules import check_against_cluster, decide, locator
from trainyard_validation.handlers import EVENT_HANDLERS, Deps, validate_job

from ..seeds import seed_job
from ..support.bus import RECEIVED
from ..support.payloads import openpai_v2

DELETE = object()


def base() -> dict[str, Any]:
    """The seed's helloworld job (without the form's tmp block)."""
    payload = seed_job("helloworld_16be675e")
    del payload["tmp"]
    return payload


def with_(*changes: tuple[str, Any]) -> dict[str, Any]:
    """base() with dotted paths set (or DELETEd): ("taskRoles.0.memoryMB", 50)."""
    payload = base()
    for path, value in changes:
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        parent: Any = payload
        for part in parts[:-1]:
            parent = parent[part]
        if value is DELETE:
            del parent[parts[-1]]
        elif isinstance(parent, list) and parts[-1] == len(parent):
            parent.append(copy.deepcopy(value))
        else:
            parent[parts[-1]] = copy.deepcopy(value)
    return payload


ROLE = "$.taskRoles[0]"
PORT = "$.taskRoles[0].portList[0]"
JUPYTER_PORT = [{"label": "jupyter", "beginAt": 0, "portNumber": 1}]
SECOND_ROLE = {
    "name": "task_1",
    "taskNumber": 1,
    "cpuNumber": 1,
    "memoryMB": 100,
    "gpuNumber": 0,
    "command": "x",
}

# (rule, failing payload, expected error path, passing payload)
OPENPAI_RULES = [
    ("jobName required", with_(("jobName", DELETE)), "$.jobName", base()),
    ("jobName string", with_(("jobName", 42)), "$.jobName", with_(("jobName", "job"))),
    ("jobName regex", with_(("jobName", "my job!")), "$.jobName", with_(("jobName", "a-b.c_d~E9"))),
    (
        "jobName no trailing newline",
        with_(("jobName", "job\n")),
        "$.jobName",
        with_(("jobName", "job")),
    ),
    ("image required", with_(("image", DELETE)), "$.image", base()),
    ("image non-empty", with_(("image", "")), "$.image", with_(("image", "busybox"))),
    ("image string", with_(("image", ["busybox"])), "$.image", base()),
    ("authFile string", with_(("authFile", 1)), "$.authFile", with_(("authFile", "hdfs://a"))),
    ("dataDir string", with_(("dataDir", {})), "$.dataDir", with_(("dataDir", DELETE))),
    ("outputDir string", with_(("outputDir", True)), "$.outputDir", with_(("outputDir", "o"))),
    ("codeDir string", with_(("codeDir", 0)), "$.codeDir", with_(("codeDir", "c"))),
    (
        "virtualCluster string",
        with_(("virtualCluster", 3)),
        "$.virtualCluster",
        with_(("virtualCluster", "vc1")),
    ),
    ("taskRoles required", with_(("taskRoles", DELETE)), "$.taskRoles", base()),
    ("taskRoles list", with_(("taskRoles", {"name": "x"})), "$.taskRoles", base()),
    ("taskRoles at least one", with_(("taskRoles", [])), "$.taskRoles", base()),
    ("taskRole object", with_(("taskRoles", ["task_1"])), ROLE, base()),
    ("taskRole.name required", with_(("taskRoles.0.name", DELETE)), f"{ROLE}.name", base()),
    (
        "taskRole.name regex",
        with_(("taskRoles.0.name", "task-1")),
        f"{ROLE}.name",
        with_(("taskRoles.0.name", "task.1~x_Y")),
    ),
    (
        "taskRole.name unique",
        with_(("taskRoles.1", SECOND_ROLE)),
        "$.taskRoles[1].name",
        with_(("taskRoles.1", {**SECOND_ROLE, "name": "task_2"})),
    ),
    (
        "taskNumber required",
        with_(("taskRoles.0.taskNumber", DELETE)),
        f"{ROLE}.taskNumber",
        base(),
    ),
    (
        "taskNumber >= 1",
        with_(("taskRoles.0.taskNumber", 0)),
        f"{ROLE}.taskNumber",
        with_(("taskRoles.0.taskNumber", 1)),
    ),
    (
        "taskNumber not boolean",
        with_(("taskRoles.0.taskNumber", True)),
        f"{ROLE}.taskNumber",
        with_(("taskRoles.0.taskNumber", 2)),
    ),
    (
        "taskNumber integral",
        with_(("taskRoles.0.taskNumber", 2.5)),
        f"{ROLE}.taskNumber",
        with_(("taskRoles.0.taskNumber", 2.0)),
    ),
    (
        "taskNumber not a string",
        with_(("taskRoles.0.taskNumber", "2")),
        f"{ROLE}.taskNumber",
        base(),
    ),
    (
        "taskNumber not huge",
        with_(("taskRoles.0.taskNumber", 10**30)),
        f"{ROLE}.taskNumber",
        with_(("taskRoles.0.taskNumber", 1000)),
    ),
    ("cpuNumber required", with_(("taskRoles.0.cpuNumber", DELETE)), f"{ROLE}.cpuNumber", base()),
    (
        "cpuNumber >= 1",
        with_(("taskRoles.0.cpuNumber", 0)),
        f"{ROLE}.cpuNumber",
        with_(("taskRoles.0.cpuNumber", 4)),
    ),
    ("memoryMB required", with_(("taskRoles.0.memoryMB", DELETE)), f"{ROLE}.memoryMB", base()),
    (
        "memoryMB >= 100",
        with_(("taskRoles.0.memoryMB", 99)),
        f"{ROLE}.memoryMB",
        with_(("taskRoles.0.memoryMB", 100), ("taskRoles.0.shmMB", 64)),
    ),
    ("memoryMB integer", with_(("taskRoles.0.memoryMB", None)), f"{ROLE}.memoryMB", base()),
    (
        "shmMB >= 0",
        with_(("taskRoles.0.shmMB", -1)),
        f"{ROLE}.shmMB",
        with_(("taskRoles.0.shmMB", DELETE)),
    ),
    (
        "shmMB integer",
        with_(("taskRoles.0.shmMB", "64")),
        f"{ROLE}.shmMB",
        with_(("taskRoles.0.shmMB", 0)),
    ),
    ("gpuNumber required", with_(("taskRoles.0.gpuNumber", DELETE)), f"{ROLE}.gpuNumber", base()),
    (
        "gpuNumber >= 0",
        with_(("taskRoles.0.gpuNumber", -1)),
        f"{ROLE}.gpuNumber",
        with_(("taskRoles.0.gpuNumber", 0)),
    ),
    (
        "storageGB >= 0",
        with_(("taskRoles.0.storageGB", -5)),
        f"{ROLE}.storageGB",
        with_(("taskRoles.0.storageGB", DELETE)),
    ),
    (
        "portList list",
        with_(("taskRoles.0.portList", {"label": "x"})),
        f"{ROLE}.portList",
        with_(("taskRoles.0.portList", DELETE)),
    ),
    (
        "portList entry object",
        with_(("taskRoles.0.portList", [7])),
        PORT,
        with_(("taskRoles.0.portList", JUPYTER_PORT)),
    ),
    (
        "port label required",
        with_(("taskRoles.0.portList", [{"beginAt": 0, "portNumber": 1}])),
        f"{PORT}.label",
        with_(("taskRoles.0.portList", JUPYTER_PORT)),
    ),
    (
        "port label regex",
        with_(("taskRoles.0.portList", [{"label": "my port", "beginAt": 0, "portNumber": 1}])),
        f"{PORT}.label",
        with_(("taskRoles.0.portList", [{"label": "a.b_c~1", "beginAt": 0, "portNumber": 1}])),
    ),
    (
        "port label unique",
        with_(("taskRoles.0.portList", JUPYTER_PORT * 2)),
        "$.taskRoles[0].portList[1].label",
        with_(("taskRoles.0.portList", [*JUPYTER_PORT, {**JUPYTER_PORT[0], "label": "ssh"}])),
    ),
    (
        "beginAt required",
        with_(("taskRoles.0.portList", [{"label": "a", "portNumber": 1}])),
        f"{PORT}.beginAt",
        with_(("taskRoles.0.portList", JUPYTER_PORT)),
    ),
    (
        "beginAt >= 0",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": -1, "portNumber": 1}])),
        f"{PORT}.beginAt",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 8080, "portNumber": 1}])),
    ),
    (
        "beginAt a port",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 70000, "portNumber": 1}])),
        f"{PORT}.beginAt",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 65535, "portNumber": 1}])),
    ),
    (
        "portNumber required",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 0}])),
        f"{PORT}.portNumber",
        with_(("taskRoles.0.portList", JUPYTER_PORT)),
    ),
    (
        "portNumber >= 1",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 0, "portNumber": 0}])),
        f"{PORT}.portNumber",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 0, "portNumber": 3}])),
    ),
    (
        "fixed range below 65536",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 65535, "portNumber": 2}])),
        f"{PORT}.portNumber",
        with_(("taskRoles.0.portList", [{"label": "a", "beginAt": 65534, "portNumber": 2}])),
    ),
    ("command required", with_(("taskRoles.0.command", DELETE)), f"{ROLE}.command", base()),
    (
        "command not blank",
        with_(("taskRoles.0.command", "  \n")),
        f"{ROLE}.command",
        with_(("taskRoles.0.command", "python train.py")),
    ),
    ("command string", with_(("taskRoles.0.command", ["python"])), f"{ROLE}.command", base()),
    (
        "minFailedTaskCount >= 1",
        with_(("taskRoles.0.minFailedTaskCount", 0)),
        f"{ROLE}.minFailedTaskCount",
        with_(("taskRoles.0.minFailedTaskCount", 1)),
    ),
    (
        "minFailedTaskCount integer",
        with_(("taskRoles.0.minFailedTaskCount", "1")),
        f"{ROLE}.minFailedTaskCount",
        with_(("taskRoles.0.minFailedTaskCount", DELETE)),
    ),
    (
        "minSucceededTaskCount >= 1",
        with_(("taskRoles.0.minSucceededTaskCount", -2)),
        f"{ROLE}.minSucceededTaskCount",
        with_(("taskRoles.0.minSucceededTaskCount", 1)),
    ),
    (
        "minSucceededTaskCount integer",
        with_(("taskRoles.0.minSucceededTaskCount", False)),
        f"{ROLE}.minSucceededTaskCount",
        with_(("taskRoles.0.minSucceededTaskCount", None)),
    ),
    (
        # OpenPAI's schema: at most taskNumber (the seed's role has 1 task).
        "minSucceededTaskCount <= taskNumber",
        with_(("taskRoles.0.minSucceededTaskCount", 3)),
        f"{ROLE}.minSucceededTaskCount",
        with_(("taskRoles.0.minSucceededTaskCount", 1)),
    ),
    ("gpuType string", with_(("gpuType", ["TITANX"])), "$.gpuType", with_(("gpuType", DELETE))),
    ("retryCount >= -2", with_(("retryCount", -3)), "$.retryCount", with_(("retryCount", -2))),
    # OpenPAI's config/job.js: min(-2), no maximum (the seed: "not below 0"); an int32.
    (
        "retryCount <= INT_MAX",
        with_(("retryCount", 2**31)),
        "$.retryCount",
        with_(("retryCount", 11)),
    ),
    (
        "retryCount integer",
        with_(("retryCount", "3")),
        "$.retryCount",
        with_(("retryCount", DELETE)),
    ),
    (
        "jobEnvs object",
        with_(("jobEnvs", ["A=1"])),
        "$.jobEnvs",
        with_(("jobEnvs", {"A": 1, "B": "x"})),
    ),
    (
        "jobEnvs.isDebug boolean",
        with_(("jobEnvs", {"isDebug": "yes"})),
        "$.jobEnvs.isDebug",
        with_(("jobEnvs", {"isDebug": True})),
    ),
    ("extras object", with_(("extras", "x")), "$.extras", with_(("extras", {"a": [1]}))),
]


@pytest.mark.parametrize(
    ("rule", "bad", "path", "good"), OPENPAI_RULES, ids=[r[0] for r in OPENPAI_RULES]
)
def test_openpai_rule(rule: str, bad: dict[str, Any], path: str, good: dict[str, Any]) -> None:
    errors = validate_openpai(bad)
    assert [e.path for e in errors] == [path], errors
    key = path.rsplit(".", 1)[-1].split("[")[0]
    assert key in errors[0].message or "task role" in errors[0].message, errors[0].message
    assert validate_openpai(good) == []
    # translate reports exactly the same errors
    assert translate(bad).errors == errors


def test_seed_passes_every_rule() -> None:
    assert validate_openpai(base()) == []
    assert openpai_warnings(base()) == []


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (with_(("taskRoles.0.shmMB", 9000)), "$.taskRoles[0].shmMB"),
        (with_(("jobEnvs", {"CFG": {"a": 1}})), "$.jobEnvs.CFG"),
        (with_(("queue", "x")), "$.queue"),
    ],
)
def test_openpai_warnings_are_not_errors(payload: dict[str, Any], path: str) -> None:
    assert validate_openpai(payload) == []
    assert [w.path for w in openpai_warnings(payload)] == [path]


def test_many_errors_are_all_reported() -> None:
    payload = with_(("jobName", ""), ("taskRoles.0.memoryMB", 1), ("taskRoles.0.command", ""))
    assert {e.path for e in validate_openpai(payload)} == {
        "$.jobName",
        "$.taskRoles[0].memoryMB",
        "$.taskRoles[0].command",
    }


# ---------------------------------------------------------------------- native rules


def good_spec() -> JobSpec:
    return JobSpec(
        name="train",
        roles=[RoleSpec(name="worker", command="python t.py", ports=[PortSpec(label="http")])],
    )


def spec_with(**changes: Any) -> JobSpec:
    data = good_spec().model_dump()
    for path, value in changes.items():
        parts = [int(p) if p.isdigit() else p for p in path.split("__")]
        parent: Any = data
        for part in parts[:-1]:
            parent = parent[part]
        parent[parts[-1]] = value
    return JobSpec.model_validate(data)


R0 = "$.roles[0]"
NATIVE_RULES = [
    ("name required", {"name": ""}, "$.name", {"name": "x"}),
    ("name regex", {"name": "a b"}, "$.name", {"name": "a-b.c~d_e"}),
    ("at least one role", {"roles": []}, "$.roles", {}),
    ("role name regex", {"roles__0__name": "w-1"}, f"{R0}.name", {"roles__0__name": "w.1"}),
    ("replicas >= 1", {"roles__0__replicas": 0}, f"{R0}.replicas", {"roles__0__replicas": 1}),
    (
        "cpu > 0",
        {"roles__0__resources__cpu": 0},
        f"{R0}.resources.cpu",
        {"roles__0__resources__cpu": 0.5},
    ),
    (
        "cpu finite",
        {"roles__0__resources__cpu": float("inf")},
        f"{R0}.resources.cpu",
        {"roles__0__resources__cpu": 64},
    ),
    (
        "memory_mb >= 100",
        {"roles__0__resources__memory_mb": 99},
        f"{R0}.resources.memory_mb",
        {"roles__0__resources__memory_mb": 100},
    ),
    (
        "gpu >= 0",
        {"roles__0__resources__gpu": -1},
        f"{R0}.resources.gpu",
        {"roles__0__resources__gpu": 0.5},
    ),
    ("command non-empty", {"roles__0__command": " "}, f"{R0}.command", {"roles__0__command": "x"}),
    (
        "min_failed null or >= 1",
        {"roles__0__min_failed": 0},
        f"{R0}.min_failed",
        {"roles__0__min_failed": None},
    ),
    (
        "min_succeeded null or >= 1",
        {"roles__0__min_succeeded": 0},
        f"{R0}.min_succeeded",
        {"roles__0__min_succeeded": 2},
    ),
    ("priority 1..9", {"priority": 10}, "$.priority", {"priority": 9}),
    ("priority 1..9 low", {"priority": 0}, "$.priority", {"priority": 1}),
    (
        "port label regex",
        {"roles__0__ports__0__label": "a b"},
        f"{R0}.ports[0].label",
        {"roles__0__ports__0__label": "ab"},
    ),
    (
        "port begin_at range",
        {"roles__0__ports__0__begin_at": 70000},
        f"{R0}.ports[0].begin_at",
        {"roles__0__ports__0__begin_at": 8080},
    ),
    (
        "port count >= 1",
        {"roles__0__ports__0__count": 0},
        f"{R0}.ports[0].count",
        {"roles__0__ports__0__count": 2},
    ),
    (
        "port range fits",
        {"roles__0__ports__0__begin_at": 65535, "roles__0__ports__0__count": 2},
        f"{R0}.ports[0].count",
        {"roles__0__ports__0__begin_at": 65534, "roles__0__ports__0__count": 2},
    ),
]


@pytest.mark.parametrize(
    ("rule", "bad", "path", "good"), NATIVE_RULES, ids=[r[0] for r in NATIVE_RULES]
)
def test_native_rule(rule: str, bad: dict[str, Any], path: str, good: dict[str, Any]) -> None:
    errors = validate_native(spec_with(**bad))
    assert [e.path for e in errors] == [path], errors
    assert validate_native(spec_with(**good)) == []


@pytest.mark.parametrize(
    ("bad", "path", "said"),
    [
        ({"roles__0__replicas": 2**40}, f"{R0}.replicas", "replicas must be at most 2147483647"),
        ({"roles__0__replicas": 0}, f"{R0}.replicas", "replicas must be at least 1, got 0"),
        ({"roles__0__resources__cpu": 1e30}, f"{R0}.resources.cpu", "cpu must be at most"),
        ({"roles__0__resources__cpu": 0.0}, f"{R0}.resources.cpu", "cpu must be more than 0"),
        ({"roles__0__resources__gpu": 1e30}, f"{R0}.resources.gpu", "gpu must be at most"),
        ({"roles__0__min_failed": 2**40}, f"{R0}.min_failed", "must be null or at most"),
        ({"max_running_minutes": 2**40}, "$.max_running_minutes", "must be at most 2147483647"),
        ({"max_running_minutes": 0}, "$.max_running_minutes", "must be at least 1, got 0"),
        # Past a float's range: math.isfinite raised OverflowError, a job rejected as
        # "could not be translated" instead of told its field.
        ({"roles__0__replicas": 10**400}, f"{R0}.replicas", "replicas must be at most"),
        ({"roles__0__resources__memory_mb": 10**400}, f"{R0}.resources.memory_mb", "at most"),
        ({"max_running_minutes": -(10**400)}, "$.max_running_minutes", "must be at least 1"),
        # Elastic bounds were not checked at all: -5 was taken, 10**310 a 500 at intake.
        ({"roles__0__min_replicas": -5}, f"{R0}.min_replicas", "must be null or at least 1"),
        ({"roles__0__min_replicas": 10**310}, f"{R0}.min_replicas", "must be null or at most"),
        ({"roles__0__max_replicas": 0}, f"{R0}.max_replicas", "must be null or at least 1"),
        (
            {"roles__0__min_replicas": 4, "roles__0__max_replicas": 2},
            f"{R0}.max_replicas",
            "max_replicas (2) must not be less than min_replicas (4)",
        ),
    ],
)
def test_a_number_out_of_range_is_told_which_end_it_passed(
    bad: dict[str, Any], path: str, said: str
) -> None:
    """Too large was told "must be at least 1" (or "more than 0"): the lower bound it
    had not broken."""
    [error] = validate_native(spec_with(**bad))
    assert error.path == path and said in error.message and error.code == "range", error


def test_a_secret_that_holds_the_views_mask_is_refused() -> None:
    # A job cloned from its own view (the console's Clone) ran with '******' as its
    # credentials, failing later and less clearly.
    payload = {
        "name": "cloned",
        "secrets": [{"name": "token", "value": "******"}, {"name": "other", "value": "s3cret"}],
        "roles": [{"name": "w", "command": "true"}],
    }
    result = decide(submitted(payload), CLUSTER)
    assert isinstance(result, JobRejected)
    [error] = result.errors
    assert (error.path, error.code) == ("$.secrets", "hidden")
    assert "'token'" in error.message and "write the value again" in error.message
    # Through OpenPAI v2 too: its secrets are hidden in its view the same way.
    job = openpai_v2(secrets={"token": "******"})
    result = decide(submitted(job), CLUSTER)
    assert isinstance(result, JobRejected)
    assert "hidden" in [e.code for e in result.errors], result.errors


def test_native_unique_names() -> None:
    spec = good_spec()
    role = spec.roles[0]
    dup = spec.model_copy(update={"roles": [role, role]})
    assert [e.path for e in validate_native(dup)] == ["$.roles[1].name"]
    ports = role.model_copy(update={"ports": [PortSpec(label="a"), PortSpec(label="a")]})
    assert [e.path for e in validate_native(spec.model_copy(update={"roles": [ports]}))] == [
        "$.roles[0].ports[1].label"
    ]
    renamed = role.model_copy(update={"name": "other"})
    assert validate_native(spec.model_copy(update={"roles": [role, renamed]})) == []


# -------------------------------------------------------------------- cluster checks

CLUSTER = ClusterSpec(
    nodes=[
        NodeSpec(name="big", cpu=32, memory_mb=100_000, gpus=2, gpu_type="TITANX"),
        NodeSpec(name="p100", cpu=8, memory_mb=16_000, gpus=4, gpu_type="P100"),
        NodeSpec(name="cpu", cpu=64, memory_mb=50_000),
    ],
    queues=["default", "research"],
)


def cluster_issues(*changes: tuple[str, Any], cluster: ClusterSpec = CLUSTER) -> list[FieldIssue]:
    """The cluster checks of the seed job with ``changes``, located in that payload."""
    event = submitted(with_(*changes))
    assert event.translation_errors == []
    return check_against_cluster(event.spec, cluster, locator(event))


def test_seed_fits_the_cluster() -> None:
    assert cluster_issues() == []


def test_a_queue_declared_with_a_quota_is_a_queue() -> None:
    # A cluster file may give a queue as a name or as a spec with its quota (mypy found
    # the check comparing a name against the specs, and joining specs as strings).
    cluster = CLUSTER.model_copy(
        update={"queues": ["default", QueueSpec(name="research", quota=QueueQuota(gpus=2))]}
    )
    assert cluster_issues(("virtualCluster", "research"), cluster=cluster) == []
    [issue] = cluster_issues(("virtualCluster", "nope"), cluster=cluster)
    assert issue.code == "unknown_queue" and "default, research" in issue.message


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ((("virtualCluster", "nope"),), "$.virtualCluster", ["nope", "default, research"]),
        ((("gpuType", "V100"),), "$.gpuType", ["V100", "P100, TITANX"]),
        ((("taskRoles.0.cpuNumber", 100),), "$.taskRoles[0].cpuNumber", ["100 CPU", "64 CPU"]),
        (
            (("taskRoles.0.memoryMB", 200_000),),
            "$.taskRoles[0].memoryMB",
            ["200000 MB", "100000 MB"],
        ),
        ((("taskRoles.0.gpuNumber", 3),), "$.taskRoles[0].gpuNumber", ["3 GPU (TITANX)", "is 2"]),
        # each part fits some node, the combination none: 33 CPUs only on the CPU node
        ((("taskRoles.0.cpuNumber", 33),), "$.taskRoles[0]", ["33 CPU, 8192 MB, 1 GPU (TITANX)"]),
    ],
)
def test_cluster_rule(changes: tuple[tuple[str, Any], ...], path: str, words: list[str]) -> None:
    issues = cluster_issues(*changes)
    assert [i.path for i in issues] == [path], issues
    for word in words:
        assert word in issues[0].message, issues[0].message


@pytest.mark.parametrize(
    "changes",
    [
        (("virtualCluster", "research"),),
        (("gpuType", "P100"), ("taskRoles.0.gpuNumber", 4), ("taskRoles.0.memoryMB", 16_000)),
        (("taskRoles.0.cpuNumber", 64), ("taskRoles.0.gpuNumber", 0)),
        (("gpuType", DELETE), ("taskRoles.0.gpuNumber", 4)),
        (("gpuType", "V100"), ("taskRoles.0.gpuNumber", 0)),  # asks for no GPU of it
    ],
)
def test_cluster_passing(changes: tuple[tuple[str, Any], ...]) -> None:
    assert cluster_issues(*changes) == []


def test_cluster_paths_for_native() -> None:
    spec = good_spec()
    big = spec.roles[0].model_copy(update={"resources": Resources(gpu=1, gpu_type="A100")})
    spec = spec.model_copy(update={"roles": [big], "queue": "q"})
    event = submitted(spec.model_dump(mode="json"))
    assert [i.path for i in check_against_cluster(spec, CLUSTER, locator(event))] == [
        "$.queue",
        "$.roles[0].resources.gpu_type",
    ]
    # A producer that sent a bare spec (no original) is located in the spec's own JSON.
    bare = event.model_copy(update={"original": None})
    assert [i.path for i in check_against_cluster(spec, CLUSTER, locator(bare))] == [
        "$.queue",
        "$.roles[0].resources.gpu_type",
    ]


def test_empty_cluster() -> None:
    issues = cluster_issues(("gpuType", DELETE), cluster=ClusterSpec(nodes=[]))
    assert [i.path for i in issues] == ["$.taskRoles[0]"]
    assert "no nodes" in issues[0].message


# ------------------------------------- cluster problems, located in each dialect's payload
#
# The cluster checks run on the canonical job; each problem must still point at the
# field as the user wrote it, in the user's own layout (roles by name, by position in a
# list, or spread over top-level fields).


def _v2_role(gpu: int = 0, memory: int = 1024) -> dict[str, Any]:
    return {
        "instances": 1,
        "dockerImage": "img",
        "resourcePerInstance": {"cpu": 1, "memoryMB": memory, "gpu": gpu},
        "commands": ["python train.py"],
    }


def _openpai_v2(**roles: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": 2,
        "name": "v2job",
        "type": "job",
        "prerequisites": [{"type": "dockerimage", "name": "img", "uri": "python:3.11"}],
        "taskRoles": roles,
        "defaults": {"virtualCluster": "default"},
    }


def _ti(**fields: Any) -> dict[str, Any]:
    return {
        "name": "tijob",
        "cluster": "default",
        "command": ["python", "train.py"],
        "workerCount": 2,
        "workerType": "1U2G1P",
        **fields,
    }


def _container(name: str = "main", **resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11",
        "command": ["python", "train.py"],
        "resources": resources,
    }


def _t9k_tf(worker: dict[str, Any], **spec: Any) -> dict[str, Any]:
    chief = _container("tensorflow", requests={"cpu": "1", "memory": "1Gi"})
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "TensorFlowTrainingJob",
        "metadata": {"name": "tf", "namespace": "demo"},
        "spec": {
            "replicaSpecs": [
                {"type": "chief", "replicas": 1, "template": {"spec": {"containers": [chief]}}},
                {"type": "worker", "replicas": 2, "template": {"spec": {"containers": worker}}},
            ],
            **spec,
        },
    }


def _dlc(*specs: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "DisplayName": "dlc-job",
        "JobType": "PyTorchJob",
        "UserCommand": "python t.py",
        "JobSpecs": list(specs),
        **fields,
    }


def _dlc_spec(kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "Type": kind,
        "Image": "python:3.11",
        "PodCount": 1,
        "ResourceConfig": {"CPU": "2", "Memory": "4Gi"},
        **fields,
    }


LIMITS_GPU = ".template.spec.containers[0].resources.limits['nvidia.com/gpu']"


@pytest.mark.parametrize(
    ("payload", "path", "code"),
    [
        # OpenPAI v1: roles in a list, by position
        (
            with_(("taskRoles.1", {**SECOND_ROLE, "name": "second", "gpuNumber": 3})),
            "$.taskRoles[1].gpuNumber",
            "no_fit",
        ),
        # OpenPAI v2: task roles are a map keyed by name (the bad one is not the first)
        (
            _openpai_v2(ps=_v2_role(), worker=_v2_role(memory=200_000)),
            "$.taskRoles.worker.resourcePerInstance.memoryMB",
            "no_fit",
        ),
        (
            _openpai_v2(ps=_v2_role(), worker=_v2_role(gpu=8)),
            "$.taskRoles.worker.resourcePerInstance.gpu",
            "no_fit",
        ),
        (
            {**_openpai_v2(worker=_v2_role()), "defaults": {"virtualCluster": "nope"}},
            "$.defaults.virtualCluster",
            "unknown_queue",
        ),
        # TI: each role's resources come from its own machine-type field
        (_ti(workerType="1U2G8P"), "$.workerType", "no_fit"),
        # a master with no parameter servers is the second role; still its own field
        (_ti(masterType="128U2G0P"), "$.masterType", "no_fit"),
        (
            _ti(parameterServerCount=1, parameterServerType="1U200G0P"),
            "$.parameterServerType",
            "no_fit",
        ),
        (_ti(cluster="nope"), "$.cluster", "unknown_queue"),
        # T9k: the replica spec of that type, the training container, limits or requests
        (
            _t9k_tf([_container(limits={"nvidia.com/gpu": 8})]),
            "$.spec.replicaSpecs[1]" + LIMITS_GPU,
            "no_fit",
        ),
        (
            _t9k_tf([_container(requests={"memory": "200Gi"})]),
            "$.spec.replicaSpecs[1].template.spec.containers[0].resources.requests.memory",
            "no_fit",
        ),
        # the kind's own container (named tensorflow) is the task, not containers[0]
        (
            _t9k_tf([_container("sidecar"), _container("tensorflow", limits={"memory": "200Gi"})]),
            "$.spec.replicaSpecs[1].template.spec.containers[1].resources.limits.memory",
            "no_fit",
        ),
        (
            _t9k_tf([_container()], scheduler={"t9kScheduler": {"queue": "nope"}}),
            "$.spec.scheduler.t9kScheduler.queue",
            "unknown_queue",
        ),
        (
            {
                "apiVersion": "batch.tensorstack.dev/v1beta1",
                "kind": "DeepSpeedJob",
                "metadata": {"name": "ds"},
                "spec": {
                    "worker": {
                        "replicas": 2,
                        "template": {
                            "spec": {
                                "containers": [_container("worker", limits={"nvidia.com/gpu": 8})]
                            }
                        },
                    }
                },
            },
            "$.spec.worker" + LIMITS_GPU,
            "no_fit",
        ),
        # Kubeflow: replica specs keyed by type
        (
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": "pt"},
                "spec": {
                    "pytorchReplicaSpecs": {
                        "Worker": {
                            "replicas": 2,
                            "template": {
                                "spec": {
                                    "containers": [
                                        _container("pytorch", limits={"nvidia.com/gpu": 8})
                                    ]
                                }
                            },
                        }
                    }
                },
            },
            "$.spec.pytorchReplicaSpecs.Worker" + LIMITS_GPU,
            "no_fit",
        ),
        # DLC: the JobSpec of that Type; a figure from the instance type is the EcsSpec
        (
            _dlc(
                _dlc_spec("Master"),
                _dlc_spec("Worker", ResourceConfig={"CPU": "2", "Memory": "4Gi", "GPU": "8"}),
            ),
            "$.JobSpecs[1].ResourceConfig.GPU",
            "no_fit",
        ),
        (
            _dlc(_dlc_spec("Worker", EcsSpec="ecs.gn6e-c12g1.3xlarge", ResourceConfig={})),
            "$.JobSpecs[0].EcsSpec",
            "unknown_gpu_type",
        ),
        (_dlc(_dlc_spec("Worker"), ResourceId="nope"), "$.ResourceId", "unknown_queue"),
        # native: roles found by name in the payload's list
        (
            {
                "name": "n",
                "roles": [
                    {"name": "a", "command": "x"},
                    {"name": "b", "command": "x", "resources": {"gpu": 1, "gpu_type": "A100"}},
                ],
            },
            "$.roles[1].resources.gpu_type",
            "unknown_gpu_type",
        ),
    ],
)
def test_cluster_problems_point_at_the_field_as_written(
    payload: dict[str, Any], path: str, code: str
) -> None:
    event = submitted(payload)
    assert event.translation_errors == [], event.translation_errors
    result = decide(event, CLUSTER)
    assert isinstance(result, JobRejected), result
    assert [(e.path, e.code) for e in result.errors] == [(path, code)], result.errors


def test_name_taken_points_at_each_dialects_name_field() -> None:
    from trainyard_validation.domain.rules import name_taken

    assert name_taken(submitted(_t9k_tf([_container()]))).errors[0].path == "$.metadata.name"
    assert name_taken(submitted(_ti())).errors[0].path == "$.name"
    assert name_taken(submitted(base())).errors[0].path == "$.jobName"


# ----------------------------------------------------------------------------- decide


def submitted(
    payload: Any, user: str = "alice", job_id: str = "job1", event_id: str = "ev1"
) -> JobSubmitted:
    t = translate(payload, user=user)
    return JobSubmitted(
        event_id=event_id,
        job_id=job_id,
        spec=t.spec,
        dialect=t.dialect,
        dialect_key=t.key,
        original=payload if isinstance(payload, dict) else None,
        translation_errors=t.errors,
        warnings=t.warnings,
    )


def test_decide_accepts_the_seed() -> None:
    result = decide(submitted(base()), CLUSTER)
    assert isinstance(result, JobAccepted)
    assert result.event_id == derived_id("ev1", "validated")
    assert result.job_id == "job1"
    assert result.spec.user == "alice"
    # defaults filled: every role names its image
    assert result.spec.roles[0].image == "sitonholy/tensorflow:16.04-9.0-3.5-1.8.0"


def test_only_a_submission_that_held_no_job_hides_the_rules_findings() -> None:
    # A translation error at "$" is not always "no job here": the rules' own findings
    # about the fields still count then.
    event = submitted({"name": "x y", "roles": [{"name": "w", "command": "true"}]})
    event = event.model_copy(
        update={"translation_errors": [FieldIssue(path="$", message="odd", code="internal")]}
    )
    result = decide(event, CLUSTER)
    assert isinstance(result, JobRejected) and "$.name" in [e.path for e in result.errors]
    event = event.model_copy(
        update={"translation_errors": [FieldIssue(path="$", message="big", code="too_large")]}
    )
    assert [e.path for e in decide(event, CLUSTER).errors] == ["$"]  # type: ignore[union-attr]


def test_a_rule_that_raises_rejects_the_job_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug in a rule raised on every delivery: the job stayed submitted, its name held,
    # until the dead letters, and its user was never told.
    def broken(_submitted: JobSubmitted) -> list:
        raise KeyError("roles")

    monkeypatch.setattr("trainyard_validation.domain.rules.rule_errors", broken)
    result = decide(submitted(base()), CLUSTER)
    assert isinstance(result, JobRejected) and result.event_id == derived_id("ev1", "validated")
    [error] = result.errors
    assert (error.path, error.code) == ("$", "internal")
    assert error.message == "the job could not be validated: KeyError('roles')"


def test_decide_is_deterministic() -> None:
    event = submitted(base())
    first, second = decide(event, CLUSTER), decide(event, CLUSTER)
    # occurred_at may differ; the id JetStream deduplicates on and the content may not
    assert first.model_dump(exclude={"occurred_at"}) == second.model_dump(exclude={"occurred_at"})


def test_decide_rejects_rule_errors_without_cluster_noise() -> None:
    result = decide(submitted(with_(("taskRoles.0.memoryMB", 50), ("gpuType", "V100"))), CLUSTER)
    assert isinstance(result, JobRejected)
    assert result.event_id == derived_id("ev1", "validated")
    assert [e.path for e in result.errors] == ["$.taskRoles[0].memoryMB"]


def test_decide_rejects_cluster_misfit() -> None:
    result = decide(submitted(with_(("gpuType", "V100"))), CLUSTER)
    assert isinstance(result, JobRejected)
    assert [e.path for e in result.errors] == ["$.gpuType"]


def test_decide_reruns_rules_on_the_original() -> None:
    # An intake that forgot to translate errors cannot slip a bad job through.
    event = submitted(base()).model_copy(update={"original": with_(("image", ""))})
    result = decide(event, CLUSTER)
    assert isinstance(result, JobRejected) and [e.path for e in result.errors] == ["$.image"]


def test_decide_does_not_repeat_an_error() -> None:
    result = decide(submitted(with_(("taskRoles.0.cpuNumber", 0))), CLUSTER)
    assert isinstance(result, JobRejected)
    assert len(result.errors) == 1


def test_decide_native() -> None:
    ok = good_spec().model_dump(mode="json")
    assert isinstance(decide(submitted(ok), CLUSTER), JobAccepted)
    bad = {**ok, "priority": 42}
    result = decide(submitted(bad), CLUSTER)
    assert isinstance(result, JobRejected) and [e.path for e in result.errors] == ["$.priority"]


def test_decide_keeps_warnings() -> None:
    result = decide(submitted(with_(("taskRoles.0.shmMB", 9000), ("tmp", {}), ("x", 1))), CLUSTER)
    assert isinstance(result, JobAccepted)
    assert [w.path for w in result.warnings] == ["$.x", "$.taskRoles[0].shmMB", "$.image"]


def test_decide_rejects_garbage() -> None:
    result = decide(submitted(["not", "a", "job"]), CLUSTER)
    assert isinstance(result, JobRejected) and result.errors[0].path == "$"


# --------------------------------------------------------------------------- handler


class Published:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> int:
        self.events.append(event)
        return len(self.events)


def deps() -> tuple[Deps, Published, InMemoryNameRegistry]:
    published, names = Published(), InMemoryNameRegistry()
    return Deps(cluster=CLUSTER, names=names, publish=published), published, names


def test_handler_table() -> None:
    assert EVENT_HANDLERS == {JobSubmitted: validate_job}


async def test_handler_accepts_and_claims_the_name() -> None:
    d, published, names = deps()
    await validate_job(submitted(base()), RECEIVED, d)
    assert [type(e) for e in published.events] == [JobAccepted]
    assert names.claims == {"alice~helloworld_16be675e": "job1"}


async def test_handler_redelivery_publishes_the_same_event() -> None:
    d, published, _ = deps()
    event = submitted(base())
    await validate_job(event, RECEIVED, d)
    await validate_job(event, RECEIVED, d)
    first, second = published.events
    assert isinstance(second, JobAccepted)
    assert first.event_id == second.event_id  # JetStream drops the copy


async def test_handler_rejects_a_taken_name_with_the_dialect_path() -> None:
    d, published, _ = deps()
    await validate_job(submitted(base(), job_id="job1", event_id="e1"), RECEIVED, d)
    await validate_job(submitted(base(), job_id="job2", event_id="e2"), RECEIVED, d)
    native = good_spec().model_dump(mode="json")
    await validate_job(submitted(native, job_id="job3", event_id="e3"), RECEIVED, d)
    await validate_job(submitted(native, job_id="job4", event_id="e4"), RECEIVED, d)
    accepted, taken, accepted_native, taken_native = published.events
    assert isinstance(accepted, JobAccepted) and isinstance(accepted_native, JobAccepted)
    assert isinstance(taken, JobRejected) and isinstance(taken_native, JobRejected)
    assert taken.errors == [
        FieldIssue(path="$.jobName", code="name_taken", message=taken.errors[0].message)
    ]
    assert "helloworld_16be675e" in taken.errors[0].message
    assert [e.path for e in taken_native.errors] == ["$.name"]
    assert taken.event_id == derived_id("e2", "validated")


async def test_a_name_claimed_at_intake_is_intakes_to_decide() -> None:
    """Intake refused a used name at once and freed a deleted one: a claimed submission is
    never rejected here for its name, and the record follows the newest holder."""
    d, published, names = deps()
    await validate_job(submitted(base(), job_id="j1", event_id="e1"), RECEIVED, d)
    reused = submitted(base(), job_id="j2", event_id="e2").model_copy(update={"name_claimed": True})
    await validate_job(reused, RECEIVED, d)
    assert [type(e) for e in published.events] == [JobAccepted, JobAccepted]
    assert names.claims == {"alice~helloworld_16be675e": "j2"}


async def test_handler_names_are_per_user() -> None:
    d, published, _ = deps()
    await validate_job(submitted(base(), user="alice", job_id="j1", event_id="e1"), RECEIVED, d)
    await validate_job(submitted(base(), user="bob", job_id="j2", event_id="e2"), RECEIVED, d)
    assert [type(e) for e in published.events] == [JobAccepted, JobAccepted]


async def test_handler_rejection_does_not_claim_the_name() -> None:
    d, published, names = deps()
    await validate_job(
        submitted(with_(("gpuType", "V100")), job_id="j1", event_id="e1"), RECEIVED, d
    )
    assert isinstance(published.events[0], JobRejected)
    assert names.claims == {}
    await validate_job(submitted(base(), job_id="j2", event_id="e2"), RECEIVED, d)
    assert isinstance(published.events[1], JobAccepted)


async def test_handler_publish_failure_propagates_for_redelivery() -> None:
    class Down(Exception):
        pass

    async def failing(event: Event) -> int:
        raise Down

    names = InMemoryNameRegistry()
    event = submitted(base())
    with pytest.raises(Down):
        await validate_job(event, RECEIVED, Deps(cluster=CLUSTER, names=names, publish=failing))
    # the redelivery finds its own claim and publishes the acceptance
    published = Published()
    await validate_job(event, RECEIVED, Deps(cluster=CLUSTER, names=names, publish=published))
    assert [type(e) for e in published.events] == [JobAccepted]


# ------------------------------------------------------------------- the runtime


def _kubeflow(name: str) -> dict[str, Any]:
    import yaml

    from ..seeds import EXAMPLES

    return yaml.safe_load((EXAMPLES / "kubeflow" / name).read_text())


def test_a_container_without_a_command_runs_only_where_images_run() -> None:
    event = submitted(_kubeflow("tfjob-distributed-no-command.yaml"))
    assert event.translation_errors == []
    big = ClusterSpec(nodes=[NodeSpec(name="n", cpu=64, memory_mb=100_000)])
    local = decide(event, big)
    assert isinstance(local, JobRejected)
    assert [(e.path, e.code) for e in local.errors] == [
        ("$.spec.tfReplicaSpecs.Worker.template.spec.containers[0].command", "needs_image")
    ]
    assert "distributed_worker:v20181031-513e107c" in local.errors[0].message
    on_kubernetes = decide(event, big.model_copy(update={"runtime": "kubernetes"}))
    assert isinstance(on_kubernetes, JobAccepted), on_kubernetes


def test_the_local_backend_says_once_that_it_uses_no_image() -> None:
    event = submitted(_kubeflow("pytorchjob-simple.yaml"))
    big = ClusterSpec(nodes=[NodeSpec(name="n", cpu=64, memory_mb=100_000)])
    local = decide(event, big)
    assert isinstance(local, JobAccepted), local
    unused = [w for w in local.warnings if w.code == "image_not_used"]
    assert len(unused) == 1 and "kubeflowkatib/pytorch-mnist:v1beta1-45c5727" in unused[0].message
    on_kubernetes = decide(event, big.model_copy(update={"runtime": "kubernetes"}))
    assert isinstance(on_kubernetes, JobAccepted)
    assert not [w for w in on_kubernetes.warnings if w.code == "image_not_used"]


def test_a_broken_role_is_not_also_reported_as_no_role() -> None:
    """Translation drops a role it cannot read: the rules then see no role at all, and
    saying so as well would send the user after the wrong problem."""
    payload = {"name": "x", "roles": [{"name": "w", "command": "true", "cpu": 1}]}
    result = decide(submitted(payload), CLUSTER)
    assert isinstance(result, JobRejected)
    assert [e.path for e in result.errors] == ["$.roles[0].cpu"]
    # With no role given at all, the rule still speaks.
    empty = decide(submitted({"name": "x", "roles": []}), CLUSTER)
    assert isinstance(empty, JobRejected) and [e.path for e in empty.errors] == ["$.roles"]


def test_a_gang_larger_than_the_whole_cluster_is_refused_at_once() -> None:
    # Each task fits a node, but 500 of them ask for more memory than the cluster has
    # (OpenPAI's own 500-task example: it sat at the head of its queue forever).
    issues = cluster_issues(
        ("gpuType", DELETE), ("taskRoles.0.gpuNumber", 0), ("taskRoles.0.memoryMB", 40_000),
        ("taskRoles.0.taskNumber", 500),
    )  # fmt: skip
    assert [(i.path, i.code) for i in issues] == [("$.taskRoles[0].taskNumber", "never_fits")]
    assert "20000000 MB of memory (the cluster has 166000)" in issues[0].message
    # GPUs in all: 8 tasks of 1 GPU where the cluster has 6.
    [gpus] = cluster_issues(("gpuType", DELETE), ("taskRoles.0.taskNumber", 8))
    assert gpus.code == "never_fits" and "8 GPUs (the cluster has 6)" in gpus.message
    # What fits the cluster as a whole is left to placement (it may wait, never forever).
    assert cluster_issues(("gpuType", DELETE), ("taskRoles.0.taskNumber", 6)) == []
    # Without gang placement (gangAllocation: false) its tasks run as they fit: accepted.
    assert (
        cluster_issues(
            ("gpuType", DELETE),
            ("taskRoles.0.taskNumber", 8),
            ("extras", {"gangAllocation": False}),
        )
        == []
    )


def test_a_queue_named_by_an_alias_is_accepted_into_the_queue_itself() -> None:
    """A PAI-DLC body names its dedicated quota by id (ResourceId); an administrator maps
    quota ids to queues in the cluster file."""
    cluster = CLUSTER.model_copy(
        update={"queues": ["default", QueueSpec(name="team-a", aliases=["quota1ci8g793pgm"])]}
    )
    spec = good_spec().model_copy(update={"queue": "quota1ci8g793pgm"})
    event = submitted(spec.model_dump(mode="json"))
    accepted = decide(event, cluster)
    assert isinstance(accepted, JobAccepted) and accepted.spec.queue == "team-a"
    unknown = decide(
        submitted(good_spec().model_copy(update={"queue": "quota-x"}).model_dump(mode="json")),
        cluster,
    )
    assert isinstance(unknown, JobRejected)
    assert unknown.errors[0].code == "unknown_queue" and "aliases" in unknown.errors[0].message


def test_a_native_job_may_not_lift_its_own_limits() -> None:
    # "uncapped": ["memory", "cpu"] took away memory.max, RLIMIT_DATA and cpu.max (a
    # pod's limits) from any native job: one user's task then took the machine's memory
    # from every other's and the platform's.
    payload = {"name": "n", "image": "i", "roles": [{
        "name": "w", "command": "x",
        "resources": {"memory_mb": 100, "uncapped": ["memory", "cpu"]},
    }]}  # fmt: skip
    t = translate(payload, user="alice")
    assert [(e.path, e.code) for e in t.errors] == [("$.roles[0].resources.uncapped", "forbidden")]
    assert "uncapped" in t.errors[0].message
    cluster = ClusterSpec(nodes=[NodeSpec(name="n", cpu=8, memory_mb=8192, gpus=2)])
    # Validation says the same, of a native job and of a bare spec (no original).
    for original in (payload, None):
        event = JobSubmitted(job_id="j", spec=t.spec, dialect="native", original=original)
        result = decide(event, cluster)
        assert isinstance(result, JobRejected), original
        assert ["$.roles[0].resources.uncapped"] == [e.path for e in result.errors], result.errors
    # What means it still does: TI's 0U0G machine type (the seed's tfplus example).
    ti = {"name": "t", "cluster": "default", "command": ["python", "train.py"],
          "workerCount": 1, "workerType": "0U0G1P", "runtimeVersion": "tia-1.7.0-gpu"}  # fmt: skip
    translated = translate(ti, user="alice")
    assert translated.errors == [], translated.errors
    assert translated.spec.roles[0].resources.uncapped == ["cpu", "memory"]
    event = JobSubmitted(job_id="t", spec=translated.spec, dialect="ti", original=ti)
    assert isinstance(decide(event, cluster), JobAccepted)
