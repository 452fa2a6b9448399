"""The platform's Kubernetes API as Kubernetes users reach it, with their own clients
unchanged: kubectl (v1.34, built with the test cluster) over HTTPS with the kubeconfig
`yard kubeconfig` writes, and the official Kubernetes Python client's CRUD and Watch."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from trainyard_stack.kube import ensure_kube_binaries
from trainyard_stack.platform import Platform

from .conftest import Api, unique, yard

pytestmark = pytest.mark.e2e

GROUP, VERSION = "kubeflow.org", "v1"


def pytorchjob(
    name: str, command: list[str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": labels or {"team": "a"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "spec": {"containers": [{"name": "pytorch", "image": "python:3.11",
                                                 "command": command}]}
                    },
                }
            }
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def kubeconfig(platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kube") / "config"
    done = subprocess.run(
        [*yard_cmd(), "kubeconfig", "--server", platform.kube_url, "--ca-file",
         str(platform.ca_file), "-n", "ml", "-f", str(path)],
        env={"YARD_TOKEN": platform.token, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


def yard_cmd() -> list[str]:
    return [sys.executable, "-m", "trainyard_sdk"]


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ensure_kube_binaries() / "trainyard-kube"), "kubectl", "--kubeconfig",
         str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def api_client(kubeconfig: Path) -> Iterator[k8s.ApiClient]:
    with k8s_config.new_client_from_config(str(kubeconfig)) as client:
        yield client


def test_the_kubeconfig_is_https_with_the_platforms_ca_and_the_token(
    kubeconfig: Path, platform: Platform
) -> None:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == platform.kube_url and cluster["server"].startswith("https://")
    assert config["users"][0]["user"]["token"] == platform.token
    # kubectl trusts nothing else: the same server with another CA is refused.
    assert "Server Version" in ok(kubectl(kubeconfig, "version"))
    bad = yaml.safe_load(kubeconfig.read_text())
    bad["clusters"][0]["cluster"]["certificate-authority-data"] = (
        config["clusters"][0]["cluster"]["certificate-authority-data"][:-40] + "A" * 36 + "Cg=="
    )
    other = kubeconfig.with_name("bad")
    other.write_text(yaml.safe_dump(bad))
    assert kubectl(other, "get", "pytorchjobs").returncode != 0


def test_discovery_lists_every_served_kind(kubeconfig: Path) -> None:
    resources = ok(kubectl(kubeconfig, "api-resources", "--api-group", GROUP, "-o", "name"))
    assert "pytorchjobs.kubeflow.org" in resources.split()
    assert "tfjobs.kubeflow.org" in resources.split()
    t9k = ok(kubectl(kubeconfig, "api-resources", "--api-group", "batch.tensorstack.dev"))
    assert "genericjobs" in t9k


def test_kubectl_create_get_label_patch_apply_and_delete(kubeconfig: Path, api: Api) -> None:
    name = unique("kubectl")
    manifest = yaml.safe_dump(pytorchjob(name, ["sleep", "60"]))
    created = ok(kubectl(kubeconfig, "create", "-f", "-", stdin=manifest))
    assert f"pytorchjob.kubeflow.org/{name} created" in created
    again = kubectl(kubeconfig, "create", "-f", "-", stdin=manifest)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr

    got = yaml.safe_load(ok(kubectl(kubeconfig, "get", "pytorchjob", name, "-o", "yaml")))
    assert got["metadata"]["namespace"] == "ml" and got["metadata"]["generation"] == 1
    assert int(got["metadata"]["resourceVersion"]) > 0
    uid = got["metadata"]["uid"]
    table = ok(kubectl(kubeconfig, "get", "pytorchjobs"))
    assert table.splitlines()[0].split() == ["NAME", "STATE", "AGE"]
    assert any(line.split()[0] == name for line in table.splitlines()[1:])
    # kubectl's chunks (limit and continue, 500 by default): one object a page here.
    whole = ok(kubectl(kubeconfig, "get", "pytorchjobs", "-o", "name")).split()
    chunked = kubectl(kubeconfig, "get", "pytorchjobs", "-o", "name", "--chunk-size=1", "-v=6")
    assert ok(chunked).split() == whole and f"pytorchjob.kubeflow.org/{name}" in whole
    assert "pytorchjobs?continue=" in chunked.stderr, chunked.stderr  # it followed a page

    ok(kubectl(kubeconfig, "label", "pytorchjob", name, "owner=bob"))
    selected = ok(kubectl(kubeconfig, "get", "pytorchjobs", "-l", "owner=bob", "-o", "name"))
    assert selected.split() == [f"pytorchjob.kubeflow.org/{name}"]
    assert (
        ok(kubectl(kubeconfig, "get", "pytorchjobs", "-l", "owner!=bob", "-o", "name")).find(name)
        < 0
    )

    # kubectl patch's default (strategic) and --type=json both act on the job.
    ok(
        kubectl(
            kubeconfig, "patch", "pytorchjob", name, "-p", '{"spec":{"runPolicy":{"suspend":true}}}'
        )
    )
    assert api.wait(uid, {"PAUSED"}, 30)["state"] == "PAUSED"
    ok(
        kubectl(
            kubeconfig,
            "patch",
            "pytorchjob",
            name,
            "--type=json",
            "-p",
            '[{"op":"replace","path":"/spec/runPolicy/suspend","value":false}]',
        )
    )
    assert api.wait(uid, {"RUNNING"}, 30)["state"] == "RUNNING"
    got = yaml.safe_load(ok(kubectl(kubeconfig, "get", "pytorchjob", name, "-o", "yaml")))
    assert got["metadata"]["generation"] == 3 and got["metadata"]["labels"]["owner"] == "bob"
    refused = kubectl(
        kubeconfig,
        "patch",
        "pytorchjob",
        name,
        "--type=merge",
        "-p",
        '{"spec":{"pytorchReplicaSpecs":{"Master":{"replicas":3}}}}',
    )
    assert refused.returncode != 0 and "replicas" in refused.stderr

    # apply: the three-way merge of the last applied configuration, kept by the server.
    changed = pytorchjob(name, ["sleep", "60"], {"team": "b"})
    ok(kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(changed)))
    assert "unchanged" in ok(kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(changed)))
    labels = json.loads(
        ok(kubectl(kubeconfig, "get", "pytorchjob", name, "-o", "jsonpath={.metadata.labels}"))
    )
    assert labels == {"team": "b", "owner": "bob"}  # kubectl's label was never applied

    deleted = ok(kubectl(kubeconfig, "delete", "pytorchjob", name))
    assert f'"{name}" deleted' in deleted
    assert api.wait(uid)["state"] == "STOPPED"
    missing = kubectl(kubeconfig, "get", "pytorchjob", name)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
    # The name is free again at once, for a new job.
    recreated = ok(kubectl(kubeconfig, "create", "-f", "-", stdin=manifest))
    assert "created" in recreated
    new_uid = ok(kubectl(kubeconfig, "get", "pytorchjob", name, "-o", "jsonpath={.metadata.uid}"))
    assert new_uid and new_uid != uid
    ok(kubectl(kubeconfig, "delete", "pytorchjobs", "-l", "team=a"))
    assert api.wait(new_uid)["state"] == "STOPPED"


def test_kubectl_get_watch_follows_a_job_to_its_end(kubeconfig: Path) -> None:
    name = unique("watched")
    watcher = subprocess.Popen(
        [str(ensure_kube_binaries() / "trainyard-kube"), "kubectl", "--kubeconfig",
         str(kubeconfig), "get", "pytorchjobs", "-w", "--output-watch-events",
         "--field-selector", f"metadata.name={name}", "--request-timeout", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watcher.stdout or []), daemon=True)
    reader.start()
    try:
        time.sleep(2)
        ok(
            kubectl(
                kubeconfig,
                "create",
                "-f",
                "-",
                stdin=yaml.safe_dump(pytorchjob(name, ["sleep", "2"])),
            )
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("Succeeded" in ln for ln in lines):
            time.sleep(0.3)
        ok(kubectl(kubeconfig, "delete", "pytorchjob", name))
        while time.monotonic() < deadline and not any(ln.startswith("DELETED") for ln in lines):
            time.sleep(0.3)
    finally:
        watcher.terminate()
        watcher.wait(10)
    events = [ln.split()[0] for ln in lines if ln.strip() and not ln.startswith("EVENT")]
    assert events[0] == "ADDED", lines
    assert "MODIFIED" in events and events[-1] == "DELETED", lines
    assert any("Succeeded" in ln for ln in lines), lines


def test_python_client_crud_and_watch(api_client: k8s.ApiClient, api: Api) -> None:
    custom = k8s.CustomObjectsApi(api_client)
    name = unique("pyclient")
    body = pytorchjob(name, ["sleep", "60"])
    made = custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "pytorchjobs", body)
    assert made["metadata"]["name"] == name and made["metadata"]["uid"]
    version = custom.list_namespaced_custom_object(GROUP, VERSION, "ml", "pytorchjobs")["metadata"][
        "resourceVersion"
    ]

    with pytest.raises(k8s.ApiException) as taken:
        custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "pytorchjobs", body)
    assert taken.value.status == 409 and json.loads(taken.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(k8s.ApiException) as missing:
        custom.get_namespaced_custom_object(GROUP, VERSION, "ml", "pytorchjobs", unique("none"))
    assert missing.value.status == 404 and json.loads(missing.value.body)["kind"] == "Status"

    current = custom.get_namespaced_custom_object(GROUP, VERSION, "ml", "pytorchjobs", name)
    current["metadata"]["annotations"] = {"note": "replaced"}
    replaced = custom.replace_namespaced_custom_object(
        GROUP, VERSION, "ml", "pytorchjobs", name, current
    )
    assert replaced["metadata"]["annotations"] == {"note": "replaced"}
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "ml", "pytorchjobs", name, {"metadata": {"labels": {"stage": "two"}}}
    )
    status = custom.get_namespaced_custom_object_status(GROUP, VERSION, "ml", "pytorchjobs", name)
    assert status["status"]["conditions"][0]["type"] == "Created"

    seen: list[tuple[str, str]] = []
    stream = k8s_watch.Watch()
    deleted = False
    for event in stream.stream(
        custom.list_namespaced_custom_object, GROUP, VERSION, "ml", "pytorchjobs",
        resource_version=version, timeout_seconds=60,
    ):  # fmt: skip
        obj = event["object"]
        if obj["metadata"]["name"] != name:
            continue
        seen.append((event["type"], obj["metadata"].get("labels", {}).get("stage", "")))
        if ("MODIFIED", "two") in seen and not deleted:
            custom.delete_namespaced_custom_object(GROUP, VERSION, "ml", "pytorchjobs", name)
            deleted = True
        if event["type"] == "DELETED":
            stream.stop()
    assert ("MODIFIED", "two") in seen and seen[-1][0] == "DELETED", seen
    assert api.wait(made["metadata"]["uid"])["state"] == "STOPPED"


def test_errors_are_statuses_and_a_used_name_is_refused_in_each_dialect(
    api: Api, platform: Platform
) -> None:
    name = unique("dup")
    pai = {
        "protocolVersion": 2,
        "name": name,
        "type": "job",
        "prerequisites": [{"type": "dockerimage", "uri": "python:3.11", "name": "image"}],
        "taskRoles": {
            "main": {
                "instances": 1,
                "dockerImage": "image",
                "resourcePerInstance": {"cpu": 1, "memoryMB": 512, "gpu": 0},
                "commands": ["true"],
            }
        },
    }
    first = api.http.post("/api/v2/jobs", json=pai)
    assert first.status_code == 202, first.text
    second = api.http.post("/api/v2/jobs", json=pai)
    assert second.status_code == 409, second.text
    assert second.json() == {
        "code": "ConflictJobError",
        "message": f"Job admin~{name} already exists.",
    }
    native = api.http.post("/v1/jobs", json=pai)
    assert native.status_code == 409 and "already used" in native.json()["detail"]
    bad = api.http.get(
        f"/apis/{GROUP}/{VERSION}/namespaces/ml/pytorchjobs", params={"labelSelector": "a in (b"}
    )
    assert bad.status_code == 400 and bad.json()["kind"] == "Status"
    strict = pytorchjob(unique("strict"), ["true"])
    strict["spec"]["surprise"] = 1
    refused = api.http.post(
        f"/apis/{GROUP}/{VERSION}/namespaces/ml/pytorchjobs",
        params={"fieldValidation": "Strict"},
        json=strict,
    )
    assert (
        refused.status_code == 400 and 'unknown field "spec.surprise"' in refused.json()["message"]
    )
    assert yard(platform, "kubeconfig", "--server", "http://insecure", check=False).returncode == 1


def test_a_job_larger_than_the_cluster_is_refused_at_once_in_each_dialect(api: Api) -> None:
    """The e2e cluster has 16 CPUs: 40 tasks of 4 CPUs can never start anywhere."""
    big = pytorchjob(unique("huge"), ["true"])
    master = big["spec"]["pytorchReplicaSpecs"]["Master"]
    master["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "4"}}
    big["spec"]["pytorchReplicaSpecs"]["Worker"] = {**master, "replicas": 39}
    refused = api.http.post(f"/apis/{GROUP}/{VERSION}/namespaces/ml/pytorchjobs", json=big)
    assert refused.status_code == 422, refused.text
    assert {c["reason"] for c in refused.json()["details"]["causes"]} == {"FieldValueInvalid"}
    assert "never" in refused.json()["message"]
    name = big["metadata"]["name"]
    assert (
        api.http.get(f"/apis/{GROUP}/{VERSION}/namespaces/ml/pytorchjobs/{name}").status_code == 404
    )
    pai = {
        "protocolVersion": 2, "name": unique("huge"), "type": "job",
        "prerequisites": [{"type": "dockerimage", "uri": "python:3.11", "name": "image"}],
        "taskRoles": {"worker": {"instances": 500, "dockerImage": "image",
                                 "resourcePerInstance": {"cpu": 4, "memoryMB": 8192, "gpu": 0},
                                 "commands": ["true"]}},
    }  # fmt: skip
    answer = api.http.post("/api/v2/jobs", json=pai)
    assert answer.status_code == 400 and answer.json()["code"] == "InvalidProtocolError"
    assert any(e["code"] == "never_fits" for e in answer.json()["errors"])
    native = api.http.post("/v1/jobs", json=pai)
    assert native.status_code == 202 and native.json()["state"] == "REJECTED"
    assert api.wait(native.json()["id"])["state"] == "REJECTED"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubeflow"


@pytest.mark.parametrize(
    ("example", "plural"),
    [
        ("mpijob-hello.yaml", "mpijobs"),
        # (XGBoostJob's Rabit tracker needs xgboost in the job's environment: the
        # framework test runs it, test_frameworks.py; its translation is unit-tested.)
        ("paddlejob-collective.yaml", "paddlejobs"),
        ("jaxjob-simple.yaml", "jaxjobs"),
    ],
)
def test_every_training_operator_kind_runs_to_success_through_kubectl(
    kubeconfig: Path, api: Api, example: str, plural: str
) -> None:
    """Each kind's commands read the variables its operator sets (a missing one fails the
    task), and the job ends by the kind's own completion rule."""
    manifest = yaml.safe_load((EXAMPLES / example).read_text())
    name = unique(manifest["metadata"]["name"])
    manifest["metadata"]["name"] = name
    # Qualified by group, as kubectl users write it: T9k has an MPIJob kind too.
    plural = f"{plural}.{GROUP}"
    ok(kubectl(kubeconfig, "create", "-f", "-", stdin=yaml.safe_dump(manifest)))
    uid = ok(kubectl(kubeconfig, "get", plural, name, "-o", "jsonpath={.metadata.uid}"))
    view = api.wait(uid, timeout=120)
    if manifest["kind"] == "MPIJob":
        # The Launcher's mpirun over both workers; its success is not asserted here:
        # Open MPI 4.1's session directory races now and then on one machine
        # ("orte_session_dir failed"), which test_frameworks' mpirun test also meets.
        assert sorted((t["role"], t["index"]) for t in view["tasks"]) == [
            ("Launcher", 0),
            ("Worker", 0),
            ("Worker", 1),
        ], view
        # Each pod once, though MPIJob is served at two versions.
        pods = ok(kubectl(kubeconfig, "get", "pods", "-l",
                          f"training.kubeflow.org/job-name={name}", "-o", "name"))  # fmt: skip
        assert sorted(pods.split()) == [
            f"pod/{name}-launcher-0", f"pod/{name}-worker-0", f"pod/{name}-worker-1"
        ]  # fmt: skip
        ok(kubectl(kubeconfig, "delete", plural, name))
        return
    if view["state"] != "SUCCEEDED":
        logs = {
            f"{t['role']}-{t['index']}": api.http.get(
                f"/v1/jobs/{uid}/logs",
                params={"role": t["role"], "index": t["index"], "stream": "stderr"},
            ).text[-2000:]
            for t in view["tasks"]
        }
        raise AssertionError(f"{view['state']}: {view.get('reason')}; {logs}")
    got = yaml.safe_load(ok(kubectl(kubeconfig, "get", plural, name, "-o", "yaml")))
    succeeded = [c for c in got["status"]["conditions"] if c["type"] == "Succeeded"]
    assert succeeded and succeeded[0]["reason"] == f"{manifest['kind']}Succeeded"
    ok(kubectl(kubeconfig, "delete", plural, name))


