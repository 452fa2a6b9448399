"""The T9k dialect: every example of T9k's manual, the run-mode matrix of the seed, the
spellings T9k's documentation uses, field errors with paths, and the rendered status."""

from __future__ import annotations

import copy
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.dialects import detect, translate
from trainyard_common.dialects.k8s_pod import quantity
from trainyard_common.dialects.t9k import (
    KINDS,
    RETRYABLE_EXIT_CODES,
    field_path,
    render,
    translate_t9k,
)
from trainyard_common.events import JobState, TaskState
from trainyard_common.jobspec import MPIRUN_ARGS_ENV, JobKind, RestartPolicy, RunMode, TaskRef
from trainyard_launcher.domain.completion import TaskOutcome, decide

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "t9k"
COMPLETE = sorted(p for p in EXAMPLES.glob("*.yaml") if "-snippet-" not in p.name)
SNIPPETS = sorted(EXAMPLES.glob("*-snippet-*.yaml"))


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def paths(issues: list[Any]) -> list[str]:
    return [i.path for i in issues]


def test_every_kind_has_a_complete_example() -> None:
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in COMPLETE}
    assert {"DeepspeedJob" if k == "DeepSpeedJob" else k for k in KINDS} <= kinds


@pytest.mark.parametrize("path", COMPLETE, ids=lambda p: p.name)
def test_complete_manual_examples_translate_without_errors(path: Path) -> None:
    payload = yaml.safe_load(path.read_text())
    assert detect(payload) == "t9k"
    result = translate(payload, user="alice")
    assert result.errors == [], result.errors
    name = payload["metadata"]["name"]
    assert result.spec.name == name and result.spec.user == "alice"
    assert result.key and result.key.startswith("default/") and result.key.endswith(f"/{name}")
    assert result.spec.roles and all(r.command and r.image for r in result.spec.roles)


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.name)
def test_manual_snippets_are_rejected_only_for_what_they_leave_out(path: Path) -> None:
    result = translate(yaml.safe_load(path.read_text()))
    assert result.errors
    for error in result.errors:
        assert error.path.endswith(
            (".image", "]", ".cmd", ".command", ".template", "$.spec.replicaSpecs")
        ), error


def test_generic_job_maps_rules_replicas_and_command() -> None:
    spec = translate_t9k(load("genericjob-1.yaml")).spec
    assert spec.kind is JobKind.GENERIC
    [role] = spec.roles
    assert (role.name, role.replicas, role.command, role.image) == (
        "worker",
        4,
        "sleep 365",
        "nginx:latest",
    )
    assert [[(r.role, r.index) for r in rule] for rule in spec.success_rules] == [[("worker", 0)]]
    assert [[(r.role, r.index) for r in rule] for rule in spec.failure_rules] == [
        [("worker", 0)],
        [("worker", 1)],
    ]
    # With failureRules, only those rules fail the job.
    assert role.min_failed is None


def test_pytorch_get_started_example_uses_torchrun_gpus_and_exit_code_policy() -> None:
    spec = translate_t9k(load("pytorchtrainingjob-get-started.yaml")).spec
    [role] = spec.roles
    assert role.command == (
        "torchrun --nproc_per_node=4 --max_restarts=3 --rdzv_backend=c10d "
        '--rdzv_endpoint="${MASTER_ADDR-\\$(MASTER_ADDR)}":"${MASTER_PORT-\\$(MASTER_PORT)}" '
        "torch_mnist_trainingjob.py --log_dir log --save_path "
        "./model_state_dict.pt --backend nccl"
    )
    assert (role.resources.cpu, role.resources.memory_mb, role.resources.gpu) == (4, 8192, 4)
    assert role.restart_policy is RestartPolicy.EXIT_CODE
    assert role.retryable_exit_codes == RETRYABLE_EXIT_CODES == [130, 137, 138, 143]
    assert [[(r.role, r.index) for r in rule] for rule in spec.success_rules] == [[("node", 0)]]


