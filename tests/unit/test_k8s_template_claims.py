"""A T9k or Kubeflow pod template's PersistentVolumeClaims are the role's volumes:
mounted in its pods on Kubernetes (tests/unit/test_launcher_pods.py), warned of on the
local backend, which mounts none. They were warned of and not mounted anywhere (found by
an audit of the seeds against the code: 5 of the 27 T9k examples keep data or outputs
on a claim)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from trainyard_common.cluster import ClusterSpec, NodeSpec
from trainyard_common.dialects import kubeflow, t9k, translate
from trainyard_common.events import JobAccepted, JobRejected, JobSubmitted
from trainyard_common.jobspec import DataSource
from trainyard_validation.domain.rules import decide

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(path: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / path).read_text())


def test_t9ks_examples_claims_are_their_roles_volumes() -> None:
    t = t9k.translate_t9k(load("t9k/beamjob-1.yaml"))
    assert t.errors == []
    assert [r.volumes for r in t.spec.roles] == [[DataSource(source="pvc://mypvc",
                                                            mount_path="/mypvc")]]  # fmt: skip
    assert not any("mypvc" in w.message for w in t.warnings)


def with_claim(volume: dict[str, Any], *mounts: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(load("kubeflow/pytorchjob-simple.yaml"))
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod["volumes"] = [{"name": "data", **volume}, {"name": "scratch", "emptyDir": {}}]
    pod["containers"][0]["volumeMounts"] = list(mounts)
    return job


def test_a_claim_mounted_twice_and_at_a_sub_path_is_each_mount() -> None:
    job = with_claim(
        {"persistentVolumeClaim": {"claimName": "team.data"}},
        {"name": "data", "mountPath": "/data"},
        {"name": "data", "mountPath": "/out", "subPath": "runs/7"},
        {"name": "data", "mountPath": "/ro", "readOnly": True},
    )
    t = kubeflow.translate_kubeflow(job)
    assert t.errors == []
    worker = t.spec.role("Worker")
    assert worker.volumes == [
        DataSource(source="pvc://team.data", mount_path="/data"),
        DataSource(source="pvc://team.data/runs/7", mount_path="/out"),
        DataSource(source="pvc://team.data", mount_path="/ro", read_only=True),
    ]
    assert t.spec.role("Master").volumes == []
    # The emptyDir is still kept but not mounted, and said so.
    assert any("scratch" in w.message and w.code == "not_applied" for w in t.warnings)


def test_what_kubernetes_refuses_in_a_claim_is_refused_at_its_field() -> None:
    escaping = with_claim({"persistentVolumeClaim": {"claimName": "d"}},
                          {"name": "data", "mountPath": "/d", "subPath": "../etc"})  # fmt: skip
    errors = [(e.path, e.code) for e in kubeflow.translate_kubeflow(escaping).errors]
    assert ("$.spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].volumeMounts[0]"
            ".subPath", "pattern") in errors  # fmt: skip
    bad_name = with_claim({"persistentVolumeClaim": {"claimName": "Bad_Name"}},
                          {"name": "data", "mountPath": "/d"})  # fmt: skip
    paths = [e.path for e in kubeflow.translate_kubeflow(bad_name).errors]
    assert paths == [
        "$.spec.pytorchReplicaSpecs.Worker.template.spec.volumes[0].persistentVolumeClaim.claimName"
    ]
    unmounted = with_claim({"persistentVolumeClaim": {"claimName": "d"}})
    t = kubeflow.translate_kubeflow(unmounted)
    assert t.errors == [] and t.spec.role("Worker").volumes == []
    assert any(w.path.endswith("volumes[0]") for w in t.warnings)  # kept, not mounted


def verdict(payload: dict[str, Any], runtime: str) -> JobAccepted:
    t = translate(payload, user="alice")
    event = JobSubmitted(job_id="j", spec=t.spec, dialect=t.dialect, dialect_key=t.key,
                         original=payload, warnings=t.warnings)  # fmt: skip
    nodes = [NodeSpec(name="n", cpu=64, memory_mb=256_000, gpus=8, gpu_type="V100")]
    result = decide(event, ClusterSpec(nodes=nodes, runtime=runtime))  # type: ignore[arg-type]
    assert isinstance(result, JobAccepted), result
    return result


def test_the_local_backend_says_it_mounts_no_claim() -> None:
    job = load("t9k/beamjob-1.yaml")
    local = [w for w in verdict(job, "local").warnings if "pvc://mypvc" in w.message]
    assert [w.path for w in local] == [
        "$.spec.jobTemplate.spec.template.spec.containers[0].volumeMounts"
    ]
    assert not any("pvc://mypvc" in w.message for w in verdict(job, "kubernetes").warnings)


def test_a_claim_at_a_path_already_mounted_is_refused_on_kubernetes() -> None:
    # The API server refuses a pod with two volumes at one path: every task failed at
    # its start (found in review).
    job = with_claim({"persistentVolumeClaim": {"claimName": "d"}},
                     {"name": "data", "mountPath": "/data"},
                     {"name": "data", "mountPath": "/data/"})  # fmt: skip
    t = translate(job, user="alice")
    event = JobSubmitted(job_id="j", spec=t.spec, dialect=t.dialect, dialect_key=t.key,
                         original=job, warnings=t.warnings)  # fmt: skip
    nodes = [NodeSpec(name="n", cpu=64, memory_mb=256_000, gpus=8, gpu_type="V100")]
    result = decide(event, ClusterSpec(nodes=nodes, runtime="kubernetes"))
    assert isinstance(result, JobRejected)
    assert [(e.path, e.code) for e in result.errors] == [
        ("$.spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].volumeMounts",
         "duplicate")
    ]  # fmt: skip
    # Once each: taken.
    once = with_claim({"persistentVolumeClaim": {"claimName": "d"}},
                      {"name": "data", "mountPath": "/data"})  # fmt: skip
    assert isinstance(verdict(once, "kubernetes"), JobAccepted)