def train_with_the_kubeflow_sdk() -> None:
    """Run in the job's task: what the Kubeflow SDK's train_func does, unchanged."""
    import os

    print("trained by", os.environ.get("TRAINYARD_ROLE"), "of", os.environ.get("WORLD_SIZE"))


@pytest.mark.skipif(
    not any(Path(d, "python").exists() for d in ("/usr/bin", "/usr/local/bin")),
    reason="no `python` on the nodes' PATH for the SDK's train_func "
    "(tools/setup-system.sh installs python-is-python3 as root)",
)
def test_kubeflow_training_sdk_creates_waits_reads_logs_and_deletes(
    kubeconfig: Path, api: Api
) -> None:
    from kubeflow.training import TrainingClient

    sdk = TrainingClient(config_file=str(kubeconfig), namespace="ml", job_kind="PyTorchJob")
    name = unique("sdk")
    sdk.create_job(name=name, train_func=train_with_the_kubeflow_sdk, num_workers=1)
    sdk.wait_for_job_conditions(name, expected_conditions={"Succeeded"}, timeout=120)
    assert sdk.is_job_succeeded(name)
    assert name in [job.metadata.name for job in sdk.list_jobs()]
    assert sdk.get_job_pod_names(name) == [f"{name}-master-0"]
    logs, _ = sdk.get_job_logs(name)
    assert "trained by Master of 1" in logs[f"{name}-master-0"], logs
    # kubectl sees the same pods and logs.
    pods = ok(kubectl(kubeconfig, "get", "pods", "-l",
                      f"training.kubeflow.org/job-name={name}", "-o", "name"))  # fmt: skip
    assert pods.split() == [f"pod/{name}-master-0"]
    assert "trained by Master" in ok(kubectl(kubeconfig, "logs", f"{name}-master-0"))
    uid = sdk.get_job(name).metadata.uid
    sdk.delete_job(name)
    assert api.wait(uid)["state"] in ("SUCCEEDED", "STOPPED")
    missing = kubectl(kubeconfig, "get", "pytorchjob", name)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_kubectl_on_a_t9k_kind(kubeconfig: Path, api: Api) -> None:
    name = unique("t9k")
    job = {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "GenericJob",
        "metadata": {"name": name},
        "spec": {
            "successRules": [{"master": [0]}],
            "replicaSpecs": [{
                "type": "master", "replicas": 1,
                "template": {"spec": {"containers": [
                    {"name": "c", "image": "python:3.11", "command": ["sleep", "60"]}]}},
            }],
        },
    }  # fmt: skip
    assert "created" in ok(kubectl(kubeconfig, "create", "-f", "-", stdin=yaml.safe_dump(job)))
    got = yaml.safe_load(ok(kubectl(kubeconfig, "get", "genericjob", name, "-o", "yaml")))
    uid = got["metadata"]["uid"]
    assert got["kind"] == "GenericJob" and got["metadata"]["generation"] == 1
    ok(kubectl(kubeconfig, "patch", "genericjob", name, "--type=merge", "-p",
               '{"spec":{"runMode":{"pause":{"enabled":true}}}}'))  # fmt: skip
    assert api.wait(uid, {"PAUSED"}, 30)["state"] == "PAUSED"
    ok(kubectl(kubeconfig, "delete", "genericjob", name))
    assert api.wait(uid)["state"] == "STOPPED"