@pytest.mark.parametrize(
    ("field", "value", "taken"),
    [
        ("procPerNode", "2", "--nproc_per_node=2"),
        ("procPerNode", 3, "--nproc_per_node=3"),
        ("procPerNode", "gpu", "--nproc_per_node=4"),
        ("procPerNode", "abc", None),
        ("procPerNode", "0", None),
        ("procPerNode", "2147483648", None),
        ("procPerNode", 2**31, None),
        ("procPerNode", "9" * 5000, None),
        ("procPerNode", True, None),
        ("rdzvBackend", "etcd-v2", "--rdzv_backend=etcd-v2"),
        ("rdzvBackend", "zookeeper", None),
        ("rdzvBackend", 5, None),
    ],
)
def test_torchrun_settings_are_what_t9k_allows(field: str, value: Any, taken: str | None) -> None:
    """procPerNode: a number or gpu; rdzvBackend: c10d, etcd or etcd-v2. Anything else
    failed only when torchrun ran; now an error at its path."""
    payload = load("pytorchtrainingjob-get-started.yaml")
    payload["spec"]["torchrunConfig"][field] = value
    result = translate_t9k(payload)
    if taken is None:
        assert paths(result.errors) == [f"$.spec.torchrunConfig.{field}"], result.errors
    else:
        assert result.errors == [] and taken in result.spec.roles[0].command.split()


def test_tensorflow_codepack_maps_scheduler_and_run_policy() -> None:
    result = translate_t9k(load("tensorflowtrainingjob-codepack.yaml"))
    spec = result.spec
    assert (spec.queue, spec.priority, spec.retry_limit, spec.cleanup_policy) == (
        "default",
        5,
        20,
        "Unfinished",
    )
    assert spec.roles[0].resources.cpu == 2.0 and spec.roles[0].resources.memory_mb == 2048
    assert "$.spec.tensorboardSpec" in paths(result.warnings)
    assert "$.spec.replicaSpecs[0].template.spec.containers[0].workingDir" in paths(result.warnings)


def test_worker_kinds_take_their_command_from_their_own_fields() -> None:
    mpi = translate_t9k(load("mpijob-1.yaml"))
    assert mpi.spec.roles[0].command == "./random_walk 20 40 2"
    assert mpi.spec.roles[0].resources.cpu == pytest.approx(0.05)
    assert {"$.spec.ssh", "$.spec.mpiHome"} <= set(paths(mpi.warnings))
    # Applied, not merely kept: worker 0's mpirun gets the extra arguments, and every
    # rank the MCA parameters through the variables Open MPI reads.
    assert not {"$.spec.mca", "$.spec.worker.extraMPIArgs"} & set(paths(mpi.warnings))
    env = {e.name: e.value for e in mpi.spec.roles[0].env}
    assert env["OMPI_MCA_btl"] == "^openib"
    assert env[MPIRUN_ARGS_ENV] == (
        "-N 3 --enable-recovery --max-restarts 100 --allow-run-as-root -bind-to none"
    )
    assert mpi.spec.cleanup_policy == "All"  # runPolicy.cleanUpWorkers: true
    colossal = translate_t9k(load("colossalaijob-1.yaml")).spec.roles[0]
    assert colossal.command == "torchrun --nproc_per_node=1 train.py arg1"
    assert colossal.resources.gpu == 1 and colossal.resources.memory_mb == 4096
    deepspeed = translate_t9k(load("deepspeedjob-1.yaml"))
    assert deepspeed.spec.kind is JobKind.DEEPSPEED
    assert deepspeed.spec.roles[0].command == "python /t9k/mnt/train.py"
    beam = translate_t9k(load("beamjob-1.yaml")).spec
    assert beam.roles[0].name == "job" and beam.roles[0].command.startswith(
        "python3 -m apache_beam.examples.wordcount"
    )


def test_mpi_variables_made_from_mca_and_extra_args_are_checked_where_they_are_written() -> None:
    """They become variables (OMPI_MCA_<name>, the mpirun line): a name with '=' or a
    NUL anywhere cannot be one, and is refused at the field, not at the job's start."""
    payload = load("mpijob-1.yaml")
    payload["spec"]["mca"] = {"btl": "^openib", "a=b": "1", "c": "x\0y"}
    payload["spec"]["worker"]["extraMPIArgs"] = ["-N", "3\0"]
    result = translate_t9k(payload)
    assert paths(result.errors) == [
        "$.spec.mca['a=b']", "$.spec.mca.c", "$.spec.worker.extraMPIArgs[1]"
    ], result.errors  # fmt: skip
    assert "'='" in result.errors[0].message and "NUL" in result.errors[1].message


