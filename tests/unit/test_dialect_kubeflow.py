"""Kubeflow PyTorchJob / TFJob: the Training Operator's own examples, the completion
default (Master / Chief / worker 0 decides success), runPolicy, and the rendered status."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.dialects import detect, kubeflow, translate
from trainyard_common.dialects.kubeflow import render, translate_kubeflow
from trainyard_common.jobspec import (
    ALL_TASKS,
    MPI_IMPLEMENTATION_ENV,
    RETRY_UNLIMITED,
    JobKind,
    RestartPolicy,
    RunMode,
    env_dict,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubeflow"


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def rules(spec: Any) -> list[list[tuple[str, int]]]:
    """The success rules' tasks, a role's every task (ALL_TASKS) counted out."""
    replicas = {role.name: role.replicas for role in spec.roles}
    return [
        [
            (r.role, i)
            for r in rule
            for i in (range(replicas[r.role]) if r.index == ALL_TASKS else [r.index])
        ]
        for rule in spec.success_rules
    ]


@pytest.mark.parametrize(
    "name",
    [
        "pytorchjob-simple.yaml",
        "tfjob-simple.yaml",
        "pytorchjob-elastic-echo.yaml",
        "pytorchjob-mnist-gloo.yaml",
    ],
)
def test_training_operator_examples_translate(name: str) -> None:
    payload = load(name)
    assert detect(payload) == "kubeflow"
    result = translate(payload, user="bob")
    assert result.errors == [], result.errors
    ns = payload["metadata"].get("namespace", "default")
    plural = "pytorchjobs" if payload["kind"] == "PyTorchJob" else "tfjobs"
    assert result.key == f"{ns}/{plural}/{payload['metadata']['name']}"


def test_a_container_keeps_its_command_and_args_as_kubernetes_means_them() -> None:
    # Without a command the container runs its image's entrypoint: whether that can run
    # is the backend's to say (validation), not the dialect's.
    result = translate_kubeflow(load("tfjob-distributed-no-command.yaml"))
    assert result.errors == []
    assert result.spec.cleanup_policy == "None"
    assert all(r.uses_image_entrypoint and r.entrypoint is None for r in result.spec.roles)
    simple = translate_kubeflow(load("pytorchjob-simple.yaml")).spec
    assert [(r.entrypoint, r.args) for r in simple.roles] == [
        (["python3", "/opt/mnist/src/mnist.py", "--epochs=1"], [])
    ] * 2
    assert simple.namespace == "kubeflow"


def test_annotations_of_the_clusters_or_the_platforms_domains_are_said_not_applied() -> None:
    payload = load("pytorchjob-simple.yaml")
    template = payload["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    template["metadata"] = {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/pytorch": "unconfined",
        "sidecar.istio.io/inject": "false",
    }}  # fmt: skip
    result = translate_kubeflow(payload)
    assert result.errors == []
    said = [(w.path, w.code) for w in result.warnings if "annotations" in w.path]
    assert said == [(
        "$.spec.pytorchReplicaSpecs.Master.template.metadata.annotations"
        "['container.apparmor.security.beta.kubernetes.io/pytorch']",
        "not_applied",
    )]  # fmt: skip
    # Kept in the spec as submitted; the Kubernetes backend does not put it on the pod.
    master = next(r for r in result.spec.roles if r.name == "Master")
    assert len(master.annotations) == 2


def test_image_pull_policy_is_carried_and_checked() -> None:
    payload = load("pytorchjob-simple.yaml")
    container = payload["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][
        0
    ]
    container["imagePullPolicy"] = "IfNotPresent"
    result = translate_kubeflow(payload)
    assert result.errors == []
    policies = {r.name: r.image_pull_policy for r in result.spec.roles}
    assert policies == {"Master": "IfNotPresent", "Worker": "Always"}  # as the example has it
    # Applied (on Kubernetes), so not reported as a field Trainyard keeps but ignores.
    assert not [w for w in result.warnings if w.path.endswith("imagePullPolicy")]
    container["imagePullPolicy"] = "Sometimes"
    [error] = translate_kubeflow(payload).errors
    assert error.path == (
        "$.spec.pytorchReplicaSpecs.Master.template.spec.containers[0].imagePullPolicy"
    )


def test_pytorchjob_master_decides_success() -> None:
    spec = translate_kubeflow(load("pytorchjob-simple.yaml")).spec
    assert spec.kind is JobKind.PYTORCH
    assert [(r.name, r.replicas, r.command) for r in spec.roles] == [
        ("Master", 1, "python3 /opt/mnist/src/mnist.py --epochs=1"),
        ("Worker", 1, "python3 /opt/mnist/src/mnist.py --epochs=1"),
    ]
    assert rules(spec) == [[("Master", 0)]]
    assert all(
        r.min_failed == 1 and r.restart_policy is RestartPolicy.ON_FAILURE for r in spec.roles
    )


def test_tfjob_without_chief_is_decided_by_worker_0_or_all_workers() -> None:
    payload = load("tfjob-simple.yaml")
    assert rules(translate_kubeflow(payload).spec) == [[("Worker", 0)]]
    payload["spec"]["successPolicy"] = "AllWorkers"
    assert rules(translate_kubeflow(payload).spec) == [[("Worker", 0), ("Worker", 1)]]
    payload["spec"]["tfReplicaSpecs"]["Chief"] = copy.deepcopy(
        payload["spec"]["tfReplicaSpecs"]["Worker"]
    ) | {"replicas": 1}
    payload["spec"]["successPolicy"] = ""
    assert rules(translate_kubeflow(payload).spec) == [[("Chief", 0)]]
    # With a Chief, AllWorkers does not apply (the tf controller's rule): the Chief decides.
    payload["spec"]["successPolicy"] = "AllWorkers"
    assert rules(translate_kubeflow(payload).spec) == [[("Chief", 0)]]


def test_a_paddlejob_in_parameter_server_mode_has_several_masters_and_all_decide() -> None:
    """PaddleJob's servers are its Masters (the paddle controller: no count rule; the job
    succeeds when every Master has)."""
    payload = load("paddlejob-collective.yaml")
    specs = payload["spec"]["paddleReplicaSpecs"]
    specs["Master"] = copy.deepcopy(next(iter(specs.values()))) | {"replicas": 2}
    result = translate_kubeflow(payload)
    assert result.errors == [], result.errors
    assert [[(r.role, r.index) for r in rule] for rule in result.spec.success_rules] == [
        [("Master", ALL_TASKS)]
    ]
    # A PyTorchJob's Master is still one.
    torch = load("pytorchjob-simple.yaml")
    torch["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    assert [e.path for e in translate_kubeflow(torch).errors] == [
        "$.spec.pytorchReplicaSpecs.Master.replicas"
    ]


def test_every_worker_is_one_rule_entry_however_many_there_are() -> None:
    """A rule over every Worker names the role, not each task: one of 2**31 - 1 workers
    was a list of that many (gigabytes, built by intake before any check of size)."""
    payload = load("tfjob-simple.yaml")
    payload["spec"]["successPolicy"] = "AllWorkers"
    payload["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 2**31 - 1
    spec = translate_kubeflow(payload).spec
    assert [[(r.role, r.index) for r in rule] for rule in spec.success_rules] == [
        [("Worker", ALL_TASKS)]
    ]


def test_elastic_policy_bounds_the_workers() -> None:
    result = translate_kubeflow(load("pytorchjob-elastic-echo.yaml"))
    [worker] = result.spec.roles
    assert result.spec.run_mode is RunMode.ELASTIC
    assert (worker.min_replicas, worker.max_replicas, worker.replicas) == (1, 2, 2)
    assert "$.spec.elasticPolicy.rdzvBackend" in [w.path for w in result.warnings]


def test_run_policy() -> None:
    payload = load("pytorchjob-simple.yaml")
    payload["spec"]["runPolicy"] = {
        "cleanPodPolicy": "Running",
        "backoffLimit": 3,
        "activeDeadlineSeconds": 600,
        "suspend": True,
        "schedulingPolicy": {"queue": "gold", "minAvailable": 2},
    }
    result = translate_kubeflow(payload)
    spec = result.spec
    assert (
        spec.cleanup_policy,
        spec.retry_limit,
        spec.max_running_minutes,
        spec.queue,
        spec.run_mode,
    ) == ("Unfinished", 3, 10, "gold", RunMode.PAUSE)
    assert "$.spec.runPolicy.schedulingPolicy.minAvailable" in [w.path for w in result.warnings]


def test_without_a_backoff_limit_a_replica_that_restarts_does_so_without_limit() -> None:
    """The training operator's PastBackoffLimit: "if BackoffLimit == nil { return false }".
    OnFailure (the default) restarts a failed pod for ever; here, a new attempt."""
    from datetime import UTC, datetime

    from trainyard_common.events import JobState, TaskState
    from trainyard_launcher.domain.completion import TaskOutcome, decide
    from trainyard_launcher.domain.failure import judge

    spec = translate_kubeflow(load("pytorchjob-simple.yaml")).spec
    assert spec.retry_limit == RETRY_UNLIMITED
    outcomes = {("Master", 0): TaskOutcome(TaskState.FAILED, exit_code=1)}
    verdict = decide(spec, outcomes)
    assert verdict is not None and verdict.state is JobState.FAILED
    now = datetime(2026, 1, 1, tzinfo=UTC)
    _, retry = judge(spec, 7, verdict, outcomes, now=now)
    assert retry is not None and retry.attempt == 8
    # A failure a new attempt would repeat still ends it: an image that is not there.
    missing = {("Master", 0): TaskOutcome(TaskState.FAILED, kind="prepare_user")}
    verdict = decide(spec, missing)
    assert verdict is not None
    assert judge(spec, 1, verdict, missing, now=now)[1] is None
    # Never: no restart, as the operator's; a backoffLimit stands where written.
    never = load("pytorchjob-simple.yaml")
    for replica in never["spec"]["pytorchReplicaSpecs"].values():
        replica["restartPolicy"] = "Never"
    assert translate_kubeflow(never).spec.retry_limit == 0
    limited = load("pytorchjob-simple.yaml")
    limited["spec"]["runPolicy"] = {"backoffLimit": 2}
    assert translate_kubeflow(limited).spec.retry_limit == 2


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda p: p.update(apiVersion="kubeflow.org/v2"), "$.apiVersion"),
        (lambda p: p.update(kind="MXJob"), "$.kind"),
        (
            lambda p: p["spec"]["pytorchReplicaSpecs"].update(Chief={}),
            "$.spec.pytorchReplicaSpecs.Chief",
        ),
        (
            lambda p: p["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
            "$.spec.pytorchReplicaSpecs.Master.replicas",
        ),
        (
            lambda p: p["spec"]["pytorchReplicaSpecs"]["Worker"].update(restartPolicy="Sometimes"),
            "$.spec.pytorchReplicaSpecs.Worker.restartPolicy",
        ),
        (lambda p: p["metadata"].update(name="Upper"), "$.metadata.name"),
    ],
)
def test_errors_have_paths(mutate: Any, path: str) -> None:
    payload = load("pytorchjob-simple.yaml")
    mutate(payload)
    assert path in [e.path for e in translate_kubeflow(payload).errors]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "apiVersion",
                    "kind",
                    "metadata",
                    "spec",
                    "pytorchReplicaSpecs",
                    "Master",
                    "Worker",
                    "template",
                    "containers",
                    "runPolicy",
                    "restartPolicy",
                    "elasticPolicy",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_translate_never_raises(payload: Any) -> None:
    result = translate_kubeflow(payload)
    assert result.dialect == "kubeflow"
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
            assert kubeflow.field_path(payload, role, field).startswith("$")


def test_render_kubeflow_status() -> None:
    payload = load("pytorchjob-simple.yaml")
    spec = translate_kubeflow(payload).spec
    now = datetime(2024, 5, 1, tzinfo=UTC)
    out = render(
        "pytorchjobs",
        {
            "id": "j1",
            "name": "pytorch-simple",
            "state": "SUCCEEDED",
            "submitted_at": now,
            "updated_at": now,
            "finished_at": now,
            "spec": spec.model_dump(mode="json"),
            "original": payload,
            "reason": "success rule 0 met",
            "tasks": [
                {
                    "role": "Master",
                    "index": 0,
                    "attempt": 1,
                    "state": "SUCCEEDED",
                    "updated_at": now,
                },
                {"role": "Worker", "index": 0, "attempt": 1, "state": "RUNNING", "updated_at": now},
            ],
        },
    )
    assert out["kind"] == "PyTorchJob" and out["metadata"]["namespace"] == "kubeflow"
    status = out["status"]
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running", "Succeeded"]
    assert status["replicaStatuses"] == {
        "Master": {"active": 0, "succeeded": 1, "failed": 0},
        "Worker": {"active": 1, "succeeded": 0, "failed": 0},
    }
    assert status["completionTime"] == "2024-05-01T00:00:00Z"


def test_a_job_whose_tasks_are_still_starting_renders_without_a_start_time() -> None:
    # Was a 500 for GET and LIST: the tasks placed but not started have no time yet.
    payload = load("pytorchjob-simple.yaml")
    spec = translate_kubeflow(payload).spec
    now = datetime(2024, 5, 1, tzinfo=UTC)
    view = {
        "id": "j2", "name": "pytorch-simple", "state": "PLACED", "submitted_at": now,
        "updated_at": now, "spec": spec.model_dump(mode="json"), "original": payload,
        "tasks": [
            {"role": "Master", "index": 0, "attempt": 1, "state": "PENDING"},
            {"role": "Worker", "index": 0, "attempt": 1, "state": "STARTING", "updated_at": None},
        ],
    }  # fmt: skip
    out = render("pytorchjobs", view)
    assert "startTime" not in out["status"]
    later = datetime(2024, 5, 1, 0, 5, tzinfo=UTC)
    view["tasks"][1] |= {"state": "RUNNING", "started_at": later, "updated_at": later}
    assert render("pytorchjobs", view)["status"]["startTime"] == "2024-05-01T00:05:00Z"


def test_variable_references_in_a_containers_argv_expand_as_the_kubelet_expands_them() -> None:
    import subprocess

    from trainyard_common.dialects.k8s_pod import shell_command

    argv = ["echo", "--addr=$(MASTER_ADDR):$(MASTER_PORT)", "$$(KEPT)", "$(UNSET)", "it's $x"]
    line = shell_command(argv)
    ran = subprocess.run(
        ["sh", "-c", f"set -- {line}; for a; do printf '[%s]' \"$a\"; done"],
        env={"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "23456", "x": "no"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # Set: its value; $$: a literal $; not set: left as written; shell syntax: literal.
    assert ran.stdout == "[echo][--addr=10.0.0.7:23456][$(KEPT)][$(UNSET)][it's $x]"


def test_a_tfjob_without_ports_gets_kubeflows_default_port_and_so_its_tf_config() -> None:
    import json

    from trainyard_common.events import PortAssignment, TaskPlacement
    from trainyard_launcher.domain.frameworks import tf_config

    payload = {
        "apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "mnist"},
        "spec": {"tfReplicaSpecs": {
            role: {"replicas": n, "template": {"spec": {"containers": [
                {"name": "tensorflow", "image": "tf:2", "command": ["python", "dist.py"]}]}}}
            for role, n in (("PS", 1), ("Worker", 2))
        }},
    }  # fmt: skip
    spec = translate_kubeflow(payload).spec
    assert all([p.label for p in role.ports] == ["tfjob-port"] for role in spec.roles)
    tasks = [
        TaskPlacement(role=role, index=i, node="n", host_ip="10.0.0.1",
                      ports=[PortAssignment(label="tfjob-port", ports=[30000 + 10 * n + i])])
        for n, (role, count) in enumerate((("PS", 1), ("Worker", 2)))
        for i in range(count)
    ]  # fmt: skip
    config = json.loads(tf_config(spec, tasks, "Worker", 1) or "null")
    assert config["cluster"] == {
        "ps": ["10.0.0.1:30000"],
        "worker": ["10.0.0.1:30010", "10.0.0.1:30011"],
    }
    assert config["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize(
    ("name", "kind", "plural", "success"),
    [
        ("mpijob-hello.yaml", JobKind.MPI, "mpijobs", [[("Launcher", 0)]]),
        ("xgboostjob-rabit.yaml", JobKind.XGBOOST, "xgboostjobs", [[("Master", 0)]]),
        (
            "paddlejob-collective.yaml",
            JobKind.PADDLE,
            "paddlejobs",
            [[("Worker", 0), ("Worker", 1)]],
        ),
        ("jaxjob-simple.yaml", JobKind.JAX, "jaxjobs", [[("Worker", 0), ("Worker", 1)]]),
    ],
)
def test_every_training_operator_kind_translates_with_its_completion_rule(
    name: str, kind: JobKind, plural: str, success: list[list[tuple[str, int]]]
) -> None:
    payload = load(name)
    result = translate(payload, user="bob")
    assert result.errors == [], result.errors
    assert result.spec.kind is kind
    assert result.key == f"default/{plural}/{payload['metadata']['name']}"
    assert rules(result.spec) == success
    # An MPIJob's workers run no command: on the local backend they are not refused.
    from trainyard_common.cluster import ClusterSpec
    from trainyard_common.runtimes import runtime_errors

    local = ClusterSpec(nodes=[], runtime="local")
    assert runtime_errors(result.spec, local, lambda role, field: "$") == []


def test_kind_rules_of_the_new_kinds() -> None:
    mpi = load("mpijob-hello.yaml")
    del mpi["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert [e.path for e in translate_kubeflow(mpi).errors] == ["$.spec.mpiReplicaSpecs.Launcher"]
    two = load("mpijob-hello.yaml")
    two["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    assert [e.code for e in translate_kubeflow(two).errors] == ["range"]
    slots = load("mpijob-hello.yaml")
    slots["spec"]["slotsPerWorker"] = 4
    assert "$.spec.slotsPerWorker" in [w.path for w in translate_kubeflow(slots).warnings]
    paddle = load("paddlejob-collective.yaml")
    paddle["spec"]["paddleReplicaSpecs"]["Master"] = copy.deepcopy(
        paddle["spec"]["paddleReplicaSpecs"]["Worker"]
    )
    paddle["spec"]["paddleReplicaSpecs"]["Master"]["replicas"] = 1
    assert rules(translate_kubeflow(paddle).spec) == [[("Master", 0)]]
    jax = load("jaxjob-simple.yaml")
    jax["spec"]["jaxReplicaSpecs"]["Master"] = jax["spec"]["jaxReplicaSpecs"]["Worker"]
    assert [e.code for e in translate_kubeflow(jax).errors] == ["enum"]
    # A worker-only MPI job (no launcher) still needs its workers' commands.
    tf = load("tfjob-simple.yaml")
    assert translate_kubeflow(tf).spec.kind is JobKind.TENSORFLOW


def test_the_mpi_operators_v2beta1_mpijob_translates_with_its_own_fields() -> None:
    payload = load("mpijob-v2beta1-hello.yaml")
    result = translate(payload, user="bob")
    assert result.errors == [] and result.warnings == [], (result.errors, result.warnings)
    assert result.spec.kind is JobKind.MPI
    # One resource with v1's MPIJobs: the same name key.
    assert result.key == "default/mpijobs/mpi-v2-hello"
    assert rules(result.spec) == [[("Launcher", 0)]]
    assert env_dict(result.spec.env) == {MPI_IMPLEMENTATION_ENV: "OpenMPI"}
    mpich = copy.deepcopy(payload)
    mpich["spec"]["mpiImplementation"] = "MPICH"
    mpich["spec"]["sshAuthMountPath"] = "/home/mpiuser/.ssh"
    done = translate_kubeflow(mpich)
    assert env_dict(done.spec.env) == {MPI_IMPLEMENTATION_ENV: "MPICH"}
    assert [w.path for w in done.warnings] == ["$.spec.sshAuthMountPath"]
    bad = copy.deepcopy(payload)
    bad["spec"]["mpiImplementation"] = "LAM"
    bad["spec"]["launcherCreationPolicy"] = "Never"
    assert [e.path for e in translate_kubeflow(bad).errors] == [
        "$.spec.mpiImplementation",
        "$.spec.launcherCreationPolicy",
    ]
    # v1's own fields are not v2beta1's, and v2beta1 is MPIJob's alone.
    old = copy.deepcopy(payload)
    old["spec"]["mainContainer"] = "mpi"
    assert [w.code for w in translate_kubeflow(old).warnings] == ["unknown_field"]
    torch = load("pytorchjob-simple.yaml")
    torch["apiVersion"] = "kubeflow.org/v2beta1"
    [wrong] = translate_kubeflow(torch).errors
    assert wrong.path == "$.apiVersion" and "'kubeflow.org/v1'" in wrong.message


def test_the_sdks_get_job_then_update_job_changes_only_what_it_meant() -> None:
    """TrainingClient.update_job sends back the whole model get_job read, and the SDK's
    models type a container's limits as strings: a job written with gpu: 1 came back
    with "1", refused as a change of a submitted job, so the SDK could not suspend it."""
    from kubeflow.training import models
    from kubeflow.training.api_client import ApiClient as TrainingApiClient
    from kubeflow.training.utils.utils import FakeResponse
    from kubernetes.client import ApiClient

    current = load("pytorchjob-simple.yaml")
    for replica in current["spec"]["pytorchReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        container["resources"] = {"limits": {"cpu": 1, "memory": "1Gi", "nvidia.com/gpu": 1}}
    shown = copy.deepcopy(current) | {"spec": {**current["spec"], "runPolicy": {}}}
    job = TrainingApiClient().deserialize(FakeResponse(shown), "KubeflowOrgV1PyTorchJob")
    assert job.spec.pytorch_replica_specs["Master"].template.spec.containers[0].resources.limits[
        "nvidia.com/gpu"
    ] == "1"  # fmt: skip
    job.spec.run_policy = models.KubeflowOrgV1RunPolicy(suspend=True)
    body = ApiClient().sanitize_for_serialization(job)
    control = kubeflow.control_from_patch(current, body)
    assert control.errors == [] and control.pause is True
    # A quantity that is not the same is still a change.
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"][
        "limits"
    ]["nvidia.com/gpu"] = "2"
    assert kubeflow.control_from_patch(current, body).errors


def test_a_job_between_a_failed_attempt_and_its_retry_is_restarting() -> None:
    """The operator's Restarting condition takes Running's place until the job runs
    again (the SDK's is_job_restarting); a resume after a pause is no restart."""
    payload = load("pytorchjob-simple.yaml")
    spec = translate_kubeflow(payload).spec.model_dump(mode="json")
    now = datetime(2024, 5, 1, tzinfo=UTC)
    failed = {"attempt": 1, "state": "FAILED", "reason": "Master 0 exited 1; retrying",
              "retried_as": 2}  # fmt: skip
    view = {"id": "j1", "name": "p", "state": "QUEUED", "attempt": 2, "submitted_at": now,
            "updated_at": now, "spec": spec, "original": payload, "tasks": [],
            "attempts": [failed]}  # fmt: skip

    def types(v: dict) -> list[tuple[str, str]]:
        return [(c["type"], c["status"]) for c in render("pytorchjobs", v)["status"]["conditions"]]

    assert types(view) == [("Created", "True"), ("Restarting", "True")]
    restarting = render("pytorchjobs", view)["status"]["conditions"][1]
    assert restarting["reason"] == "PyTorchJobRestarting" and "retrying" in restarting["message"]
    assert types({**view, "state": "RUNNING"}) == [("Created", "True"), ("Running", "True")]
    resumed = {**view, "attempts": [{**failed, "state": "STOPPED", "interrupted": "paused"}]}
    assert types(resumed) == [("Created", "True")]