ALL_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# One published example of every served kind (T9k's manuals, Kubeflow's operators).
KIND_EXAMPLES = {
    "beamjobs": "t9k/beamjob-1.yaml",
    "colossalaijobs": "t9k/colossalaijob-1.yaml",
    "deepspeedjobs": "t9k/deepspeedjob-1.yaml",
    "genericjobs": "t9k/genericjob-1.yaml",
    "mpijobs.batch.tensorstack.dev": "t9k/mpijob-1.yaml",
    "pytorchtrainingjobs": "t9k/pytorchtrainingjob-1.yaml",
    "tensorflowtrainingjobs": "t9k/tensorflowtrainingjob-1.yaml",
    "xgboosttrainingjobs": "t9k/xgboosttrainingjob-1.yaml",
    "jaxjobs": "kubeflow/jaxjob-simple.yaml",
    "mpijobs.v1.kubeflow.org": "kubeflow/mpijob-hello.yaml",
    "mpijobs.v2beta1.kubeflow.org": "kubeflow/mpijob-v2beta1-hello.yaml",
    "paddlejobs": "kubeflow/paddlejob-collective.yaml",
    "pytorchjobs": "kubeflow/pytorchjob-simple.yaml",
    "tfjobs": "kubeflow/tfjob-simple.yaml",
    "xgboostjobs": "kubeflow/xgboostjob-rabit.yaml",
}