# ------------------------------------------------------------------------- spellings


def spelling(result: Any) -> dict[str, str]:
    return {w.path: w.message for w in result.warnings if w.code == "spelling"}


def test_documented_alternative_spellings_are_accepted_with_a_warning() -> None:
    deepspeed = spelling(translate_t9k(load("deepspeedjob-1.yaml")))
    assert "DeepspeedJob" in deepspeed["$.kind"]
    assert "slotPerWorker" in deepspeed["$.spec.config.slotPerWorker"]
    assert "run.python is a string" in deepspeed["$.spec.config.run.python"]
    xgb = spelling(translate_t9k(load("xgboosttrainingjob-1.yaml")))
    assert "template.containers" in xgb["$.spec.replicaSpecs[1].template.containers"]


def with_spec(name: str, **changes: Any) -> dict[str, Any]:
    payload = copy.deepcopy(load(name))
    payload["spec"].update(changes)
    return payload


@pytest.mark.parametrize("word", ["enable", "enabled"])
def test_enable_and_enabled_both_turn_a_mode_on(word: str) -> None:
    result = translate_t9k(with_spec("pytorchtrainingjob-1.yaml", runMode={"debug": {word: True}}))
    assert result.errors == [] and result.spec.run_mode is RunMode.DEBUG
    warned = spelling(result)
    if word == "enable":
        assert "'enable' is read as 'enabled'" in warned["$.spec.runMode.debug.enable"]
    else:
        assert warned == {}


def test_replicas_spec_spelling_is_read_as_replica_specs() -> None:
    payload = load("genericjob-1.yaml")
    payload["spec"]["replicasSpec"] = payload["spec"].pop("replicaSpecs")
    result = translate_t9k(payload)
    assert result.errors == [] and result.spec.roles[0].replicas == 4
    assert "replicasSpec" in spelling(result)["$.spec.replicasSpec"]


def test_restart_policy_as_object_or_string_is_accepted_and_the_other_form_warned() -> None:
    generic = load("genericjob-1.yaml")
    generic["spec"]["replicaSpecs"][0]["restartPolicy"] = {"policy": "ExitCode", "limit": 7}
    result = translate_t9k(generic)
    assert result.errors == [] and spelling(result) == {}
    assert result.spec.roles[0].restart_policy is RestartPolicy.EXIT_CODE
    assert result.spec.retry_limit == 7
    generic["spec"]["replicaSpecs"][0]["restartPolicy"] = "Never"
    result = translate_t9k(generic)
    assert result.spec.roles[0].restart_policy is RestartPolicy.NEVER
    assert "as a string" in spelling(result)["$.spec.replicaSpecs[0].restartPolicy"]
    pytorch = load("pytorchtrainingjob-1.yaml")
    pytorch["spec"]["replicaSpecs"][0]["restartPolicy"] = {"policy": "Always"}
    result = translate_t9k(pytorch)
    assert result.spec.roles[0].restart_policy is RestartPolicy.ALWAYS
    assert "object" in spelling(result)["$.spec.replicaSpecs[0].restartPolicy"]


@pytest.mark.parametrize(("limit", "retries"), [(9, 9), (0, 0), (None, 3)])
def test_a_replicas_restart_limit_stands_where_no_backoff_limit_is_written(
    limit: int | None, retries: int
) -> None:
    """backoffLimit's default (3) applies only where nothing else was written: a
    replica's restartPolicy.limit (0 among them) was dropped for it."""
    pytorch = load("pytorchtrainingjob-1.yaml")
    pytorch["spec"].pop("runPolicy", None)
    policy: dict[str, Any] = {"policy": "OnFailure"}
    if limit is not None:
        policy["limit"] = limit
    pytorch["spec"]["replicaSpecs"][0]["restartPolicy"] = policy
    result = translate_t9k(pytorch)
    assert result.errors == [] and result.spec.retry_limit == retries


