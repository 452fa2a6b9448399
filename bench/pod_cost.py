"""What a task's pod costs the Kubernetes control plane, by what the pod holds.

On the project's Kubernetes with four KWOK nodes, creates N pods (one client, until every
one has completed) of each kind in turn, and measures the pods per second and every
control-plane process's CPU per pod (API server, etcd, KWOK, controller manager,
scheduler) over each kind:

- ``bare``: a pod with nothing but a container (the baseline, as bench/pipeline.py's
  floor makes it);
- ``shell``: the pod the launcher makes for bench/pipeline.py's one-task OpenPAI job
  (``domain.pods.pod_manifest``): OpenPAI's variables exported by the command line;
- ``argv``: the same job's pod with its command as a container argv, where every
  variable is an env entry (as every shell command's pod was before 2026-11-28).

    .venv/bin/python bench/pod_cost.py [--pods 600] [--kinds bare,shell,argv,bare,shell,argv]

Prints one JSON object: per kind (in the order run), pods/s, the stored pod's size and
the CPU per pod.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from trainyard_common.cluster import NodeSpec
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, Resources, RoleSpec
from trainyard_launcher.domain.env import build_task_env
from trainyard_launcher.domain.pods import PodSettings, pod_manifest
from trainyard_stack.kube import RUN_DURATION, KubeCluster

JOB = uuid.UUID(int=1).hex


def task_pod(kind: str, node: str) -> dict[str, Any]:
    """bench/pipeline.py's job (one role ``t``, 1 CPU, 100 MB, ``true``) as a pod."""
    argv = {"entrypoint": ["/bin/sh", "-c", "true"]} if kind == "argv" else {}
    role = RoleSpec(name="t", command="true", resources=Resources(cpu=1, memory_mb=100), **argv)
    spec = JobSpec(name="bench-1-abcdef", image="x", user="alice", roles=[role])
    placement = TaskPlacement(role="t", index=0, node=node, host_ip=node)
    pod = pod_manifest(
        spec=spec, job_id=JOB, attempt=1, placement=placement,
        env=build_task_env(spec, [placement], "t", 0, 1, JOB),
        command="true", namespace="", owner_uid=None,
        settings=PodSettings(annotations=((RUN_DURATION, "100ms"),)),
    )  # fmt: skip
    del pod["metadata"]["namespace"]
    return pod


def bare_pod(node: str) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {RUN_DURATION: "100ms"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "x", "command": ["true"]}],
        },
    }


def cpu_seconds(kube: KubeCluster) -> dict[str, float]:
    tick = os.sysconf("SC_CLK_TCK")
    spent = {}
    for each in kube._procs:
        fields = Path(f"/proc/{each.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        spent[each.name] = (int(fields[11]) + int(fields[12])) / tick
    return spent


def run_kind(kube: KubeCluster, kind: str, pods: int) -> dict[str, Any]:
    namespace = f"{kind}-{uuid.uuid4().hex[:6]}"
    with kube.client(timeout=60) as http:
        http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).raise_for_status()
        bodies = []
        for i in range(pods):
            node = kube.nodes[i % len(kube.nodes)].name
            body = bare_pod(node) if kind == "bare" else task_pod(kind, node)
            body["metadata"]["name"] = f"p{i}"
            bodies.append(body)
        before = cpu_seconds(kube)
        start = time.perf_counter()
        for body in bodies:
            http.post(f"/api/v1/namespaces/{namespace}/pods", json=body).raise_for_status()
        while True:
            items = http.get(f"/api/v1/namespaces/{namespace}/pods").json()["items"]
            if sum(p["status"].get("phase") == "Succeeded" for p in items) >= pods:
                break
            time.sleep(0.2)
        elapsed = time.perf_counter() - start
        after = cpu_seconds(kube)
        stored = http.get(f"/api/v1/namespaces/{namespace}/pods/p0").content
        http.delete(f"/api/v1/namespaces/{namespace}")
        # Gone before the next kind: its pods' deletion would count there.
        while http.get(f"/api/v1/namespaces/{namespace}").status_code != 404:
            time.sleep(0.2)
    per_pod = {name: round((after[name] - before[name]) * 1000 / pods, 2) for name in after}
    return {
        "kind": kind,
        "pods_per_s": round(pods / elapsed, 1),
        "stored_bytes": len(stored),
        "cpu_ms_per_pod": per_pod,
        "control_plane_ms_per_pod": round(sum(per_pod.values()), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--kinds", default="bare,shell,argv,bare,shell,argv")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o711)
        nodes = [NodeSpec(name=f"kwok-{i}", cpu=64, memory_mb=262144) for i in range(4)]
        kube = KubeCluster(Path(tmp) / "kube", nodes=nodes).start()
        try:
            runs = [run_kind(kube, kind, args.pods) for kind in args.kinds.split(",")]
        finally:
            kube.stop()
    print(json.dumps({"pods": args.pods, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