def test_every_served_kind_has_an_example() -> None:
    from trainyard_common.dialects.k8s_api import SERVED

    served = {s.plural for s in SERVED.values()}
    assert {key.split(".")[0] for key in KIND_EXAMPLES} == served
    assert len(KIND_EXAMPLES) == len(SERVED)  # MPIJob at each of its two versions


@pytest.mark.parametrize("resource", sorted(KIND_EXAMPLES))
def test_kubectl_apply_get_label_and_delete_every_served_kind(
    kubeconfig: Path, api: Api, resource: str
) -> None:
    """Each kind's published example, held paused at submission (T9k runMode.pause,
    Kubeflow runPolicy.suspend) so nothing runs: apply, get -o yaml, label, patch, get
    -w, select, apply again unchanged, delete."""
    job = next(
        d for d in yaml.safe_load_all((ALL_EXAMPLES / KIND_EXAMPLES[resource]).read_text())
        if d and d.get("kind")
    )  # fmt: skip
    name = unique(resource.split(".")[0][:-1])
    job["metadata"] = {"name": name}
    # T9k's manual spells one kind "DeepspeedJob"; its CRD (and so kubectl) knows only
    # "DeepSpeedJob" (the REST API takes both).
    job["kind"] = {"DeepspeedJob": "DeepSpeedJob"}.get(job["kind"], job["kind"])
    paused = job["kind"] != "BeamJob"  # T9k's BeamJob has no pause mode: it runs
    if paused and job["apiVersion"].startswith("batch.tensorstack.dev"):
        job["spec"]["runMode"] = {"pause": {"enabled": True}}
    elif paused:
        job["spec"].setdefault("runPolicy", {})["suspend"] = True
    manifest = yaml.safe_dump(job)
    assert "created" in ok(kubectl(kubeconfig, "apply", "-f", "-", stdin=manifest))
    got = yaml.safe_load(ok(kubectl(kubeconfig, "get", resource, name, "-o", "yaml")))
    assert (got["kind"], got["metadata"]["name"]) == (job["kind"], name)
    assert got["metadata"]["generation"] == 1
    uid = got["metadata"]["uid"]
    if paused:
        assert api.wait(uid, {"PAUSED"}, 30)["state"] == "PAUSED"
    ok(kubectl(kubeconfig, "label", resource, name, "checked=yes"))
    ok(kubectl(kubeconfig, "patch", resource, name, "--type=merge", "-p",
               '{"metadata":{"annotations":{"reviewed":"yes"}}}'))  # fmt: skip
    # get -w: the object at once, then its changes until the watch's time is up.
    watched = kubectl(
        kubeconfig, "get", resource, name, "-w", "--request-timeout=2s",
        "-o", "jsonpath={.metadata.annotations.reviewed}{'\\n'}",
    )  # fmt: skip
    assert watched.stdout.split()[:1] == ["yes"], (watched.stdout, watched.stderr)
    selected = ok(kubectl(kubeconfig, "get", resource, "-l", "checked=yes", "-o", "name"))
    assert [line.rsplit("/", 1)[1] for line in selected.split()] == [name]
    assert "unchanged" in ok(kubectl(kubeconfig, "apply", "-f", "-", stdin=manifest))
    if resource.startswith("mpijobs.") and resource.endswith(".kubeflow.org"):
        # One resource at both versions: the other version shows the job too, at its own.
        other = "v1" if ".v2beta1." in resource else "v2beta1"
        shown = yaml.safe_load(
            ok(kubectl(kubeconfig, "get", f"mpijobs.{other}.kubeflow.org", name, "-o", "yaml"))
        )
        assert (shown["apiVersion"], shown["metadata"]["uid"]) == (f"kubeflow.org/{other}", uid)
    assert f'"{name}" deleted' in ok(kubectl(kubeconfig, "delete", resource, name))
    ended = api.wait(uid)["state"]
    assert ended == "STOPPED" if paused else ended in ("STOPPED", "SUCCEEDED", "FAILED")
    missing = kubectl(kubeconfig, "get", resource, name)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