# ----------------------------------------------------------------------------- matrix

# The seed's table (t9k-jobs.md, 运行模式): which modes each kind supports.
MATRIX = {
    "GenericJob": {"debug", "pause"},
    "PyTorchTrainingJob": {"debug", "pause", "elastic"},
    "TensorFlowTrainingJob": {"debug", "pause"},
    "XGBoostTrainingJob": {"debug", "pause"},
    "MPIJob": {"debug", "pause"},
    "ColossalAIJob": {"debug", "pause"},
    "DeepSpeedJob": {"debug", "pause", "elastic"},
    "BeamJob": set(),
}
EXAMPLE_OF = {
    "GenericJob": "genericjob-1.yaml",
    "PyTorchTrainingJob": "pytorchtrainingjob-1.yaml",
    "TensorFlowTrainingJob": "tensorflowtrainingjob-1.yaml",
    "XGBoostTrainingJob": "xgboosttrainingjob-1.yaml",
    "MPIJob": "mpijob-1.yaml",
    "ColossalAIJob": "colossalaijob-1.yaml",
    "DeepSpeedJob": "deepspeedjob-1.yaml",
    "BeamJob": "beamjob-1.yaml",
}
MODES = {
    "debug": {"enabled": True},
    "pause": {"enabled": True, "resumeSpecs": [{"type": "X", "command": ["sleep", "1"]}]},
    "elastic": {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "expectedReplicas": 2},
}


@pytest.mark.parametrize(("kind", "mode"), [(k, m) for k in MATRIX for m in MODES])
def test_run_mode_matrix_is_enforced_per_kind(kind: str, mode: str) -> None:
    payload = load(EXAMPLE_OF[kind])
    payload["kind"] = kind
    first_type = translate_t9k(payload).spec.roles[0].name
    body = copy.deepcopy(MODES[mode])
    if "resumeSpecs" in body:
        body["resumeSpecs"][0]["type"] = first_type
    payload["spec"]["runMode"] = {mode: body}
    result = translate_t9k(payload)
    if mode in MATRIX[kind]:
        assert result.errors == [], result.errors
        assert result.spec.run_mode.value == mode
        if mode == "elastic":
            role = result.spec.roles[0]
            assert (role.min_replicas, role.max_replicas, role.replicas) == (1, 3, 2)
    else:
        [error] = result.errors
        assert error.path == f"$.spec.runMode.{mode}" and error.code == "unsupported_mode"
        assert f"$.spec.runMode.{mode}" in error.message and kind in error.message


def test_immediate_is_the_default_and_a_disabled_unsupported_mode_only_warns() -> None:
    assert translate_t9k(load("beamjob-1.yaml")).spec.run_mode is RunMode.IMMEDIATE
    result = translate_t9k(with_spec("beamjob-1.yaml", runMode={"debug": {"enabled": False}}))
    assert result.errors == [] and "$.spec.runMode.debug" in paths(result.warnings)


def test_pytorch_spec_elastic_is_t9ks_own_spelling_of_the_elastic_mode() -> None:
    result = translate_t9k(
        with_spec(
            "pytorchtrainingjob-1.yaml",
            elastic={"enabled": True, "minReplicas": 4, "maxReplicas": 10, "expectedReplicas": 7},
        )
    )
    assert result.errors == [] and result.spec.run_mode is RunMode.ELASTIC
    role = result.spec.roles[0]
    assert (role.min_replicas, role.max_replicas, role.replicas) == (4, 10, 7)
    bad = translate_t9k(
        with_spec(
            "pytorchtrainingjob-1.yaml",
            elastic={"enabled": True, "minReplicas": 4, "maxReplicas": 10, "expectedReplicas": 11},
        )
    )
    assert paths(bad.errors) == ["$.spec.elastic.expectedReplicas"]


