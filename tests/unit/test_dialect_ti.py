"""The Tencent TI dialect (seed tencent-ti-job.md): machine types, the runtime table,
the tfplus rules, roles, the TI view, and totality under arbitrary input."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.dialects import detect, field_path, ti, translate
from trainyard_common.dialects.ti import (
    Machine,
    TableError,
    load_table,
    parse_machine_type,
    render,
    translate_ti,
)
from trainyard_common.jobspec import JobKind

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ti"
TABLE = load_table()


def job(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "mnist", "cluster": "cls-a", "command": ["python", "t.py"]}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def paths(issues: list[Any]) -> list[str]:
    return [i.path for i in issues]


# ---------------------------------------------------------------------- machine types

# The seed's table, row by row: (type, CPU, memory, GPU); None means "the default".
SEED_MACHINE_TYPES = [
    ("1U2G1P", 1, 2, 1),
    ("1U2G0P", 1, 2, 0),
    ("0U0G1P", None, None, 1),
    ("", None, None, 0),
]


@pytest.mark.parametrize(("text", "cpu", "memory_gb", "gpu"), SEED_MACHINE_TYPES)
def test_machine_types_of_the_seed_table(
    text: str, cpu: int | None, memory_gb: int | None, gpu: int
) -> None:
    machine = parse_machine_type(text, TABLE)
    assert machine == Machine(
        cpu=TABLE.default_cpu if cpu is None else float(cpu),
        memory_mb=TABLE.default_memory_mb if memory_gb is None else memory_gb * 1024,
        gpu=gpu,
        # A 0 is the default reserved, the task not held to it; "" is the defaults.
        uncapped=("cpu", "memory") if text.startswith("0U0G") else (),
    )


def test_the_tfplus_examples_0u0g_reserves_the_defaults_and_caps_nothing() -> None:
    """The seed: "每个 worker 分配两张 gpu 卡，不限制 cpu，内存" for --workertype=0U0G2P."""
    spec = translate_ti(
        {"name": "n", "cluster": "c", "command": ["true"], "workerType": "0U0G2P",
         "masterType": "1U0G0P", "workerCount": 3}
    ).spec  # fmt: skip
    roles = {r.name: r.resources for r in spec.roles}
    assert roles["worker"].uncapped == ["cpu", "memory"] and roles["worker"].gpu == 2
    assert roles["worker"].memory_mb == TABLE.default_memory_mb
    assert roles["master"].uncapped == ["memory"] and roles["master"].cpu == 1


def test_shipped_machine_defaults_are_one_cpu_and_two_gb() -> None:
    assert (TABLE.default_cpu, TABLE.default_memory_mb) == (1.0, 2048)


def test_a_missing_type_is_the_empty_type() -> None:
    spec = translate_ti(job(), table=TABLE).spec
    res = spec.role("worker").resources
    assert (res.cpu, res.memory_mb, res.gpu) == (1.0, 2048, 0)


@pytest.mark.parametrize(
    "bad",
    [
        "1U2G",
        "U2G1P",
        "1u2g1p",
        "1U2G1P ",
        "-1U2G1P",
        "1.5U2G1P",
        "1U2G1P1U",
        "abc",
        "99999999999U1G1P",
        "9" * 5000 + "U1G1P",  # int() refuses 4300 digits
        "\u0661U2G1P",  # an Arabic-Indic 1: int() takes it, TI does not
    ],
)
def test_a_malformed_machine_type_is_an_error_naming_the_field(bad: str) -> None:
    t = translate_ti(job(workerType=bad, masterType="1U2G0P"), table=TABLE)
    assert paths(t.errors) == ["$.workerType"]
    assert "aUbGcP" in t.errors[0].message or "more than any machine" in t.errors[0].message


def test_a_machine_type_that_is_not_a_string_is_a_type_error() -> None:
    t = translate_ti(job(parameterServerType=2, parameterServerCount=1), table=TABLE)
    assert [(i.path, i.code) for i in t.errors] == [("$.parameterServerType", "type")]


# ---------------------------------------------------------------------- runtime table

# Every runtimeVersion the seed lists, written out as the seed writes them.
SEED_TRAINING_RUNTIMES = [
    f"{family}-{version}{suffix}"
    for family in ("tf", "tia")
    for version in ("1.4.0", "1.5.0", "1.6.0", "1.7.0")
    for suffix in ("-py3", "-gpu", "", "-gpu-py3")
] + ["tfplus-1.6.0-gpu"]
SEED_SERVING_RUNTIMES = ["tiaserv-1.6.0-cpu", "tiaserv-1.6.0-gpu"]


def test_the_table_holds_exactly_the_seed_runtimes() -> None:
    assert len(SEED_TRAINING_RUNTIMES) == 33
    assert set(TABLE.runtimes) == set(SEED_TRAINING_RUNTIMES) | set(SEED_SERVING_RUNTIMES)


@pytest.mark.parametrize("version", SEED_TRAINING_RUNTIMES)
def test_every_training_runtime_resolves(version: str) -> None:
    gpu = "-gpu" in version
    t = translate_ti(
        job(runtimeVersion=version, workerType="1U2G1P" if gpu else "1U2G0P"), table=TABLE
    )
    assert t.errors == [] and t.warnings == []
    runtime = TABLE.runtimes[version]
    assert t.spec.image == runtime.image and t.spec.image
    assert all(role.image == runtime.image for role in t.spec.roles)
    assert runtime.gpu is gpu
    assert runtime.python == ("3.5" if version.endswith("-py3") else "2.7")
    assert t.spec.kind is JobKind.TENSORFLOW


@pytest.mark.parametrize("version", SEED_SERVING_RUNTIMES)
def test_a_serving_runtime_is_refused_for_a_job(version: str) -> None:
    t = translate_ti(job(runtimeVersion=version), table=TABLE)
    assert [(i.path, i.code) for i in t.errors] == [("$.runtimeVersion", "serving_runtime")]
    assert "training runtime" in t.errors[0].message


def test_an_unknown_runtime_lists_the_training_runtimes() -> None:
    t = translate_ti(job(runtimeVersion="tf-2.0.0"), table=TABLE)
    assert paths(t.errors) == ["$.runtimeVersion"]
    assert "tf-1.7.0-gpu-py3" in t.errors[0].message
    assert "tiaserv" not in t.errors[0].message


def test_no_runtime_means_the_cluster_image_and_tensorflow() -> None:
    t = translate_ti(job(), table=TABLE)
    assert t.errors == [] and t.spec.image is None and t.spec.kind is JobKind.TENSORFLOW


def test_a_gpu_runtime_without_gpus_is_a_warning() -> None:
    t = translate_ti(job(runtimeVersion="tf-1.6.0-gpu", workerType="1U2G0P"), table=TABLE)
    assert t.errors == []
    assert [(i.path, i.code) for i in t.warnings] == [
        ("$.runtimeVersion", "gpu_runtime_without_gpu")
    ]


def test_a_cpu_runtime_with_gpus_is_a_warning_naming_the_gpu_build() -> None:
    t = translate_ti(job(runtimeVersion="tf-1.6.0-py3", workerType="1U2G1P"), table=TABLE)
    assert t.errors == [] and paths(t.warnings) == ["$.workerType"]
    assert "tf-1.6.0-gpu-py3" in t.warnings[0].message


def test_an_override_table_replaces_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runtimes.yaml"
    path.write_text(
        "machine_defaults: {cpu: 4, memory_mb: 8192}\n"
        "runtimes:\n"
        "  tf-1.7.0-py3: {image: registry.local/tf:1.7-py3, kind: tensorflow, python: '3.6',"
        " gpu: false}\n"
    )
    monkeypatch.setenv(ti.RUNTIMES_ENV, str(path))
    ti.configured_table.cache_clear()
    try:
        t = translate(job(runtimeVersion="tf-1.7.0-py3", workerType="0U0G0P"), dialect="ti")
        assert t.errors == [] and t.spec.image == "registry.local/tf:1.7-py3"
        res = t.spec.role("worker").resources
        assert (res.cpu, res.memory_mb) == (4.0, 8192)
        assert paths(translate(job(runtimeVersion="tf-1.6.0"), dialect="ti").errors) == [
            "$.runtimeVersion"
        ]
        path.write_text("runtimes: [not, a, mapping]\n")
        ti.configured_table.cache_clear()
        broken = translate(job(), dialect="ti")
        assert [(i.path, i.code) for i in broken.errors] == [("$.runtimeVersion", "config")]
    finally:
        ti.configured_table.cache_clear()


def test_table_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TableError, match="missing.yaml"):
        load_table(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtimes: {x: {kind: cobol}}\n")
    with pytest.raises(TableError, match="bad.yaml: runtime 'x'"):
        load_table(bad)


# ------------------------------------------------------------------------------ tfplus


def tfplus(**fields: Any) -> dict[str, Any]:
    return job(runtimeVersion="tfplus-1.6.0-gpu", **fields)


def test_tfplus_with_two_gpus_per_worker_is_fine() -> None:
    t = translate_ti(tfplus(workerType="0U0G2P"), table=TABLE)
    assert t.errors == [] and t.warnings == []
    worker = t.spec.role("worker")
    assert worker.replicas == 1  # single machine unless workerCount says otherwise
    assert worker.resources.gpu == 2


@pytest.mark.parametrize("worker_type", ["1U2G0P", "", None])
def test_tfplus_without_a_gpu_per_worker_is_an_error(worker_type: str | None) -> None:
    t = translate_ti(tfplus(workerType=worker_type), table=TABLE)
    assert [(i.path, i.code) for i in t.errors] == [("$.workerType", "tfplus_gpu")]


def test_tfplus_master_needs_a_gpu_too() -> None:
    t = translate_ti(tfplus(workerType="0U0G1P", masterType="4U8G0P"), table=TABLE)
    assert paths(t.errors) == ["$.masterType"]


def test_tfplus_has_no_parameter_servers() -> None:
    t = translate_ti(
        tfplus(workerType="0U0G1P", parameterServerCount=2, parameterServerType="1U2G0P"),
        table=TABLE,
    )
    assert sorted(paths(t.errors)) == ["$.parameterServerCount", "$.parameterServerType"]
    assert {i.code for i in t.errors} == {"tfplus_ps"}
    assert (
        translate_ti(tfplus(workerType="0U0G1P", parameterServerCount=0), table=TABLE).errors == []
    )


def test_tfplus_workers_as_many_as_workerCount() -> None:
    spec = translate_ti(tfplus(workerType="0U0G1P", workerCount=4), table=TABLE).spec
    assert [(r.name, r.replicas) for r in spec.roles] == [("worker", 4)]


# ------------------------------------------------------------------- the seed example


def test_the_seed_tfplus_job() -> None:
    payload = json.loads((EXAMPLES / "test73.json").read_text())
    assert detect(payload) == "ti"
    t = translate(payload, user="alice")
    assert t.dialect == "ti" and t.errors == [] and t.warnings == []
    assert t.key == "cls-rgaisoe4/test73"
    spec = t.spec
    assert (spec.name, spec.user, spec.queue, spec.kind) == (
        "test73",
        "alice",
        "cls-rgaisoe4",
        JobKind.TENSORFLOW,
    )
    assert [(r.name, r.replicas, r.resources.gpu) for r in spec.roles] == [("worker", 3, 2)]
    assert [(label.name, label.value) for label in spec.labels] == [("ti.region", "ap-guangzhou")]
    assert spec.roles[0].command == (
        "python /scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py "
        "--model resnet50 --batch_size 32 --variable_update tfplus"
    )
    assert [p.label for p in spec.roles[0].ports] == ["tfport"]


# ------------------------------------------------------------------------------ roles


def test_master_worker_and_ps_roles() -> None:
    t = translate_ti(
        job(
            masterType="2U4G1P",
            workerType="4U8G1P",
            workerCount=3,
            parameterServerType="2U16G0P",
            parameterServerCount=2,
            runtimeVersion="tf-1.7.0-gpu-py3",
        ),
        table=TABLE,
    )
    assert t.errors == [] and t.warnings == []
    got = {
        r.name: (r.replicas, r.resources.cpu, r.resources.memory_mb, r.resources.gpu)
        for r in t.spec.roles
    }
    assert got == {"worker": (3, 4, 8192, 1), "ps": (2, 2, 16384, 0), "master": (1, 2, 4096, 1)}
    # Parameter servers never exit: the master's success is the job's.
    assert {r.name: r.min_succeeded for r in t.spec.roles} == {
        "worker": None,
        "ps": None,
        "master": 1,
    }
    assert all(r.min_failed == 1 for r in t.spec.roles)


def test_without_a_master_every_worker_must_succeed() -> None:
    spec = translate_ti(job(workerCount=2, parameterServerCount=1), table=TABLE).spec
    assert {r.name: r.min_succeeded for r in spec.roles} == {"worker": 2, "ps": None}


def test_defaults_one_worker_no_ps_no_master() -> None:
    spec = translate_ti(job(masterType=""), table=TABLE).spec
    assert [(r.name, r.replicas) for r in spec.roles] == [("worker", 1)]


def test_a_ps_type_without_a_ps_count_is_a_warning() -> None:
    t = translate_ti(job(parameterServerType="1U2G0P"), table=TABLE)
    assert [r.name for r in t.spec.roles] == ["worker"]
    assert paths(t.warnings) == ["$.parameterServerType"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workerCount", 0),  # no masterType: a job needs a machine
        ("workerCount", "3"),
        ("workerCount", 1.5),
        ("workerCount", True),
        ("parameterServerCount", -1),
    ],
)
def test_counts_are_checked(field: str, value: Any) -> None:
    assert paths(translate_ti(job(**{field: value}), table=TABLE).errors) == [f"$.{field}"]


def test_a_master_may_run_alone_and_no_job_runs_without_a_machine() -> None:
    """The Cloud API's CUSTOM tier asks for WorkerCount with MasterType: 0 is a master
    alone, its workerType then unused."""
    t = translate_ti(job(workerCount=0, workerType="1U2G0P", masterType="2U4G0P"), table=TABLE)
    assert t.errors == [] and [(r.name, r.replicas) for r in t.spec.roles] == [("master", 1)]
    assert paths(t.warnings) == ["$.workerType"]
    alone = translate_ti(job(workerCount=0, masterType=""), table=TABLE)  # "": not given
    assert paths(alone.errors) == ["$.workerCount"]


def test_a_distributed_tia_job_is_tensorflows_with_every_task_in_tf_config() -> None:
    # TI's environment bundles TensorFlow (with MXNet and XGBoost), and its parameter
    # servers and master are TensorFlow's: as a generic job, no task had TF_CONFIG.
    spec = translate_ti(
        job(runtimeVersion="tia-1.6.0-py3", workerCount=2, parameterServerCount=1,
            parameterServerType="1U2G0P"),
        table=TABLE,
    ).spec  # fmt: skip
    assert spec.kind is JobKind.TENSORFLOW
    assert {r.name: [p.label for p in r.ports] for r in spec.roles} == {
        "worker": ["tfport"], "ps": ["tfport"]
    }  # fmt: skip


# ------------------------------------------------------------------- the other fields


def test_command_and_args_become_one_quoted_shell_command() -> None:
    t = translate_ti(
        job(command=["python3", "-c", "print('a b')"], args=["--name", "x y", "$HOME"]), table=TABLE
    )
    assert t.spec.roles[0].command == "python3 -c 'print('\"'\"'a b'\"'\"')' --name 'x y' '$HOME'"


def test_a_command_line_in_one_item_is_a_warning() -> None:
    t = translate_ti(job(command=["python train.py"]), table=TABLE)
    assert paths(t.warnings) == ["$.command[0]"]


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (job(command=None), "$.command"),
        (job(command=[]), "$.command"),
        (job(command="python t.py"), "$.command"),
        (job(command=["python", 3]), "$.command[1]"),
        (job(args="x"), "$.args"),
        (job(packageDir="cos://b/x"), "$.packageDir"),
        (job(name=None), "$.name"),
        (job(name="bad name"), "$.name"),
        (job(cluster=None), "$.cluster"),
        (job(cluster="a/b"), "$.cluster"),
        (job(region=5), "$.region"),
    ],
)
def test_field_errors_name_the_field(payload: dict[str, Any], where: str) -> None:
    assert paths(translate_ti(payload, table=TABLE).errors) == [where]


def test_package_dirs_become_data_sources_in_order() -> None:
    spec = translate_ti(
        job(packageDir=["cos://bucket/code", "/data/mnist", "out"]), table=TABLE
    ).spec
    assert [(d.source, d.mount_path) for d in spec.data_sources] == [
        ("cos://bucket/code", "/ti/packages/0"),
        ("/data/mnist", "/data/mnist"),
        ("out", "/ti/packages/2"),
    ]


def test_output_only_and_unknown_fields_are_warnings() -> None:
    t = translate_ti(
        job(
            state="Running",
            createTime="2018-01-01T00:00:00Z",
            message="x",
            startTime="2018-01-01T00:00:01Z",
            endTime="",
            queue="q",
        ),
        table=TABLE,
    )
    assert t.errors == []
    assert sorted(paths(t.warnings)) == [
        "$.createTime",
        "$.endTime",
        "$.message",
        "$.queue",
        "$.startTime",
        "$.state",
    ]
    assert {i.code for i in t.warnings} == {"output_only", "unknown_field"}


def test_the_key_is_cluster_and_name() -> None:
    assert translate_ti(job(name="a", cluster="c1"), table=TABLE).key == "c1/a"
    assert translate_ti(job(cluster=None), table=TABLE).key is None


def test_detection() -> None:
    assert detect({"name": "x", "cluster": "c", "command": ["true"]}) == "ti"
    assert detect({"workerCount": 1}) == "ti"
    assert detect({"name": "x", "roles": []}) == "native"
    assert detect({"jobName": "x", "taskRoles": []}) == "openpai"


def test_field_paths() -> None:
    # Roles are found by name, not position: a master without ps is still masterType.
    payload = job(masterType="1U2G0P")
    assert field_path("ti", payload, None, "queue") == "$.cluster"
    assert field_path("ti", payload, None, "name") == "$.name"
    assert field_path("ti", payload, "worker", "gpu") == "$.workerType"
    assert field_path("ti", payload, "worker", "replicas") == "$.workerCount"
    assert field_path("ti", payload, "ps", "memory_mb") == "$.parameterServerType"
    assert field_path("ti", payload, "master", "cpu") == "$.masterType"
    assert field_path("ti", payload, "worker", "command") == "$.command"
    assert field_path("ti", payload, "nobody", "cpu") == "$"


def test_validate_and_warnings_hooks_repeat_the_rules() -> None:
    payload = tfplus(workerType="1U2G0P", state="x")
    assert paths(ti.REGISTRATION.validate(payload, None)) == ["$.workerType"]
    assert paths(ti.REGISTRATION.warnings(payload, None)) == ["$.state"]


# --------------------------------------------------------------------------- totality

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
ti_fields = st.sampled_from(sorted(ti.INPUT_KEYS | set(ti.OUTPUT_ONLY) | {"region"}))
machine_text = st.from_regex(r"\d{1,3}U\d{1,3}G\d{1,2}P", fullmatch=True) | st.text(max_size=8)
ti_payloads = st.dictionaries(
    ti_fields,
    json_values
    | machine_text
    | st.sampled_from(sorted(TABLE.runtimes))
    | st.lists(st.text(max_size=10), max_size=4),
    max_size=12,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(ti_payloads, json_values))
def test_translate_never_raises(payload: Any) -> None:
    t = translate_ti(payload, "u", table=TABLE)
    assert t.dialect == "ti"
    for issue in t.errors + t.warnings:
        assert issue.path.startswith("$")
    if t.ok:
        assert t.spec.roles and t.key is not None
    view = render({"name": t.spec.name, "state": "RUNNING", "original": payload})
    json.dumps(view)


# --------------------------------------------------------------------------- the view


def canonical_view(**fields: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": "j1",
        "name": "test73",
        "user": "alice",
        "state": "SUCCEEDED",
        "reason": None,
        "dialect": "ti",
        "queue": "cls-rgaisoe4",
        "submitted_at": datetime(2024, 5, 1, 12, 0, 0, 123000),  # naive: MongoDB's UTC
        "started_at": "2024-05-01T12:00:05+00:00",
        "finished_at": datetime(2024, 5, 1, 14, 0, 0, tzinfo=UTC),
        "errors": [],
        "spec": {"queue": "cls-rgaisoe4"},
        "original": json.loads((EXAMPLES / "test73.json").read_text()),
    }
    view.update(fields)
    return view


def test_the_ti_view_of_a_finished_job() -> None:
    out = render(canonical_view())
    assert out["state"] == "Succeeded"
    assert (out["createTime"], out["startTime"], out["endTime"]) == (
        "2024-05-01T12:00:00.123Z",
        "2024-05-01T12:00:05.000Z",
        "2024-05-01T14:00:00.000Z",
    )
    assert out["name"] == "test73" and out["cluster"] == "cls-rgaisoe4"
    assert out["workerType"] == "0U0G2P" and out["workerCount"] == 3
    assert out["runtimeVersion"] == "tfplus-1.6.0-gpu" and out["message"] == ""


@pytest.mark.parametrize(
    ("state", "ti_state"),
    [
        ("SUBMITTED", "Created"),
        ("ACCEPTED", "Created"),
        ("QUEUED", "Created"),
        ("PLACED", "Created"),
        ("RUNNING", "Running"),
        ("SUCCEEDED", "Succeeded"),
        ("FAILED", "Failed"),
        ("STOPPED", "Failed"),
        ("REJECTED", "Failed"),
    ],
)
def test_states_map_to_the_four_ti_states(state: str, ti_state: str) -> None:
    assert render(canonical_view(state=state))["state"] == ti_state


def test_messages_say_why() -> None:
    stopped = render(canonical_view(state="STOPPED", reason="stopped by alice"))
    assert stopped["message"] == "stopped: stopped by alice"
    rejected = render(
        canonical_view(
            state="REJECTED", errors=[{"path": "$.cluster", "message": "queue 'x' does not exist"}]
        )
    )
    assert rejected["message"] == "rejected: $.cluster: queue 'x' does not exist"
    queued = render(canonical_view(state="QUEUED", reason="waiting for 2 GPUs"))
    assert queued["message"] == "waiting for 2 GPUs"


def test_times_not_yet_known_are_null() -> None:
    out = render(canonical_view(state="QUEUED", started_at=None, finished_at=None))
    assert out["startTime"] is None and out["endTime"] is None
