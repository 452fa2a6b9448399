"""bench/pod_cost.py against the test cluster: each kind of pod is what it says (the
launcher's own manifest for the bench's job), every one completes, and the API server
stores the shell command's pod smaller than the same job's with every variable an env
entry. No timing is asserted: speed goals live in bench/, not in tests."""

from __future__ import annotations

from trainyard_stack.kube import KubeCluster

from ..support.bench import load_bench


def test_each_kind_runs_to_completion_and_the_exports_shrink_the_stored_pod(
    kube_cluster: KubeCluster,
) -> None:
    bench = load_bench("pod_cost")
    node = kube_cluster.nodes[0].name
    shell, argv = bench.task_pod("shell", node), bench.task_pod("argv", node)
    shell_env = {e["name"] for e in shell["spec"]["containers"][0]["env"]}
    argv_env = {e["name"] for e in argv["spec"]["containers"][0]["env"]}
    assert not any(name.startswith("PAI_") for name in shell_env)
    assert shell["spec"]["containers"][0]["command"][2].startswith("export PAI_JOB_NAME=")
    assert {"PAI_JOB_NAME", "PAI_HOST_IP_t_0"} <= argv_env and shell_env < argv_env

    runs = {kind: bench.run_kind(kube_cluster, kind, 4) for kind in ("bare", "shell", "argv")}
    assert runs["bare"]["stored_bytes"] < runs["shell"]["stored_bytes"]
    assert runs["shell"]["stored_bytes"] + 2000 < runs["argv"]["stored_bytes"]
    for run in runs.values():
        assert run["pods_per_s"] > 0
        assert {"kube-apiserver", "etcd", "kwok"} <= set(run["cpu_ms_per_pod"])