def test_pause_keeps_resume_specs_and_checks_their_types() -> None:
    payload = with_spec(
        "genericjob-1.yaml",
        runMode={
            "pause": {
                "enabled": True,
                "resumeSpecs": [
                    {"type": "worker", "skipInitContainer": True, "command": ["/usr/bin/sshd"]}
                ],
            }
        },
    )
    result = translate_t9k(payload)
    assert result.errors == [] and result.spec.run_mode is RunMode.PAUSE
    payload["spec"]["runMode"]["pause"]["resumeSpecs"][0]["type"] = "chief"
    assert paths(translate_t9k(payload).errors) == ["$.spec.runMode.pause.resumeSpecs[0].type"]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda p: p.update(apiVersion="batch.tensorstack.dev/v1"), "$.apiVersion"),
        (lambda p: p.update(kind="SparkJob"), "$.kind"),
        (lambda p: p["metadata"].update(name="Bad_Name"), "$.metadata.name"),
        (lambda p: p["metadata"].pop("name"), "$.metadata.name"),
        (lambda p: p["metadata"].update(namespace="NS!"), "$.metadata.namespace"),
        (
            lambda p: p["spec"]["replicaSpecs"][0].update(replicas=0),
            "$.spec.replicaSpecs[0].replicas",
        ),
        (
            lambda p: p["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0].pop(
                "image"
            ),
            "$.spec.replicaSpecs[0].template.spec.containers[0].image",
        ),
        (
            lambda p: p["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0].update(
                resources={"requests": {"cpu": "lots"}}
            ),
            "$.spec.replicaSpecs[0].template.spec.containers[0].resources.requests.cpu",
        ),
        (
            lambda p: p["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0].update(
                resources={"limits": {"nvidia.com/gpu": "0.5"}}
            ),
            "$.spec.replicaSpecs[0].template.spec.containers[0].resources.limits['nvidia.com/gpu']",
        ),
        (
            lambda p: p["spec"]["successRules"].append({"worker": [4]}),
            "$.spec.successRules[1].worker[0]",
        ),
        (
            lambda p: p["spec"]["failureRules"].append({"chief": [0]}),
            "$.spec.failureRules[2].chief",
        ),
        (lambda p: p["spec"].update(cleanUpPolicy="Some"), "$.spec.cleanUpPolicy"),
        (
            lambda p: p["spec"].update(scheduler={"t9kScheduler": {"priority": 101}}),
            "$.spec.scheduler.t9kScheduler.priority",
        ),
        (
            lambda p: p["spec"]["replicaSpecs"][0].update(restartPolicy="Sometimes"),
            "$.spec.replicaSpecs[0].restartPolicy",
        ),
        (
            lambda p: p["spec"]["replicaSpecs"].append(copy.deepcopy(p["spec"]["replicaSpecs"][0])),
            "$.spec.replicaSpecs[1].type",
        ),
    ],
)
def test_invalid_fields_are_errors_at_their_path(mutate: Any, path: str) -> None:
    payload = load("genericjob-1.yaml")
    mutate(payload)
    result = translate_t9k(payload)
    assert path in paths(result.errors), result.errors


def test_run_policy_maps_to_retry_deadline_and_cleanup() -> None:
    result = translate_t9k(
        with_spec(
            "pytorchtrainingjob-1.yaml",
            runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 61, "cleanUpPolicy": "All"},
        )
    )
    spec = result.spec
    assert (spec.retry_limit, spec.max_running_minutes, spec.cleanup_policy) == (2, 2, "All")


@pytest.mark.parametrize(
    "example",
    ["pytorchtrainingjob-1.yaml", "tensorflowtrainingjob-1.yaml", "xgboosttrainingjob-1.yaml"],
)
def test_backoff_limit_defaults_to_three_and_zero_is_kept(example: str) -> None:
    """T9k's manual: backoffLimit 默认为 3, shared by every replica's restarts."""
    payload = load(example)
    payload["spec"].pop("runPolicy", None)
    assert translate_t9k(payload).spec.retry_limit == 3
    payload["spec"]["runPolicy"] = {"cleanUpPolicy": "All"}
    assert translate_t9k(payload).spec.retry_limit == 3
    payload["spec"]["runPolicy"] = {"backoffLimit": 0}
    assert translate_t9k(payload).spec.retry_limit == 0
    # GenericJob has no runPolicy: its restartPolicy's own limit, else none.
    assert translate_t9k(load("genericjob-1.yaml")).spec.retry_limit == 0


