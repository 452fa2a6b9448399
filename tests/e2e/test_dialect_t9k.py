"""T9k jobs and a Kubeflow PyTorchJob through the whole platform, created, read and
deleted at their Kubernetes-style paths."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from .conftest import Api, unique

pytestmark = pytest.mark.e2e

T9K = "/apis/batch.tensorstack.dev/v1beta1/namespaces/team-a"
KUBEFLOW = "/apis/kubeflow.org/v1/namespaces/ml"


def container(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": name,
                        "image": "python:3.11",
                        "command": command,
                        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                        **extra,
                    }
                ]
            }
        }
    }


def generic_job(name: str, master: list[str], worker: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "GenericJob",
        "metadata": {"name": name},
        "spec": {
            "successRules": [{"master": [0]}],
            "failureRules": [{"master": [0]}],
            "replicaSpecs": [
                {
                    "type": "master",
                    "replicas": 1,
                    "restartPolicy": {"policy": "Never", "limit": 0},
                    **container("main", master, imagePullPolicy="IfNotPresent"),
                },
                {
                    "type": "worker",
                    "replicas": 2,
                    "restartPolicy": {"policy": "Never", "limit": 0},
                    **container("main", worker),
                },
            ],
        },
    }


def create(api: Api, base: str, plural: str, payload: dict[str, Any]) -> Any:
    return api.http.post(
        f"{base}/{plural}",
        content=yaml.safe_dump(payload),
        headers={"Content-Type": "application/yaml"},
    )


def wait_phase(api: Api, path: str, phases: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = api.http.get(path)
        if answer.status_code == 200:
            body = answer.json()
            if body["status"].get("phase") in phases:
                return body
        time.sleep(0.2)
    raise AssertionError(f"{path} not in {phases} after {timeout}s: {body}")


def test_generic_job_with_two_replica_types_succeeds_by_its_success_rule(api: Api) -> None:
    name = unique("generic")
    answer = create(
        api,
        T9K,
        "genericjobs",
        generic_job(name, ["python3", "-c", "print('master done')"], ["sleep", "30"]),
    )
    assert answer.status_code == 201, answer.text
    created = answer.json()
    assert created["kind"] == "GenericJob"
    assert created["metadata"]["namespace"] == "team-a"
    assert created["metadata"]["name"] == name and created["metadata"]["uid"]
    assert created["metadata"]["creationTimestamp"].endswith("Z")
    # Translation warnings come back as Kubernetes sends them.
    warnings = answer.headers.get_list("warning")
    # (On this local-backend platform the image, and so its pull policy, is not used.)
    assert any(w.startswith('299 - "$.spec: image python:3.11 is not used') for w in warnings), (
        warnings
    )

    # The master's success ends the job while its workers still sleep.
    resource = wait_phase(api, f"{T9K}/genericjobs/{name}", {"Succeeded", "Failed"}, 40)
    status = resource["status"]
    assert status["phase"] == "Succeeded", status
    assert resource["spec"]["successRules"] == [{"master": [0]}]
    assert resource["metadata"]["uid"] == created["metadata"]["uid"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Completed"]["status"] == "True"
    assert "success rule 0 met: master[0] succeeded" in conditions["Completed"]["message"]
    tasks = {t["type"]: t for t in status["tasks"]}
    assert set(tasks) == {"master", "worker"}
    [master] = tasks["master"]["replicas"]
    assert (master["phase"], master["exitCode"], master["name"]) == (
        "Succeeded",
        0,
        f"{name}-master-0",
    )
    assert master["node"]
    assert len(tasks["worker"]["replicas"]) == 2
    assert status["replicaStatuses"]["master"]["succeeded"] == 1

    listed = api.http.get(f"{T9K}/genericjobs")
    assert listed.status_code == 200
    body = listed.json()
    assert body["kind"] == "GenericJobList"
    assert name in [item["metadata"]["name"] for item in body["items"]]
    other_ns = api.http.get("/apis/batch.tensorstack.dev/v1beta1/namespaces/elsewhere/genericjobs")
    assert name not in [i["metadata"]["name"] for i in other_ns.json()["items"]]

    canonical = api.job(created["metadata"]["uid"])
    assert canonical["state"] == "SUCCEEDED" and canonical["dialect"] == "t9k"


def test_missing_resource_is_a_kubernetes_not_found(api: Api) -> None:
    answer = api.http.get(f"{T9K}/genericjobs/{unique('nothing')}")
    assert answer.status_code == 404
    body = answer.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "NotFound", 404)
    assert api.http.get(f"{T9K}/sparkjobs").status_code == 404


def test_delete_stops_a_running_job(api: Api) -> None:
    name = unique("longrun")
    answer = create(api, T9K, "genericjobs", generic_job(name, ["sleep", "60"], ["sleep", "60"]))
    assert answer.status_code == 201, answer.text
    uid = answer.json()["metadata"]["uid"]
    wait_phase(api, f"{T9K}/genericjobs/{name}", {"Running"}, 30)

    deleted = api.http.delete(f"{T9K}/genericjobs/{name}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["kind"] == "Status" and deleted.json()["details"]["uid"] == uid

    # The resource is gone at once, as a deleted Kubernetes object is; its job stops and
    # stays on record in Trainyard's own API.
    deadline = time.monotonic() + 10
    while api.http.get(f"{T9K}/genericjobs/{name}").status_code != 404:
        assert time.monotonic() < deadline, "the deleted resource is still listed"
        time.sleep(0.2)
    assert api.wait(uid)["state"] == "STOPPED"
    assert api.http.delete(f"{T9K}/genericjobs/{unique('ghost')}").status_code == 404


MERGE = {"Content-Type": "application/merge-patch+json"}


def patch(api: Api, path: str, body: Any, headers: dict[str, str] = MERGE) -> Any:
    return api.http.patch(path, content=json.dumps(body), headers=headers)


def test_patch_pauses_and_resumes_a_running_job(api: Api) -> None:
    name = unique("pausable")
    path = f"{T9K}/genericjobs/{name}"
    answer = create(api, T9K, "genericjobs", generic_job(name, ["sleep", "60"], ["sleep", "60"]))
    assert answer.status_code == 201, answer.text
    uid = answer.json()["metadata"]["uid"]
    wait_phase(api, path, {"Running"}, 30)

    paused = patch(api, path, {"spec": {"runMode": {"pause": {"enabled": True}}}})
    assert paused.status_code == 200, paused.text
    assert paused.json()["spec"]["runMode"]["pause"]["enabled"] is True
    assert paused.json()["metadata"]["uid"] == uid
    assert api.wait(uid, {"PAUSED"}, 30)["state"] == "PAUSED"
    wait_phase(api, path, {"Paused"}, 10)

    resumed = patch(api, path, {"spec": {"runMode": {"pause": None}}})
    assert resumed.status_code == 200, resumed.text
    assert api.wait(uid, {"RUNNING"}, 30)["state"] == "RUNNING"
    assert api.http.delete(path).status_code == 200
    assert api.wait(uid)["state"] == "STOPPED"


def test_patch_of_expected_replicas_scales_an_elastic_job(api: Api) -> None:
    name = unique("elastic")
    path = f"{T9K}/pytorchtrainingjobs/{name}"
    payload = {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "PyTorchTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "elastic": {"enabled": True, "minReplicas": 1, "maxReplicas": 3, "expectedReplicas": 1},
            "replicaSpecs": [
                {"type": "worker", "replicas": 1, **container("python", ["sleep", "60"])}
            ],
        },
    }
    answer = create(api, T9K, "pytorchtrainingjobs", payload)
    assert answer.status_code == 201, answer.text
    uid = answer.json()["metadata"]["uid"]
    wait_phase(api, path, {"Running"}, 30)

    scaled = patch(api, path, {"spec": {"elastic": {"expectedReplicas": 2}}})
    assert scaled.status_code == 200, scaled.text
    commands = [e["event"] for e in api.events(uid) if e["type"] == "ScaleJob"]
    deadline = time.monotonic() + 10
    while not commands and time.monotonic() < deadline:
        time.sleep(0.2)
        commands = [e["event"] for e in api.events(uid) if e["type"] == "ScaleJob"]
    assert [(c["role"], c["replicas"]) for c in commands] == [("worker", 2)]
    # The job runs again at its new size.
    deadline = time.monotonic() + 30
    running: set[tuple[str, int]] = set()
    while running != {("worker", 0), ("worker", 1)} and time.monotonic() < deadline:
        time.sleep(0.2)
        running = {
            (t["role"], t["index"]) for t in api.job(uid)["tasks"] if t["state"] == "RUNNING"
        }
    assert running == {("worker", 0), ("worker", 1)}, api.job(uid)
    out_of_bounds = patch(api, path, {"spec": {"elastic": {"expectedReplicas": 9}}})
    assert out_of_bounds.status_code == 422
    assert api.http.delete(path).status_code == 200


def test_patch_refusals_are_kubernetes_statuses(api: Api) -> None:
    name = unique("fixed")
    path = f"{T9K}/genericjobs/{name}"
    answer = create(api, T9K, "genericjobs", generic_job(name, ["sleep", "60"], ["sleep", "60"]))
    assert answer.status_code == 201, answer.text
    uid = answer.json()["metadata"]["uid"]
    # Merge, JSON and strategic merge patches are understood; server-side apply is not.
    wrong = patch(api, path, {"spec": {}}, {"Content-Type": "application/apply-patch+yaml"})
    assert wrong.status_code == 415 and wrong.json()["reason"] == "UnsupportedMediaType"
    failed_test = patch(
        api,
        path,
        [{"op": "test", "path": "/metadata/name", "value": "someone-else"}],
        {"Content-Type": "application/json-patch+json"},
    )
    assert failed_test.status_code == 422 and "test of" in failed_test.json()["message"]
    # A job's size is fixed unless it is elastic; the cause names the field.
    scaled = patch(
        api,
        path,
        {
            "spec": {
                "replicaSpecs": [
                    {**r, "replicas": 3}
                    for r in generic_job(name, ["sleep", "60"], ["sleep", "60"])["spec"][
                        "replicaSpecs"
                    ]
                ]
            }
        },
    )
    assert scaled.status_code == 422, scaled.text
    assert [c["field"] for c in scaled.json()["details"]["causes"]] == [
        "spec.replicaSpecs[0].replicas",
        "spec.replicaSpecs[1].replicas",
    ]
    ghost = patch(
        api,
        f"{T9K}/genericjobs/{unique('ghost')}",
        {"spec": {"runMode": {"pause": {"enabled": True}}}},
    )
    assert ghost.status_code == 404
    assert api.seen(uid)["state"] not in ("PAUSED", "STOPPED")
    assert api.http.delete(path).status_code == 200


def test_invalid_fields_are_a_422_status_naming_them(api: Api) -> None:
    payload = generic_job(unique("bad"), ["true"], ["true"])
    payload["spec"]["replicaSpecs"][1]["replicas"] = 0
    payload["spec"]["runMode"] = {"elastic": {"enabled": True, "minReplicas": 1, "maxReplicas": 2}}
    answer = create(api, T9K, "genericjobs", payload)
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert (body["kind"], body["reason"]) == ("Status", "Invalid")
    fields = {c["field"] for c in body["details"]["causes"]}
    assert {"spec.replicaSpecs[1].replicas", "spec.runMode.elastic"} <= fields
    # The rejected job is on record in Trainyard's API, but was never a resource: as the
    # API server's 422, nothing was created and the name stays free.
    assert api.wait(body["details"]["uid"])["state"] == "REJECTED"
    assert api.http.get(f"{T9K}/genericjobs/{payload['metadata']['name']}").status_code == 404
    payload["spec"]["replicaSpecs"][1]["replicas"] = 1
    del payload["spec"]["runMode"]
    fixed = create(api, T9K, "genericjobs", payload)
    assert fixed.status_code == 201, fixed.text
    assert api.http.delete(f"{T9K}/genericjobs/{payload['metadata']['name']}").status_code == 200


def test_a_kind_that_does_not_match_the_path_is_a_bad_request(api: Api) -> None:
    payload = generic_job(unique("mismatch"), ["true"], ["true"])
    answer = create(api, T9K, "pytorchtrainingjobs", payload)
    assert answer.status_code == 400 and answer.json()["reason"] == "BadRequest"
    payload["metadata"]["namespace"] = "other"
    answer = create(api, T9K, "genericjobs", payload)
    assert answer.status_code == 400


def test_kubeflow_pytorchjob_yaml_succeeds(api: Api) -> None:
    name = unique("torch")
    text = f"""
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - name: pytorch
              image: python:3.11
              command: ["python3", "-c", "print('hello from the master')"]
    Worker:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - name: pytorch
              image: python:3.11
              command: ["python3", "-c", "print('hello from a worker')"]
"""
    answer = api.http.post(
        f"{KUBEFLOW}/pytorchjobs", content=text, headers={"Content-Type": "application/yaml"}
    )
    assert answer.status_code == 201, answer.text
    uid = answer.json()["metadata"]["uid"]
    view = api.wait(uid)
    assert view["state"] == "SUCCEEDED", view
    logs = api.http.get(f"/v1/jobs/{uid}/logs", params={"role": "Master", "index": 0})
    assert logs.status_code == 200 and logs.text.strip() == "hello from the master"
    resource = api.http.get(f"{KUBEFLOW}/pytorchjobs/{name}").json()
    assert resource["kind"] == "PyTorchJob"
    assert [c["type"] for c in resource["status"]["conditions"]][-1] == "Succeeded"
    assert resource["status"]["replicaStatuses"]["Master"]["succeeded"] == 1
