"""TF_CONFIG for TensorFlow jobs: the cluster as Kubeflow's TFJob writes it (roles
lower-cased, the evaluator left out of the cluster), one port per task from placement."""

from __future__ import annotations

import json

from trainyard_common.dialects.ti import translate_ti
from trainyard_common.events import PortAssignment, TaskPlacement
from trainyard_common.jobspec import EnvVar, JobKind, JobSpec, PortSpec, RoleSpec
from trainyard_launcher.domain.env import build_task_env
from trainyard_launcher.domain.frameworks import framework_env, tf_config


def role(name: str, replicas: int, ports: list[PortSpec] | None = None) -> RoleSpec:
    return RoleSpec(name=name, replicas=replicas, command="python train.py",
                    ports=[PortSpec(label="tfport")] if ports is None else ports)


def place(name: str, index: int, port: int | None, host: str = "10.0.0.1",
          label: str = "tfport") -> TaskPlacement:
    ports = [PortAssignment(label=label, ports=[port])] if port is not None else []
    return TaskPlacement(role=name, index=index, node="n1", host_ip=host, ports=ports)


def tf_job() -> tuple[JobSpec, list[TaskPlacement]]:
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[
        role("Chief", 1), role("Worker", 2), role("PS", 1), role("Evaluator", 1)])
    tasks = [
        place("Worker", 1, 2002, host="10.0.0.2"), place("Worker", 0, 2001),
        place("Chief", 0, 2000), place("PS", 0, 2003, host="10.0.0.3"),
        place("Evaluator", 0, 2004),
    ]
    return spec, tasks


def test_every_task_gets_the_same_cluster_and_its_own_task() -> None:
    spec, tasks = tf_job()
    cluster = {"chief": ["10.0.0.1:2000"], "worker": ["10.0.0.1:2001", "10.0.0.2:2002"],
               "ps": ["10.0.0.3:2003"]}
    for t in tasks:
        config = json.loads(framework_env(spec, tasks, t.role, t.index)["TF_CONFIG"])
        assert config["cluster"] == cluster
        assert config["task"] == {"type": t.role.lower(), "index": t.index}


def test_the_evaluator_is_a_task_but_not_in_the_cluster() -> None:
    spec, tasks = tf_job()
    config = json.loads(tf_config(spec, tasks, "Evaluator", 0) or "")
    assert "evaluator" not in config["cluster"]
    assert config["task"] == {"type": "evaluator", "index": 0}


def test_master_is_kept_as_master() -> None:
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[role("master", 1),
                                                             role("worker", 1)])
    tasks = [place("master", 0, 3000), place("worker", 0, 3001)]
    config = json.loads(tf_config(spec, tasks, "master", 0) or "")
    assert config == {"cluster": {"master": ["10.0.0.1:3000"], "worker": ["10.0.0.1:3001"]},
                      "task": {"type": "master", "index": 0}}


def test_tfport_wins_over_other_ports_and_any_port_will_do() -> None:
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[
        role("worker", 1, ports=[PortSpec(label="http"), PortSpec(label="tfport")]),
        role("ps", 1, ports=[PortSpec(label="grpc")])])
    tasks = [
        TaskPlacement(role="worker", index=0, node="n1", host_ip="h", ports=[
            PortAssignment(label="http", ports=[80]), PortAssignment(label="tfport", ports=[81])]),
        place("ps", 0, 90, host="h", label="grpc"),
    ]
    assert json.loads(tf_config(spec, tasks, "ps", 0) or "")["cluster"] == {
        "worker": ["h:81"], "ps": ["h:90"]}


def test_no_tf_config_when_a_task_has_no_port() -> None:
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[role("worker", 2, ports=[])])
    tasks = [place("worker", 0, None), place("worker", 1, None)]
    assert framework_env(spec, tasks, "worker", 0) == {}


def test_other_kinds_get_no_tf_config() -> None:
    spec, tasks = tf_job()
    generic = spec.model_copy(update={"kind": JobKind.GENERIC})
    assert framework_env(generic, tasks, "Worker", 0) == {}


def test_build_task_env_carries_tf_config_and_the_job_cannot_forge_it() -> None:
    translated = translate_ti({"name": "n", "cluster": "c", "command": ["true"],
                               "workerCount": 2, "parameterServerCount": 1})
    spec = translated.spec.model_copy(update={"env": [EnvVar(name="TF_CONFIG", value="forged")]})
    tasks = [place("worker", 0, 4000), place("worker", 1, 4001), place("ps", 0, 4002)]
    env = build_task_env(spec, tasks, "worker", 1, attempt=1, job_id="j")
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.0.1:4000", "10.0.0.1:4001"], "ps": ["10.0.0.1:4002"]},
        "task": {"type": "worker", "index": 1}}
    assert env["PAI_CONTAINER_HOST_tfport_PORT_LIST"] == "4001"


def test_the_ti_translation_asks_placement_for_a_tf_port_per_role() -> None:
    spec = translate_ti({"name": "n", "cluster": "c", "command": ["true"], "workerCount": 2,
                         "parameterServerCount": 1, "masterType": "1U2G0P"}).spec
    assert {r.name: [p.label for p in r.ports] for r in spec.roles} == {
        "worker": ["tfport"], "ps": ["tfport"], "master": ["tfport"]}