def test_resources_env_and_shared_memory() -> None:
    payload = load("genericjob-1.yaml")
    container = payload["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    container["resources"] = {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"cpu": 2, "memory": "8Gi", "nvidia.com/gpu": 2},
    }
    container["env"] = [{"name": "A", "value": "1"}, {"name": "B"}]
    container["volumeMounts"] = [{"mountPath": "/dev/shm", "name": "dshm"}]
    payload["spec"]["replicaSpecs"][0]["template"]["spec"]["volumes"] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}
    ]
    role = translate_t9k(payload).spec.roles[0]
    assert (
        role.resources.cpu,
        role.resources.memory_mb,
        role.resources.gpu,
        role.resources.shm_mb,
    ) == (0.5, 512, 2, 1024)
    assert [(e.name, e.value) for e in role.env] == [("A", "1"), ("B", "")]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("2", 2),
        (4, 4),
        ("8Gi", 8 * 2**30),
        ("512Mi", 512 * 2**20),
        ("1G", 10**9),
        ("1e3", 1000),
        ("1.5", 1.5),
        ("-1", None),
        ("1Zi", None),
        (True, None),
    ],
)
def test_quantities(text: Any, value: float | None) -> None:
    got = quantity(text)
    assert (float(got) if got is not None else None) == value


def test_commands_are_quoted_word_by_word() -> None:
    payload = load("genericjob-1.yaml")
    payload["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0].update(
        command=["sh", "-c"], args=["echo 'hi there' $HOME"]
    )
    assert translate_t9k(payload).spec.roles[0].command == (
        "sh -c 'echo '\"'\"'hi there'\"'\"' $HOME'"
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)
KEYS = st.sampled_from(
    [
        "apiVersion",
        "kind",
        "metadata",
        "spec",
        "replicaSpecs",
        "worker",
        "template",
        "containers",
        "runMode",
        "elastic",
        "successRules",
        "restartPolicy",
        "resources",
        "requests",
        "limits",
        "replicas",
    ]
)


def mutations(base: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.just(base) | JSON,
        lambda inner: st.dictionaries(KEYS, inner, max_size=5),
        max_leaves=20,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        JSON,
        mutations(load("genericjob-1.yaml")),
        mutations({"apiVersion": "batch.tensorstack.dev/v1beta1", "kind": "PyTorchTrainingJob"}),
    )
)
def test_translate_never_raises(payload: Any) -> None:
    result = translate_t9k(payload)
    assert result.dialect == "t9k"
    render("pytorchtrainingjob", {"original": payload, "state": "RUNNING", "tasks": []})
    for role in [None, "nobody", *(r.name for r in result.spec.roles)]:
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
            assert field_path(payload, role, field).startswith("$")


