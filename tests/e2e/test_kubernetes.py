"""The platform on a real Kubernetes control plane (the project's build, KWOK nodes):
every dialect's job runs as pods to SUCCEEDED; the pods carry the node placement chose,
the limits, the environment and the DNS names (read back); a failing task retries as a
new attempt with new pods; pause deletes the pods and resume makes them again; stop
leaves no pod and no Service; a lone task gets no Service and no owner, and its end
deletes none; a SIGKILLed launcher adopts its pods (one per task); a node deleted
mid-run fails its tasks as lost with their node; a command line's secret is in a Secret,
not in the pod; a namespace kept to a user is theirs alone."""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_stack.kube import EXIT_CODE, RUN_DURATION, KubeCluster
from trainyard_stack.platform import Platform

from .conftest import Api, start_platform

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORT = "1500ms"  # how long a task "runs" on KWOK unless its template says otherwise
KEPT, KEPT_TO = "team-kept", "kept-user"  # a namespace kept to one user


@pytest.fixture(scope="module")
def kube_platform(
    kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    platform = start_platform(
        tmp_path_factory.mktemp("kube-platform"),
        # Only the queues come from the file: the nodes are the cluster's own.
        {"nodes": [], "queues": ["default"]},
        extra_env={
            "YARD_LAUNCHER": "kubernetes",
            "KUBECONFIG": str(kube_cluster.kubeconfig),
            "YARD_K8S_NAMESPACE": "trainyard",
            "YARD_K8S_NAMESPACES": "*",
            "YARD_K8S_NAMESPACE_USERS": json.dumps({KEPT: [KEPT_TO]}),
            "YARD_K8S_POD_ANNOTATIONS": json.dumps({RUN_DURATION: SHORT}),
            "YARD_START_DEADLINE_S": "120",
        },
    )
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def api(kube_platform: Platform) -> Api:
    return Api(kube_platform.url, kube_platform.token)


def pods(kube: KubeCluster, job_id: str, namespace: str | None = None) -> list[dict]:
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    with kube.client() as http:
        items = http.get(path, params={"labelSelector": "app.kubernetes.io/managed-by=trainyard"})
    return [
        p for p in items.json()["items"]
        if (p["metadata"].get("annotations") or {}).get("trainyard.dev/job") == job_id
    ]  # fmt: skip


def services(kube: KubeCluster, job_id: str) -> list[dict]:
    with kube.client() as http:
        items = http.get("/api/v1/services").json()["items"]
    return [s for s in items if s["metadata"]["name"] == f"ty-{job_id}"]


def wait_for(check: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached within {timeout}s"
        time.sleep(0.3)


def view(api: Api, job_id: str) -> dict | None:
    answer = api.http.get(f"/v1/jobs/{job_id}")
    return answer.json() if answer.status_code == 200 else None


def running(api: Api, job_id: str, attempt: int = 1) -> dict:
    return wait_for(
        lambda: (v := view(api, job_id)) and v["state"] == "RUNNING" and v["attempt"] == attempt
        and all(t["state"] == "RUNNING" for t in v["tasks"] if t["attempt"] == attempt) and v,
        what=f"{job_id} running in attempt {attempt}",
    )  # fmt: skip


def load(relative: str) -> Any:
    if relative == "dlc":
        # PAI-DLC's CreateJob as the seed shows it (examples/dlc), without the data and
        # code source ids that only its own registry holds.
        return {
            "DisplayName": "tf-mnist-test",
            "JobType": "TFJob",
            "JobSpecs": [
                {
                    "Type": "Worker",
                    "Image": "registry.cn-hangzhou.aliyuncs.com/pai-dlc/tensorflow-training:1.12PAI-gpu-py36-cu101-ubuntu18.04",
                    "PodCount": 2,
                    "EcsSpec": "ecs.c6.large",
                }
            ],
            "UserCommand": "python /root/code/mnist.py",
            "ThirdpartyLibs": ["numpy==1.16.1"],
            "JobMaxRunningTimeMinutes": 1024,
        }
    text = (EXAMPLES / relative).read_text()
    return json.loads(text) if relative.endswith(".json") else yaml.safe_load(text)


def renamed(payload: dict, key: str) -> dict:
    """The example under a name of its own (names are unique per user)."""
    payload = copy.deepcopy(payload)
    suffix = uuid.uuid4().hex[:6]
    if key == "metadata":
        payload["metadata"]["name"] = f"{payload['metadata']['name']}-{suffix}"
    else:
        payload[key] = (
            f"{payload[key]}_{suffix}" if key == "jobName" else f"{payload[key]}-{suffix}"
        )
    return payload


EXAMPLE_JOBS = [
    ("openpai v1", "openpai/helloworld_16be675e.json", "jobName"),
    ("openpai v2", "openpai/v2/hello-world-job.yaml", "name"),
    ("kubeflow pytorchjob", "kubeflow/pytorchjob-simple.yaml", "metadata"),
    ("kubeflow tfjob", "kubeflow/tfjob-simple.yaml", "metadata"),
    ("t9k pytorchtrainingjob", "t9k/pytorchtrainingjob-1.yaml", "metadata"),
    ("t9k genericjob", "t9k/genericjob-1.yaml", "metadata"),
    ("ti", "ti/test73.json", "name"),
    ("pai-dlc", "dlc", "DisplayName"),
]


@pytest.mark.parametrize(
    ("what", "relative", "key"), EXAMPLE_JOBS, ids=[e[0] for e in EXAMPLE_JOBS]
)
def test_every_dialects_example_runs_as_pods(
    api: Api, kube_cluster: KubeCluster, what: str, relative: str, key: str
) -> None:
    payload = renamed(load(relative), key)
    if relative.startswith("ti/"):
        payload["cluster"] = "default"
    job_id = api.submit(payload)
    done = api.wait(job_id, timeout=120)
    assert done["state"] == "SUCCEEDED", (what, done)
    # A succeeded task's pod stays (with its log); a task stopped because the job ended
    # (a Kubeflow worker once its master succeeded) has its pod deleted.
    made = pods(kube_cluster, job_id)
    tasks = [t for t in done["tasks"] if t["attempt"] == done["attempt"]]
    assert len(made) == sum(1 for t in tasks if t["state"] == "SUCCEEDED") > 0
    assert all(p["status"]["phase"] == "Succeeded" for p in made)


def test_a_pod_is_what_placement_and_the_dialect_said(api: Api, kube_cluster: KubeCluster) -> None:
    payload = renamed(load("kubeflow/pytorchjob-simple.yaml"), "metadata")
    payload["metadata"]["namespace"] = "team-ml"
    for spec in payload["spec"]["pytorchReplicaSpecs"].values():
        template = spec["template"]
        template.setdefault("metadata", {})["annotations"] = {RUN_DURATION: "60s"}
        container = template["spec"]["containers"][0]
        container["resources"] = {"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "4Gi"}}
        container["args"] = ["--master=$(MASTER_ADDR)"]
    job_id = api.submit(payload)
    job = running(api, job_id)
    made = {
        p["metadata"]["labels"]["trainyard.dev/role"]: p
        for p in pods(kube_cluster, job_id, "team-ml")
    }
    assert set(made) == {"Master", "Worker"}
    master, worker = made["Master"], made["Worker"]
    tasks = {(t["role"], t["index"]): t for t in job["tasks"]}
    assert master["spec"]["nodeName"] == tasks[("Master", 0)]["node"]
    assert worker["spec"]["nodeName"] == tasks[("Worker", 0)]["node"]
    container = worker["spec"]["containers"][0]
    limits = container["resources"]["limits"]
    # The API server writes quantities its canonical way (4096Mi is 4Gi).
    assert (limits["nvidia.com/gpu"], limits["cpu"], limits["memory"]) == ("1", "2", "4Gi")
    assert container["command"] == ["python3", "/opt/mnist/src/mnist.py", "--epochs=1"]
    assert container["args"] == ["--master=$(MASTER_ADDR)"]  # the kubelet expands it
    # The example's pull policy (the API server's default for a tagged image would be
    # IfNotPresent).
    assert container["imagePullPolicy"] == "Always"
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    service = f"ty-{job_id}"
    assert env["MASTER_ADDR"] == f"{master['metadata']['name']}.{service}.team-ml.svc"
    assert (env["WORLD_SIZE"], env["RANK"], env["TRAINYARD_JOB_ID"]) == ("2", "1", job_id)
    assert env["PAI_HOST_IP_Master_0"] == env["MASTER_ADDR"]
    assert worker["spec"]["subdomain"] == service and worker["spec"]["hostname"]
    labels = worker["metadata"]["labels"]
    assert (labels["trainyard.dev/attempt"], labels["trainyard.dev/index"]) == ("1", "0")
    assert worker["metadata"]["ownerReferences"][0]["kind"] == "ConfigMap"
    assert worker["metadata"]["annotations"][RUN_DURATION] == "60s"
    assert services(kube_cluster, job_id)[0]["spec"]["clusterIP"] == "None"
    api.stop(job_id)
    assert api.wait(job_id)["state"] == "STOPPED"
    # Stopped: no pod and no Service left.
    wait_for(lambda: not pods(kube_cluster, job_id) and not services(kube_cluster, job_id),
             what="the job's pods and Service gone")  # fmt: skip


def test_a_lone_task_gets_no_service_nor_owner_and_meets_itself_at_its_hostname(
    api: Api, kube_cluster: KubeCluster
) -> None:
    payload = renamed(load("kubeflow/pytorchjob-simple.yaml"), "metadata")
    del payload["spec"]["pytorchReplicaSpecs"]["Worker"]
    template = payload["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    template.setdefault("metadata", {})["annotations"] = {RUN_DURATION: "60s"}
    job_id = api.submit(payload)
    running(api, job_id)
    [master] = pods(kube_cluster, job_id)
    env = {e["name"]: e.get("value", "") for e in master["spec"]["containers"][0]["env"]}
    # Its own hostname, which the kubelet writes into the pod's /etc/hosts.
    assert env["MASTER_ADDR"] == master["spec"]["hostname"] == master["metadata"]["name"]
    assert env["WORLD_SIZE"] == "1"
    assert services(kube_cluster, job_id) == []
    # Nor an owner: the pod is the whole attempt, and stop deletes it itself.
    assert "ownerReferences" not in master["metadata"]
    namespace = master["metadata"]["namespace"]
    with kube_cluster.client() as http:
        owner = http.get(f"/api/v1/namespaces/{namespace}/configmaps/ty-{job_id}-a1")
    assert owner.status_code == 404
    api.stop(job_id)
    assert api.wait(job_id)["state"] == "STOPPED"
    wait_for(lambda: not pods(kube_cluster, job_id), what="the job's pod gone")


def test_a_command_lines_secret_is_in_a_secret_not_in_the_pod(
    api: Api, kube_cluster: KubeCluster
) -> None:
    # Whoever may `get pods` in the namespace read a substituted secret in the pod's
    # command line: the line is in a Secret now, gone with the attempt.
    token = f"tok-{uuid.uuid4().hex}"
    job_id = api.submit({
        "name": f"secretive-{uuid.uuid4().hex[:6]}",
        "image": "busybox",
        "secrets": [{"name": "token", "value": token}],
        "roles": [{
            "name": "w",
            "command": 'wget --header "Authorization: <% $secrets.token %>" http://x/',
            "annotations": [{"name": RUN_DURATION, "value": "60s"}],
        }],
    })  # fmt: skip
    running(api, job_id)
    [pod] = pods(kube_cluster, job_id)
    assert token not in json.dumps(pod)
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/secrets/{meta['name']}-command"
    with kube_cluster.client() as http:
        stored = http.get(path)
    assert stored.status_code == 200, stored.text
    line = base64.b64decode(stored.json()["data"]["command"]).decode()
    assert f'wget --header "Authorization: {token}" http://x/' in line
    assert line.startswith("export PAI_") and "$$" not in line  # a file: nothing to escape
    # Made before the pod, the pod's once it is made.
    [owner] = stored.json()["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", meta["name"], meta["uid"])
    api.stop(job_id)
    assert api.wait(job_id)["state"] == "STOPPED"

    def gone() -> bool:
        with kube_cluster.client() as http:
            return http.get(path).status_code == 404

    # The garbage collector deletes it with its pod.
    wait_for(gone, what="the command's Secret gone with its pod")


def test_a_namespace_kept_to_a_user_is_theirs_alone(api: Api, kube_cluster: KubeCluster) -> None:
    # Any user could name any allowed namespace and mount any claim there. A namespace
    # the operator keeps to some users is theirs: others' jobs naming it fail at their
    # start, saying why; its users' jobs that name none run there.
    intruder = renamed(load("kubeflow/pytorchjob-simple.yaml"), "metadata")
    intruder["metadata"]["namespace"] = KEPT
    intruding = api.submit(intruder)
    refused = api.wait(intruding, timeout=120)
    assert refused["state"] == "FAILED", refused
    assert f"namespace: '{KEPT}' is kept to other users than 'admin'" in refused["reason"]
    assert pods(kube_cluster, intruding) == []
    token = api.http.post("/v1/tokens", json={"user": KEPT_TO}).json()["token"]
    owner = api.as_token(token)
    job_id = owner.submit({
        "name": f"kept-{uuid.uuid4().hex[:6]}", "image": "busybox",
        "roles": [{"name": "w", "command": "true"}],
        "data_sources": [{"source": "pvc://team-data/out", "mount_path": "/out"}],
    })  # fmt: skip
    assert owner.wait(job_id, timeout=120)["state"] == "SUCCEEDED"
    [pod] = pods(kube_cluster, job_id)
    assert pod["metadata"]["namespace"] == KEPT
    # The team's claims are theirs to write (outputs, checkpoints) in their namespace.
    [mount] = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/out"]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert not mount.get("readOnly") and not volume["persistentVolumeClaim"].get("readOnly")


def test_a_job_rejected_after_its_answer_gives_its_name_back(api: Api) -> None:
    """On Kubernetes the cluster's checks come after the 202 (intake does not know the
    nodes): a job rejected then frees its name for the mended one, as a platform that
    refuses it at submission never took it."""
    job = {
        "name": f"mended-{uuid.uuid4().hex[:6]}", "image": "busybox", "queue": "no-such-queue",
        "roles": [{"name": "w", "command": "true"}],
    }  # fmt: skip
    rejected = api.wait(api.submit(job), timeout=60)
    assert rejected["state"] == "REJECTED", rejected

    def resubmitted() -> str | None:
        answer = api.http.post("/v1/jobs", json={**job, "queue": "default"})
        assert answer.status_code in (202, 409), answer.text
        return answer.json()["id"] if answer.status_code == 202 else None

    mended = wait_for(resubmitted, timeout=30, what="the rejected job's name given back")
    assert api.wait(mended, timeout=120)["state"] == "SUCCEEDED"


def deletes(kube: KubeCluster, resource: str) -> float:
    """DELETE requests for ``resource`` the API server has answered, any code (its own
    metrics: what the launcher asked of it, needless 404s included)."""
    with kube.client() as http:
        text = http.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{")
        and f'resource="{resource}"' in line and 'verb="DELETE"' in line
    )  # fmt: skip


def pytorchjob(*, lone: bool, run: str) -> dict:
    payload = renamed(load("kubeflow/pytorchjob-simple.yaml"), "metadata")
    if lone:
        del payload["spec"]["pytorchReplicaSpecs"]["Worker"]
    for role in payload["spec"]["pytorchReplicaSpecs"].values():
        role["template"].setdefault("metadata", {})["annotations"] = {RUN_DURATION: run}
    return payload


def test_a_lone_jobs_end_deletes_nothing_it_never_had(api: Api, kube_cluster: KubeCluster) -> None:
    before = deletes(kube_cluster, "services"), deletes(kube_cluster, "configmaps")
    finished = api.submit(pytorchjob(lone=True, run=SHORT))
    assert api.wait(finished)["state"] == "SUCCEEDED"
    stopped = api.submit(pytorchjob(lone=True, run="60s"))
    running(api, stopped)
    api.stop(stopped)
    assert api.wait(stopped)["state"] == "STOPPED"
    wait_for(lambda: not pods(kube_cluster, stopped), what="the lone job's pod gone")
    # A job with a Service and an owner has both deleted when stopped: the counts move.
    gang = api.submit(pytorchjob(lone=False, run="60s"))
    running(api, gang)
    api.stop(gang)
    assert api.wait(gang)["state"] == "STOPPED"
    wait_for(lambda: not services(kube_cluster, gang), what="the gang's Service gone")

    def counts() -> tuple[float, float]:
        return deletes(kube_cluster, "services"), deletes(kube_cluster, "configmaps")

    # The API server counts a request once it has answered it: wait for the gang's two.
    wait_for(lambda: all(a >= b + 1 for a, b in zip(counts(), before, strict=True)),
             what="the gang's deletes counted")  # fmt: skip
    # One of each, the gang's: a lone job's end asked for no Service and no owner (each
    # was a 404 before: +3 and +2 here).
    assert counts() == (before[0] + 1, before[1] + 1)


def test_a_pods_log_the_cluster_cannot_read_answers_empty(api: Api) -> None:
    # KWOK has no kubelet: the API server answers 500 for a pod's log (it cannot reach
    # the node). The log APIs answer what there is, nothing, never a 500.
    job_id = api.submit(pytorchjob(lone=True, run=SHORT))
    assert api.wait(job_id)["state"] == "SUCCEEDED"
    answer = api.http.get(f"/v1/jobs/{job_id}/logs")
    assert (answer.status_code, answer.text) == (200, ""), answer.text


def test_a_failing_task_retries_as_a_new_attempt_with_new_pods(
    api: Api, kube_cluster: KubeCluster
) -> None:
    spec = {
        "name": f"fails-once-{uuid.uuid4().hex[:6]}",
        "image": "busybox",
        "retry_limit": 1,
        "roles": [
            {
                "name": "w",
                "command": "exit 7",
                "restart_policy": "OnFailure",  # a user failure runs again
                "annotations": [{"name": EXIT_CODE, "value": "7"}],
            }
        ],
    }
    job_id = api.submit(spec)
    done = api.wait(job_id, timeout=120)
    # Both attempts fail (the annotation makes every pod exit 7): the retry was made.
    assert done["state"] == "FAILED" and done["attempt"] == 2, done
    attempts = sorted(
        int(p["metadata"]["labels"]["trainyard.dev/attempt"]) for p in pods(kube_cluster, job_id)
    )
    assert attempts == [1, 2]
    first = [t for t in done["tasks"] if t["attempt"] == 1][0]
    assert first["exit_code"] == 7 and first["failure_class"] == "user"


def test_pause_deletes_the_pods_and_resume_makes_them_again(
    api: Api, kube_cluster: KubeCluster
) -> None:
    spec = {
        "name": f"pausable-{uuid.uuid4().hex[:6]}",
        "image": "busybox",
        "roles": [{"name": "w", "replicas": 2, "command": "sleep 1000",
                   "annotations": [{"name": RUN_DURATION, "value": "300s"}]}],
    }  # fmt: skip
    job_id = api.submit(spec)
    running(api, job_id)
    assert len(pods(kube_cluster, job_id)) == 2
    assert api.http.post(f"/v1/jobs/{job_id}/pause").status_code == 202
    wait_for(lambda: (v := view(api, job_id)) and v["state"] == "PAUSED", what="paused")
    wait_for(lambda: not pods(kube_cluster, job_id), what="the paused job's pods deleted")
    assert api.http.post(f"/v1/jobs/{job_id}/resume").status_code == 202
    running(api, job_id, attempt=2)
    again = pods(kube_cluster, job_id)
    assert len(again) == 2 and {
        p["metadata"]["labels"]["trainyard.dev/attempt"] for p in again
    } == {"2"}
    api.stop(job_id)
    api.wait(job_id)


def test_a_namespace_deleted_between_jobs_is_made_again(
    api: Api, kube_cluster: KubeCluster
) -> None:
    # The launcher remembers the namespaces it has made (no read per job); one deleted
    # under it must not stop the next job there.
    namespace = f"gone-{uuid.uuid4().hex[:6]}"

    def job() -> str:
        return api.submit({
            "name": f"in-{namespace}-{uuid.uuid4().hex[:4]}", "namespace": namespace,
            "image": "busybox", "roles": [{"name": "w", "command": "true"}],
        })  # fmt: skip

    first = job()
    assert api.wait(first)["state"] == "SUCCEEDED"
    assert pods(kube_cluster, first, namespace)
    with kube_cluster.client() as http:
        assert http.delete(f"/api/v1/namespaces/{namespace}").status_code == 200

        def gone() -> bool:
            return http.get(f"/api/v1/namespaces/{namespace}").status_code == 404

        wait_for(gone, timeout=120, what=f"namespace {namespace} deleted")
    second = job()
    assert api.wait(second, timeout=120)["state"] == "SUCCEEDED"
    assert pods(kube_cluster, second, namespace)


def namespaced_pod_watches(kube: KubeCluster) -> float:
    """How many watches of pods in one namespace the API server holds open (its own
    gauge; the KWOK controller's watch is of every namespace)."""
    with kube.client() as http:
        text = http.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
        if line.startswith("apiserver_longrunning_requests{") and 'resource="pods"' in line
        and 'scope="namespace"' in line and 'verb="WATCH"' in line
    )  # fmt: skip


def test_one_watch_follows_the_pods_of_every_namespace(api: Api, kube_cluster: KubeCluster) -> None:
    # A watch per namespace a job ever used stayed open for the launcher's life: with
    # YARD_K8S_NAMESPACES=* as many connections as a cluster has teams.
    jobs = [
        api.submit({
            "name": f"ns-{n}-{uuid.uuid4().hex[:4]}", "namespace": f"watched-{n}-{uuid.uuid4().hex[:4]}",
            "image": "busybox", "roles": [{"name": "w", "command": "true"}],
        })
        for n in range(3)
    ]  # fmt: skip
    for job_id in jobs:
        assert api.wait(job_id)["state"] == "SUCCEEDED"  # its end read from the watch
        assert pods(kube_cluster, job_id)
    assert namespaced_pod_watches(kube_cluster) == 0


def test_a_claim_a_pod_template_mounts_is_in_its_pods(api: Api, kube_cluster: KubeCluster) -> None:
    # T9k's and Kubeflow's templates keep data and outputs on a claim; it was warned of
    # and never mounted.
    payload = renamed(load("kubeflow/pytorchjob-simple.yaml"), "metadata")
    worker = payload["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["volumes"] = [{"name": "out", "persistentVolumeClaim": {"claimName": "team-out"}}]
    worker["containers"][0]["volumeMounts"] = [
        {"name": "out", "mountPath": "/out", "subPath": "runs"}
    ]
    # The worker ends before the master, whose end ends the job: a worker still running
    # then is stopped, and its pod removed with what this test looks at.
    master = payload["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    master.setdefault("metadata", {})["annotations"] = {RUN_DURATION: "5s"}
    job_id = api.submit(payload)
    assert api.wait(job_id)["state"] == "SUCCEEDED"
    by_role = {p["metadata"]["labels"]["trainyard.dev/role"]: p
               for p in pods(kube_cluster, job_id)}  # fmt: skip
    claims = {
        role: [v["persistentVolumeClaim"]["claimName"] for v in p["spec"]["volumes"]
               if "persistentVolumeClaim" in v]
        for role, p in by_role.items()
    }  # fmt: skip
    assert claims == {"Master": [], "Worker": ["team-out"]}, claims
    [mount] = [m for m in by_role["Worker"]["spec"]["containers"][0]["volumeMounts"]
               if m["mountPath"] == "/out"]  # fmt: skip
    assert mount["subPath"] == "runs" and mount["readOnly"] is True


def test_a_debug_jobs_pods_run_the_keep_alive(api: Api, kube_cluster: KubeCluster) -> None:
    # T9k's debug mode ran the command on Kubernetes all the same.
    job_id = api.submit({
        "name": f"debug-{uuid.uuid4().hex[:6]}", "image": "busybox", "run_mode": "debug",
        "roles": [{"name": "w", "command": "echo never-run; exit 3"}],
    })  # fmt: skip
    [pod] = wait_for(lambda: pods(kube_cluster, job_id), what="the debug job's pod")
    [container] = pod["spec"]["containers"]
    assert "debug mode: the command is not run" in container["command"][-1]
    assert "never-run" not in json.dumps(pod)
    assert api.http.post(f"/v1/jobs/{job_id}/stop").status_code == 202
    assert api.wait(job_id)["state"] == "STOPPED"


def test_a_pod_larger_than_its_namespaces_quota_fails_at_once(
    api: Api, kube_cluster: KubeCluster
) -> None:
    # A quota used up for now is waited for (other pods end); a pod that alone asks more
    # than the quota's hard limit never fits, and was tried again until the start
    # deadline (a platform failure, retried as such) instead of failing as the job's.
    namespace = f"quota-{uuid.uuid4().hex[:6]}"
    with kube_cluster.client() as http:
        made = http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
        assert made.status_code == 201, made.text
        quota = {"metadata": {"name": "team"}, "spec": {"hard": {"requests.cpu": "500m"}}}
        made = http.post(f"/api/v1/namespaces/{namespace}/resourcequotas", json=quota)
        assert made.status_code == 201, made.text

        def counted() -> bool:  # the quota controller has filled in its status
            got = http.get(f"/api/v1/namespaces/{namespace}/resourcequotas/team").json()
            return "requests.cpu" in (got.get("status") or {}).get("hard", {})

        wait_for(counted, timeout=60, what="the quota's status")

    def job(cpu: float) -> str:
        return api.submit({
            "name": f"cpu-{uuid.uuid4().hex[:6]}", "namespace": namespace, "image": "busybox",
            "roles": [{"name": "w", "command": "true", "resources": {"cpu": cpu, "memory_mb": 128}}],
        })  # fmt: skip

    too_large = api.wait(job(1), timeout=60)
    assert too_large["state"] == "FAILED", (too_large.get("reason"), too_large.get("warnings"))
    assert "exceeded quota: team" in too_large["reason"], too_large["reason"]
    assert api.wait(job(0.25), timeout=120)["state"] == "SUCCEEDED"


def test_a_killed_launcher_adopts_its_pods(
    kube_platform: Platform, api: Api, kube_cluster: KubeCluster
) -> None:
    spec = {
        "name": f"adopted-{uuid.uuid4().hex[:6]}",
        "image": "busybox",
        "roles": [{"name": "w", "replicas": 3, "command": "train",
                   "annotations": [{"name": RUN_DURATION, "value": "12s"}]}],
    }  # fmt: skip
    # A job that ended before: its pods are kept (their logs), never taken for strays.
    ended_job = api.submit({
        "name": f"ended-{uuid.uuid4().hex[:6]}", "image": "busybox",
        "roles": [{"name": "w", "command": "true"}],
    })  # fmt: skip
    assert api.wait(ended_job, timeout=90)["state"] == "SUCCEEDED"
    kept = {p["metadata"]["uid"] for p in pods(kube_cluster, ended_job)}
    job_id = api.submit(spec)
    running(api, job_id)
    before = {p["metadata"]["uid"] for p in pods(kube_cluster, job_id)}
    # Each pod names the installation that made it (the platform's namespace here).
    labels = {p["metadata"]["labels"].get("trainyard.dev/installation")
              for p in pods(kube_cluster, job_id)}  # fmt: skip
    assert labels == {"trainyard"}, labels
    kube_platform.kill_service("launcher")
    time.sleep(1.0)
    kube_platform.restart_service("launcher")
    done = api.wait(job_id, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    after = pods(kube_cluster, job_id)
    # The same pods ran to the end: none made twice, none left behind.
    assert {p["metadata"]["uid"] for p in after} == before and len(after) == 3
    assert {p["metadata"]["uid"] for p in pods(kube_cluster, ended_job)} == kept and kept


def test_a_node_deleted_mid_run_fails_its_tasks_as_lost_with_it(
    api: Api, kube_cluster: KubeCluster
) -> None:
    spec = {
        "name": f"on-a-doomed-node-{uuid.uuid4().hex[:6]}",
        "image": "busybox",
        "roles": [{"name": "w", "command": "train",
                   "resources": {"gpu": 1, "gpu_type": "TITANX"},
                   "annotations": [{"name": RUN_DURATION, "value": "300s"}]}],
    }  # fmt: skip
    job_id = api.submit(spec)
    job = running(api, job_id)
    node = job["tasks"][0]["node"]
    assert node == "kwok-gpu-1"
    spec_of_node = next(n for n in kube_cluster.nodes if n.name == node)
    kube_cluster.delete_node(node)
    try:
        done = api.wait(job_id, timeout=60)
        task = done["tasks"][0]
        assert done["state"] == "FAILED" and task["failure_class"] == "platform", done
        assert f"node {node}" in task["reason"]
    finally:
        kube_cluster.add_node(spec_of_node)