# ----------------------------------------------------------------------------- render

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def view(state: str, tasks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    payload = load("genericjob-1.yaml")
    spec = translate_t9k(payload).spec
    return {
        "id": "job-1",
        "name": "generic-example",
        "state": state,
        "submitted_at": NOW,
        "updated_at": NOW,
        "finished_at": None,
        "spec": spec.model_dump(mode="json"),
        "tasks": tasks,
        "warnings": [],
        "errors": [],
        "original": payload,
        **extra,
    }


def task(index: int, state: str, exit_code: int | None = None) -> dict[str, Any]:
    return {
        "role": "worker",
        "index": index,
        "attempt": 1,
        "state": state,
        "exit_code": exit_code,
        "node": "node-cpu",
        "reason": None,
    }


def test_render_shows_the_resource_as_submitted_with_a_t9k_status() -> None:
    tasks = [task(0, "SUCCEEDED", 0), task(1, "RUNNING"), task(2, "FAILED", 3)]
    out = render(
        "genericjobs", view("SUCCEEDED", tasks, finished_at=NOW, reason="success rule 0 met")
    )
    assert out["apiVersion"] == "batch.tensorstack.dev/v1beta1" and out["kind"] == "GenericJob"
    assert out["spec"] == load("genericjob-1.yaml")["spec"]
    assert out["metadata"]["uid"] == "job-1"
    assert out["metadata"]["creationTimestamp"] == "2024-05-01T12:00:00Z"
    status = out["status"]
    assert status["phase"] == "Succeeded"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Completed"]["status"] == "True"
    assert conditions["Failed"]["status"] == "False"
    assert conditions["ReplicaFailure"]["status"] == "True"
    assert conditions["Completed"]["lastTransitionTime"] == "2024-05-01T12:00:00Z"
    [worker] = status["tasks"]
    replicas = {r["index"]: r for r in worker["replicas"]}
    assert (replicas[0]["phase"], replicas[0]["exitCode"], replicas[0]["node"]) == (
        "Succeeded",
        0,
        "node-cpu",
    )
    assert replicas[2]["phase"] == "Failed" and replicas[2]["exitCode"] == 3
    assert replicas[3]["phase"] == "Deleted"  # never started; the job is over
    assert replicas[0]["name"] == "generic-example-worker-0"
    assert status["replicaStatuses"]["worker"] == {"active": 1, "succeeded": 1, "failed": 1}
    assert status["aggregate"]["running"] == 1 and status["aggregate"]["succeeded"] == 1


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        ("SUBMITTED", "Pending"),
        ("QUEUED", "Pending"),
        ("PLACED", "Pending"),
        ("RUNNING", "Running"),
        ("SUCCEEDED", "Succeeded"),
        ("FAILED", "Failed"),
        ("STOPPED", "Failed"),
        ("REJECTED", "Failed"),
    ],
)
def test_render_phase(state: str, phase: str) -> None:
    assert render("genericjobs", view(state, []))["status"]["phase"] == phase


def test_render_rejected_job_names_the_field_errors() -> None:
    errors = [
        {
            "path": "$.spec.scheduler.t9kScheduler.queue",
            "message": "queue 'gold' does not exist",
            "code": "unknown_queue",
        }
    ]
    out = render("genericjobs", view("REJECTED", [], errors=errors, finished_at=NOW))
    failed = next(c for c in out["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "Rejected"
    assert "$.spec.scheduler.t9kScheduler.queue: queue 'gold' does not exist" in failed["message"]


def test_render_paused_job_and_warnings_annotation() -> None:
    v = view("QUEUED", [], warnings=[{"path": "$.spec.service", "message": "kept"}])
    v["spec"]["run_mode"] = "pause"
    out = render("genericjobs", v)
    assert out["status"]["phase"] == "Paused"
    assert any(c["type"] == "Paused" for c in out["status"]["conditions"])
    assert out["metadata"]["annotations"]["trainyard.dev/warnings"] == "$.spec.service: kept"


@pytest.mark.parametrize(
    ("backend", "extra", "endpoint"),
    [
        ("c10d", [], "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)"),
        ("c10d", ["--rdzv_endpoint=etcd:2379"], "--rdzv_endpoint=etcd:2379"),
        ("etcd-v2", ["--rdzv_endpoint=etcd:2379"], "--rdzv_endpoint=etcd:2379"),
        ("etcd", [], None),
    ],
)
def test_a_c10d_rendezvous_meets_at_the_first_replica(
    backend: str, extra: list[str], endpoint: str | None
) -> None:
    """The launcher gives no torch task a rendezvous endpoint (it would override a
    command's own --master_addr), so c10d's is on the line; extraOptions come later and
    win in torchrun's parser. An etcd endpoint is the user's own server."""
    payload = load("pytorchtrainingjob-get-started.yaml")
    payload["spec"]["torchrunConfig"].update(rdzvBackend=backend, extraOptions=extra)
    command = translate_t9k(payload).spec.roles[0].command
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456"}
    # What the task's shell runs: the last endpoint on the line is the one taken.
    argv = subprocess.run(
        ["sh", "-c", 'printf "%s\\n" ' + command.removeprefix("torchrun ")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    taken = [a for a in argv if a.startswith("--rdzv_endpoint=")]
    expected = (
        endpoint.replace("$(MASTER_ADDR):$(MASTER_PORT)", "10.0.0.1:23456") if endpoint else None
    )
    assert (taken[-1] if taken else None) == expected, command


def test_in_a_training_kind_the_master_decides_failure_of_replicas_never_restarted() -> None:
    """T9k's manual ("成功和失败"): the master's end is the job's. A chief with an
    evaluator, a ps and workers, all Never: only the chief's failure fails the job."""
    job = load("tensorflowtrainingjob-1.yaml")
    [worker] = job["spec"]["replicaSpecs"]
    job["spec"]["replicaSpecs"] = [
        {**copy.deepcopy(worker), "type": kind, "replicas": n, "restartPolicy": "Never"}
        for kind, n in (("chief", 1), ("worker", 2), ("ps", 1), ("evaluator", 1))
    ]
    spec = translate_t9k(job).spec
    assert spec.failure_rules == [[TaskRef(role="chief", index=0)]]
    assert all(r.min_failed is None for r in spec.roles)
    failed, done = TaskOutcome(TaskState.FAILED, exit_code=1), TaskOutcome(TaskState.SUCCEEDED)
    assert decide(spec, {("evaluator", 0): failed, ("worker", 1): failed}) is None
    verdict = decide(spec, {("chief", 0): failed})
    assert verdict is not None and verdict.state is JobState.FAILED
    verdict = decide(spec, {("worker", 1): failed, ("chief", 0): done})
    assert verdict is not None and verdict.state is JobState.SUCCEEDED
    # Without a chief, worker 0 is the master: worker 1's failure does not end the job.
    job["spec"]["replicaSpecs"] = job["spec"]["replicaSpecs"][1:]
    spec = translate_t9k(job).spec
    assert spec.failure_rules == [[TaskRef(role="worker", index=0)]]
    assert decide(spec, {("worker", 1): failed}) is None
    # A replica that restarts (OnFailure, T9k's default) still ends the attempt, which is
    # how Trainyard restarts it.
    for replica in job["spec"]["replicaSpecs"]:
        replica["restartPolicy"] = "OnFailure"
    spec = translate_t9k(job).spec
    assert spec.failure_rules == [] and all(r.min_failed == 1 for r in spec.roles)


@pytest.mark.parametrize(
    ("kind", "rtype"),
    [
        ("TensorFlowTrainingJob", "chief"),
        ("PyTorchTrainingJob", "master"),
        ("XGBoostTrainingJob", "master"),
    ],
)
def test_a_training_kinds_master_is_one_replica(kind: str, rtype: str) -> None:
    job = load("tensorflowtrainingjob-1.yaml")
    job["kind"] = kind
    [worker] = job["spec"]["replicaSpecs"]
    container = worker["template"]["spec"]["containers"][0]
    container["name"] = {"PyTorchTrainingJob": "pytorch", "XGBoostTrainingJob": "xgboost"}.get(
        kind, "tensorflow"
    )
    job["spec"]["replicaSpecs"] = [{**copy.deepcopy(worker), "type": rtype, "replicas": 1}, worker]
    assert translate_t9k(job).errors == []
    job["spec"]["replicaSpecs"][0]["replicas"] = 2
    assert [(e.path, e.code) for e in translate_t9k(job).errors] == [
        ("$.spec.replicaSpecs[0].replicas", "range")
    ]


def test_a_generic_job_restart_policy_without_a_limit_is_said_to_restart_nothing() -> None:
    """GenericJob's restartPolicy.limit is "the most restarts", with no default given."""
    job = load("genericjob-1.yaml")
    replica = job["spec"]["replicaSpecs"][0]
    for policy, warned, limit in (
        ({"policy": "Always"}, True, 0),
        ({"policy": "OnFailure"}, True, 0),
        ({"policy": "OnFailure", "limit": 2}, False, 2),
        ({"policy": "Never"}, False, 0),
    ):
        replica["restartPolicy"] = policy
        result = translate_t9k(job)
        path = "$.spec.replicaSpecs[0].restartPolicy"
        assert (path in paths(result.warnings)) is warned, policy
        assert result.spec.retry_limit == limit
