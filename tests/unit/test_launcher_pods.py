"""A task as a Pod (domain/pods.py): names, the manifest the Kubernetes backend sends,
and how a pod's status reads as the task's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from trainyard_common.events import PortAssignment, TaskPlacement
from trainyard_common.jobspec import (
    CodeSource,
    DataSource,
    EnvVar,
    JobSpec,
    Resources,
    RoleSpec,
)
from trainyard_launcher.domain.failure import EndKind
from trainyard_launcher.domain.pods import (
    COMMAND_DIR,
    COMMAND_KEY,
    DEBUG_KEEPALIVE,
    EXPORTS_MAX_BYTES,
    GPU_RESOURCE,
    PodProblem,
    PodSettings,
    cached_pod,
    command_secret,
    command_secret_name,
    escape_shell,
    exec_command,
    needs_owner,
    needs_service,
    never_within_quota,
    owner_name,
    pod_manifest,
    pod_name,
    pod_state,
    pod_task,
    port_name,
    service_manifest,
    service_name,
    task_address,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
JOB = "0123456789abcdef0123456789abcdef"


def manifest(
    role: RoleSpec,
    placement: TaskPlacement | None = None,
    *,
    settings: PodSettings | None = None,
    env: dict[str, str] | None = None,
    **kw: object,
) -> dict:
    spec = JobSpec(name="j", image="pytorch:2", roles=[role], **kw)  # type: ignore[arg-type]
    placement = placement or TaskPlacement(role=role.name, index=0, node="gpu-1", host_ip="x")
    return pod_manifest(
        spec=spec,
        job_id=JOB,
        attempt=2,
        placement=placement,
        env=env if env is not None else {"MASTER_ADDR": "m.svc", "CUDA_VISIBLE_DEVICES": "3,5"},
        command=role.command,
        namespace="team-a",
        owner_uid="uid-1",
        settings=settings
        or PodSettings(security_context={"runAsNonRoot": True, "runAsUser": 1000}),
    )


@pytest.mark.parametrize("role", ["worker", "Master", "PS", "a_very_long_role_name_indeed", "Ünï"])
def test_names_are_dns_labels_and_tell_roles_apart(role: str) -> None:
    name = pod_name(JOB, 3, role, 12)
    assert DNS_LABEL.match(name) and len(name) <= 63
    assert DNS_LABEL.match(service_name(JOB)) and DNS_LABEL.match(owner_name(JOB, 3))
    assert pod_name(JOB, 3, "master", 0) != pod_name(JOB, 3, "Master", 0)
    assert task_address(JOB, 1, role, 0, "ns") == f"{pod_name(JOB, 1, role, 0)}.ty-{JOB}.ns.svc"


def test_the_pod_is_bound_to_its_node_and_named_for_the_headless_service() -> None:
    pod = manifest(RoleSpec(name="Worker", command="python train.py"))
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-1" and spec["subdomain"] == service_name(JOB)
    assert spec["hostname"] == pod["metadata"]["name"] == pod_name(JOB, 2, "Worker", 0)
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000}
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "ConfigMap",
        owner_name(JOB, 2),
        "uid-1",
    )
    # Setting it needs update on the owner's finalizers where owner permissions are
    # enforced (OpenShift): every multi-task pod was a 403.
    assert "blockOwnerDeletion" not in owner
    task = pod_task(pod)
    assert task is not None and (task.job_id, task.attempt, task.role, task.index) == (
        JOB, 2, "Worker", 0
    )  # fmt: skip


def test_a_shell_command_runs_by_sh_with_its_dollars_kept_from_the_kubelet() -> None:
    pod = manifest(RoleSpec(name="w", command="echo $(hostname) ${HOME} $$"))
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["/bin/sh", "-c", "echo $$(hostname) $${HOME} $$$$"]
    assert "args" not in container and container["image"] == "pytorch:2"
    assert escape_shell("a$b") == "a$$b"


def test_a_container_argv_is_kept_as_kubernetes_means_it() -> None:
    args_only = manifest(RoleSpec(name="w", command="x", args=["--addr=$(MASTER_ADDR)"]))
    container = args_only["spec"]["containers"][0]
    assert "command" not in container  # the image's entrypoint runs
    assert container["args"] == ["--addr=$(MASTER_ADDR)"]  # the kubelet expands it
    both = manifest(RoleSpec(name="w", command="x", entrypoint=["python"], args=["t.py"]))
    assert both["spec"]["containers"][0]["command"] == ["python"]


def kubelet_expanded(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command word: ``$$`` is ``$``, ``$(NAME)`` the value
    of an env entry (left as written where there is none)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def task_environment(pod: dict) -> dict[str, str]:
    """The environment the pod's command runs with, as a real ``/bin/sh`` gives it."""
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    argv = [kubelet_expanded(word, env) for word in container["command"]]
    assert argv[:2] == ["/bin/sh", "-c"]
    out = subprocess.run(argv, env=env, capture_output=True, check=True).stdout
    seen = dict(item.split(b"=", 1) for item in out.split(b"\0") if item)
    return {k.decode(): v.decode() for k, v in seen.items() if k not in (b"PWD", b"SHLVL", b"_")}


ODD_VALUES = {
    "PAI_JOB_NAME": "it's a $HOME `job` $(PAI_USER_NAME)",
    "PAI_USER_NAME": "ünï\nline two",
    "PAI_DEFAULT_FS_URI": "",
    "PAI_HOST_IP_my-role_0": "10.0.0.2",  # a role name the shell cannot export
    "TRAINYARD_JOB_ID": JOB,
    "MASTER_ADDR": "m.svc",
}


def lone_pod(role: RoleSpec, env: dict[str, str]) -> dict:
    """The pod of a one-task job of ``role`` with ``env`` (its command the role's)."""
    return pod_manifest(
        spec=JobSpec(name="j", image="img", roles=[role]), job_id=JOB, attempt=1,
        placement=TaskPlacement(role=role.name, index=0, node="n", host_ip="x"),
        env=env, command=role.command, namespace="ns", owner_uid=None, settings=PodSettings(),
    )  # fmt: skip


# What a pod that asked for no GPU gets, over a CUDA image's own NVIDIA_VISIBLE_DEVICES.
NO_GPU = {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_a_shell_command_gets_openpais_variables_exported_before_it() -> None:
    # Some fifty env entries tripled a pod's cost to the API server (the module's
    # docstring): the shell exports them instead, and the task sees the same environment.
    pod = lone_pod(RoleSpec(name="w", command="env -0"), ODD_VALUES)
    entries = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert entries == {"PAI_HOST_IP_my-role_0", "TRAINYARD_JOB_ID", "MASTER_ADDR", *NO_GPU}
    # A name no shell can hold stays an env entry, as it was; /bin/sh does not hand
    # such a name on to its command, with this change or without it.
    assert task_environment(pod) == {
        **{k: v for k, v in ODD_VALUES.items() if "-" not in k},
        **NO_GPU,
    }


def test_a_command_run_in_the_pod_sees_what_the_tasks_command_saw() -> None:
    # yard exec: the exec subresource runs a command with the container's env only.
    pod = lone_pod(RoleSpec(name="w", command="true"), ODD_VALUES)
    container_env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    argv = exec_command(pod, ODD_VALUES, ["env", "-0"])
    out = subprocess.run(argv, env=container_env, capture_output=True, check=True).stdout
    seen = dict(item.decode().split("=", 1) for item in out.split(b"\0") if item)
    assert {k: v for k, v in seen.items() if k not in ("PWD", "SHLVL", "_")} == {
        **{k: v for k, v in ODD_VALUES.items() if "-" not in k},
        **NO_GPU,
    }
    argv_pod = {"spec": {"containers": [{"name": "task", "command": ["python3"], "env": []}]}}
    assert exec_command(argv_pod, ODD_VALUES, ["env"]) == ["env"]


SECRET = "s3cr3t-$HOME-`id`-$$"


def secret_objects(role: RoleSpec, env: dict[str, str], command: str) -> tuple[dict, dict]:
    """The pod and the command's Secret of a lone task whose command carries SECRET."""
    spec = JobSpec(name="j", image="img", roles=[role], secrets=[EnvVar(name="s", value=SECRET)])
    placement = TaskPlacement(role=role.name, index=0, node="n", host_ip="x")
    common: dict[str, Any] = {"spec": spec, "job_id": JOB, "attempt": 1, "placement": placement,
                              "env": env, "command": command, "namespace": "ns"}  # fmt: skip
    pod = pod_manifest(**common, owner_uid="uid-1", settings=PodSettings(), carries_secrets=True)
    return pod, command_secret(**common, owner_uid="uid-1")


def test_a_command_line_with_a_secret_is_in_a_secret_not_in_the_pod(tmp_path: Path) -> None:
    # Whoever may `get pods` in the namespace read the substituted secret in the pod's
    # command line. The line is now the one key of a Secret, which the pod's shell
    # runs in its own place; the task runs it with the environment it had.
    command = f"echo \"$$\" '{SECRET}' >&2; env -0"
    pod, secret = secret_objects(RoleSpec(name="w", command=command), ODD_VALUES, command)
    assert SECRET not in json.dumps(pod) and "s3cr3t" not in json.dumps(pod)
    container = pod["spec"]["containers"][0]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    name = command_secret_name(JOB, 1, "w", 0)
    [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"] == name
    assert {"name": volume["name"], "mountPath": COMMAND_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    # Owned as the pod is, by the attempt's owner: made before the pod, gone with it.
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner_name(JOB, 1), "uid": "uid-1"}
    assert secret["metadata"]["ownerReferences"] == [owner]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert secret["immutable"] is True and secret["metadata"]["namespace"] == "ns"
    # Mounted (here, a directory standing for the volume), the pod's shell runs the line
    # with OpenPAI's variables exported first, as the line in the pod did, and as the
    # container's own process (exec'd: the kubelet's SIGTERM reaches the command).
    mounted = tmp_path / "mount"
    mounted.mkdir()
    (mounted / COMMAND_KEY).write_text(secret["stringData"][COMMAND_KEY])
    env = {e["name"]: e["value"] for e in container["env"]}
    argv = [
        kubelet_expanded(w, env).replace(COMMAND_DIR, str(mounted)) for w in container["command"]
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=30)
    ran = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    assert ran.returncode == 0 and ran.stderr.decode() == f"{proc.pid} {SECRET}\n"
    seen = dict(item.decode().split("=", 1) for item in ran.stdout.split(b"\0") if item)
    assert {k: v for k, v in seen.items() if k not in ("PWD", "SHLVL", "_")} == {
        **{k: v for k, v in ODD_VALUES.items() if "-" not in k},
        **NO_GPU,
    }
    # A command run in the pod (yard exec) still gets the export line first.
    assert exec_command(pod, ODD_VALUES, ["env"])[:2] == ["/bin/sh", "-c"]


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
def test_the_secret_command_runs_in_the_process_the_plain_line_ran_in(
    tmp_path: Path, shell: str
) -> None:
    # bash runs a -c line's last command in its own place, so on a bash image the task's
    # command was the container's first process and got the kubelet's SIGTERM; sourcing
    # the line from a file (the first form) kept bash there instead, dropping it.
    command = "true; /bin/sh -c 'echo $PPID'"
    plain = lone_pod(RoleSpec(name="w", command=command), {})
    hidden, secret = secret_objects(RoleSpec(name="w", command=command), {}, command)
    (tmp_path / COMMAND_KEY).write_text(secret["stringData"][COMMAND_KEY])

    def parent_is_first(pod: dict) -> bool:
        words = pod["spec"]["containers"][0]["command"]
        argv = [kubelet_expanded(w, {}).replace(COMMAND_DIR, str(tmp_path)) for w in words]
        argv = [w.replace("/bin/sh -c", f"{shell} -c") for w in argv]
        proc = subprocess.Popen([shell, *argv[1:]], stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=30)
        return out.decode().strip() == str(proc.pid)

    assert parent_is_first(hidden) == parent_is_first(plain)


def run_hidden(pod: dict, mounted: Path) -> subprocess.CompletedProcess[bytes]:
    """The pod's command, its Secret's volume at ``mounted``."""
    words = pod["spec"]["containers"][0]["command"]
    argv = [kubelet_expanded(w, {}).replace(COMMAND_DIR, str(mounted)) for w in words]
    return subprocess.run(argv, env={"PATH": os.environ["PATH"]}, capture_output=True)


def test_a_secret_command_that_cannot_be_read_fails_and_a_long_one_still_runs(
    tmp_path: Path,
) -> None:
    command = "echo ran"
    pod, secret = secret_objects(RoleSpec(name="w", command=command), {}, command)
    # Not there to read (or no cat): the task fails, rather than run nothing and succeed.
    missing = run_hidden(pod, tmp_path / "absent")
    assert missing.returncode != 0 and missing.stdout == b""
    # Past what one argument may hold (128 KiB), the line is sourced: it still runs.
    long = f"echo ran; : {'x' * 200_000}"
    pod, secret = secret_objects(RoleSpec(name="w", command=long), {}, long)
    (tmp_path / COMMAND_KEY).write_text(secret["stringData"][COMMAND_KEY])
    ran = run_hidden(pod, tmp_path)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"ran\n", b"")


def test_a_command_line_with_a_nul_is_refused() -> None:
    with pytest.raises(PodProblem, match="NUL"):
        lone_pod(RoleSpec(name="w", command="echo a\x00b"), {})


def test_only_a_command_line_that_carries_a_secret_is_moved() -> None:
    plain = lone_pod(RoleSpec(name="w", command="python train.py"), {})
    assert plain["spec"]["containers"][0]["command"][2] == "python train.py"
    assert all("secret" not in v for v in plain["spec"]["volumes"])
    # A container argv is never substituted: it stays as written, whatever the secrets.
    role = RoleSpec(name="w", command="x", entrypoint=["python"], args=[SECRET])
    pod, _ = secret_objects(role, {}, "x")
    assert pod["spec"]["containers"][0]["args"] == [SECRET]
    assert all("secret" not in v for v in pod["spec"]["volumes"])


def test_past_the_argument_limit_openpais_variables_stay_env_entries() -> None:
    hosts = {f"PAI_HOST_IP_worker_{i}": f"10.1.{i // 250}.{i % 250}" for i in range(4000)}
    pod = lone_pod(RoleSpec(name="w", command="env -0"), hosts)
    line = pod["spec"]["containers"][0]["command"][2]
    assert EXPORTS_MAX_BYTES // 2 < len(line.encode()) <= EXPORTS_MAX_BYTES + len("env -0")
    assert 0 < len(pod["spec"]["containers"][0]["env"]) < len(hosts)
    assert task_environment(pod) == {**hosts, **NO_GPU}


def test_a_container_argv_keeps_every_variable_an_env_entry() -> None:
    role = RoleSpec(
        name="w", command="x", entrypoint=["python3", "train.py"], args=["--x=$(PAI_JOB_NAME)"]
    )
    pod = lone_pod(role, ODD_VALUES)
    container = pod["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in container["env"]} == {**ODD_VALUES, **NO_GPU}
    assert container["command"] == ["python3", "train.py"]


def test_resources_whole_gpus_shared_gpus_shm_and_ports() -> None:
    role = RoleSpec(
        name="w", command="x", resources=Resources(cpu=2.5, memory_mb=4096, gpu=2, shm_mb=512)
    )
    placement = TaskPlacement(
        role="w", index=0, node="gpu-1", host_ip="x", gpu_indices=[3, 5],
        ports=[PortAssignment(label="ssh", ports=[31000]), PortAssignment(label="http", ports=[31001, 31002])],
    )  # fmt: skip
    container = manifest(role, placement)["spec"]["containers"][0]
    want = {"cpu": "2500m", "memory": "4096Mi", GPU_RESOURCE: "2"}
    assert container["resources"] == {"requests": want, "limits": want}
    env = {e["name"]: e["value"] for e in container["env"]}
    # The device plugin's GPUs are 0..n-1 in the container: host indices would mislead.
    assert "CUDA_VISIBLE_DEVICES" not in env and env["MASTER_ADDR"] == "m.svc"
    volumes = {v["name"]: v for v in manifest(role, placement)["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Mi"}
    assert [p["containerPort"] for p in container["ports"]] == [31000, 31001, 31002]

    shared = RoleSpec(name="w", command="x", resources=Resources(gpu=0.5))
    placed = TaskPlacement(role="w", index=0, node="n", host_ip="x", gpu_indices=[1], gpu_milli=500)
    pod = manifest(shared, placed)
    container = pod["spec"]["containers"][0]
    assert GPU_RESOURCE not in container["resources"]["limits"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("1", "0")
    assert pod["metadata"]["annotations"]["trainyard.dev/gpu-share"] == "0.5"


def test_what_a_job_leaves_uncapped_is_requested_but_not_limited() -> None:
    role = RoleSpec(
        name="w", command="x",
        resources=Resources(cpu=2, memory_mb=2048, gpu=2, uncapped=["cpu", "memory"]),
    )  # fmt: skip
    placement = TaskPlacement(role="w", index=0, node="gpu-1", host_ip="x")
    resources = manifest(role, placement)["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "2000m", "memory": "2048Mi", GPU_RESOURCE: "2"}
    assert resources["limits"] == {GPU_RESOURCE: "2"}


def test_template_annotations_pass_through_to_the_pod() -> None:
    role = RoleSpec(
        name="w", command="x",
        annotations=[EnvVar(name="kwok.trainyard.dev/run-duration", value="2s")],
    )  # fmt: skip
    assert manifest(role)["metadata"]["annotations"]["kwok.trainyard.dev/run-duration"] == "2s"


def test_a_jobs_annotations_never_reach_kubernetes_nor_the_platforms_domains() -> None:
    # container.apparmor.security.beta.kubernetes.io/task: unconfined became the
    # container's appArmorProfile (red-team run); the operator's may set such keys.
    asked = {
        "container.apparmor.security.beta.kubernetes.io/task": "unconfined",
        "seccomp.security.alpha.kubernetes.io/pod": "unconfined",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
        "scheduling.k8s.io/group-name": "other",
        "k8s.v1.cni.cncf.io/networks": "host-net",
        "trainyard.dev/gpu-share": "1",
        "sidecar.istio.io/inject": "false",
        "kwok.trainyard.dev/run-duration": "2s",
        "plain": "yes",
        "io.kubernetes.cri-o.Devices": "/dev/mem",
        "io.katacontainers.config.hypervisor.kernel_params": "x",
    }
    role = RoleSpec(
        name="w", command="x", annotations=[EnvVar(name=k, value=v) for k, v in asked.items()]
    )
    operator = PodSettings(annotations=(("kubernetes.io/description", "the operator's"),))
    got = manifest(role, settings=operator)["metadata"]["annotations"]
    kept = {k: got[k] for k in asked if k in got}
    assert kept == {
        "sidecar.istio.io/inject": "false",
        "kwok.trainyard.dev/run-duration": "2s",
        "plain": "yes",
    }
    assert got["kubernetes.io/description"] == "the operator's"


def test_a_jobs_env_gives_no_gpu_the_pod_did_not_ask_for() -> None:
    role = RoleSpec(name="w", command="x")
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all", "MINE": "1"}
    got = {e["name"]: e["value"] for e in manifest(role, env=env)["spec"]["containers"][0]["env"]}
    assert got["MINE"] == "1" and "NVIDIA_DRIVER_CAPABILITIES" not in got
    # And an image's own NVIDIA_VISIBLE_DEVICES=all is overridden for a pod with none.
    assert got["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_the_image_pull_policy_is_the_containers() -> None:
    pulled = RoleSpec(name="w", command="x", image_pull_policy="Never")
    assert manifest(pulled)["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    # None: the cluster's default, so the field is not set at all.
    assert (
        "imagePullPolicy" not in manifest(RoleSpec(name="w", command="x"))["spec"]["containers"][0]
    )


def test_code_data_and_packages_become_init_containers_and_volumes() -> None:
    role = RoleSpec(name="w", command="python /code/t.py")
    pod = manifest(
        role,
        code_source=CodeSource(repo="https://git/x.git", branch="main", mount_path="/code"),
        data_sources=[DataSource(source="pvc://datasets/imagenet", mount_path="/data")],
        pip_packages=["einops"],
    )
    init = {c["name"]: c for c in pod["spec"]["initContainers"]}
    assert "git' 'clone'" in init["code-source"]["command"][2]
    assert init["pip-packages"]["command"][-1] == "einops"
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/data"]["subPath"] == "imagenet" and mounts["/data"]["readOnly"]
    [claim] = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["readOnly"]
    # In a namespace kept to the job's user, its claims are theirs to write; a node path
    # stays read-only.
    writable = pod_manifest(
        spec=JobSpec(name="j", image="i", roles=[role], data_sources=[
            DataSource(source="pvc://team/out", mount_path="/out"),
            DataSource(source="/mnt/ro", mount_path="/ro"),
        ]),
        job_id=JOB, attempt=1, placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"),
        env={}, command="x", namespace="team-a", owner_uid="u",
        settings=PodSettings(host_paths=("/mnt",)), writable_claims=True,
    )  # fmt: skip
    mounts = {m["mountPath"]: m for m in writable["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/out"]["readOnly"] is False and mounts["/ro"]["readOnly"] is True
    [claim] = [v for v in writable["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["readOnly"] is False
    with pytest.raises(PodProblem, match=r"data_sources\[0\].source.*path of the nodes"):
        manifest(role, data_sources=[DataSource(source="/mnt/x", mount_path="/d")])
    with pytest.raises(PodProblem, match=r"oss://b/k: .*nothing is fetched from elsewhere"):
        manifest(role, data_sources=[DataSource(source="oss://b/k", mount_path="/d")])


def test_a_requirements_directory_is_installed_from_what_the_task_mounts() -> None:
    # PAI-DLC's ThirdpartyLibDir ("/root/code/", in its code source): every node runs
    # pip install -r <dir>/requirements.txt before the command. Pods ignored it.
    role = RoleSpec(name="w", command="python /root/code/t.py")
    pod = manifest(
        role,
        code_source=CodeSource(repo="https://git/x.git", mount_path="/root/code"),
        data_sources=[DataSource(source="pvc://data", mount_path="/data")],
        pip_requirements_dir="/root/code/",
    )
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["code-source", "pip-packages"]  # cloned first
    pip = init[1]
    assert pip["command"][-2:] == ["-r", "/root/code/requirements.txt"]
    mounted = {m["mountPath"]: m["name"] for m in pip["volumeMounts"]}
    assert mounted == {"/opt/trainyard/packages": "packages", "/root/code": "code",
                       "/data": "data-0"}  # fmt: skip
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PYTHONPATH"] == "/opt/trainyard/packages"


def test_the_claims_a_roles_pod_template_mounts_are_in_its_pods() -> None:
    # T9k's examples keep their data and outputs on a claim their template mounts: it
    # was warned of and not mounted, so the outputs went nowhere.
    role = RoleSpec(name="w", command="x", volumes=[
        DataSource(source="pvc://mypvc", mount_path="/mypvc"),
        DataSource(source="pvc://mypvc/runs/1", mount_path="/out"),
    ])  # fmt: skip
    pod = manifest(role, data_sources=[DataSource(source="pvc://data", mount_path="/data")])
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/mypvc"]["name"]]["persistentVolumeClaim"] == {
        "claimName": "mypvc", "readOnly": True
    }  # fmt: skip
    assert "subPath" not in mounts["/mypvc"] and mounts["/out"]["subPath"] == "runs/1"
    assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"]["claimName"] == "data"
    claims = [mounts[p]["name"] for p in ("/mypvc", "/out", "/data")]
    assert len(set(claims)) == 3  # a volume each, none shared
    # Only the role whose template mounts it.
    other = RoleSpec(name="o", command="x")
    spec = JobSpec(name="j", image="i", roles=[role, other])
    alone = pod_manifest(
        spec=spec, job_id=JOB, attempt=1, placement=TaskPlacement(role="o", index=0, node="n",
        host_ip="x"), env={}, command="x", namespace="ns", owner_uid="u", settings=PodSettings(),
    )  # fmt: skip
    assert not any("persistentVolumeClaim" in v for v in alone["spec"]["volumes"])
    # In a namespace kept to the user a claim is theirs to write, unless the template
    # mounts it readOnly.
    kept = RoleSpec(name="w", command="x", volumes=[
        DataSource(source="pvc://a", mount_path="/a"),
        DataSource(source="pvc://b", mount_path="/b", read_only=True),
    ])  # fmt: skip
    writable = pod_manifest(
        spec=JobSpec(name="j", image="i", roles=[kept]), job_id=JOB, attempt=1,
        placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"), env={},
        command="x", namespace="team", owner_uid="u", settings=PodSettings(),
        writable_claims=True,
    )  # fmt: skip
    mounts = {m["mountPath"]: m for m in writable["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/a"]["readOnly"] is False and mounts["/b"]["readOnly"] is True


def test_a_debug_tasks_pod_runs_the_keep_alive_not_its_command() -> None:
    # T9k's debug mode on Kubernetes ran the command all the same: the backend did not
    # read the launch's debug option (the local one did).
    for role in (
        RoleSpec(name="w", command="python train.py --secret s3cret"),
        RoleSpec(name="w", command="", entrypoint=["python"], args=["train.py"]),
    ):
        pod = pod_manifest(
            spec=JobSpec(name="j", image="i", roles=[role]), job_id=JOB, attempt=1,
            placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"), env={},
            command=role.command, namespace="ns", owner_uid="u", settings=PodSettings(),
            carries_secrets=True, debug=True,
        )  # fmt: skip
        [container] = pod["spec"]["containers"]
        assert (
            container["command"] == ["/bin/sh", "-c", DEBUG_KEEPALIVE] and "args" not in container
        )
        assert "train.py" not in str(pod)  # nor its line in a Secret: nothing to hide


def test_a_pod_needs_an_image() -> None:
    spec = JobSpec(name="j", roles=[RoleSpec(name="w", command="x")])
    with pytest.raises(PodProblem, match="no image"):
        pod_manifest(
            spec=spec, job_id=JOB, attempt=1,
            placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"),
            env={}, command="x", namespace="ns", owner_uid="u", settings=PodSettings(),
        )  # fmt: skip


def test_only_an_attempt_of_several_tasks_gets_the_service() -> None:
    def spec(*roles: RoleSpec) -> JobSpec:
        return JobSpec(name="j", image="img", roles=list(roles))

    assert not needs_service(spec(RoleSpec(name="w", command="x")))
    assert needs_service(spec(RoleSpec(name="w", command="x", replicas=2)))
    assert needs_service(spec(RoleSpec(name="m", command="x"), RoleSpec(name="w", command="x")))
    # An elastic role that may grow, or a job placed without a gang that may start with
    # one task and get more in the same attempt: the spec, not the first placement.
    assert needs_service(spec(RoleSpec(name="w", command="x", min_replicas=1, max_replicas=3)))
    # The lone task is reached at its hostname, which is its pod's name.
    alone = task_address(JOB, 1, "master", 0, "ns", lone=True)
    assert alone == pod_name(JOB, 1, "master", 0)
    assert task_address(JOB, 1, "master", 0, "ns") == f"{alone}.ty-{JOB}.ns.svc"


def test_a_lone_task_without_a_hostfile_has_no_owner() -> None:
    alone = JobSpec(name="j", image="img", roles=[RoleSpec(name="w", command="x")])
    pair = JobSpec(name="j", image="img", roles=[RoleSpec(name="w", command="x", replicas=2)])
    assert not needs_owner(alone, None)
    assert needs_owner(alone, "host slots=1\n") and needs_owner(pair, None)
    # Its command's Secret is made before its pod: the owner holds both.
    secretive = alone.model_copy(update={"secrets": [EnvVar(name="t", value="v")]})
    assert needs_owner(secretive, None)
    pod = pod_manifest(
        spec=JobSpec(name="j", image="img", roles=[RoleSpec(name="w", command="x")]),
        job_id=JOB, attempt=1, placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"),
        env={}, command="x", namespace="ns", owner_uid=None, settings=PodSettings(),
    )  # fmt: skip
    assert "ownerReferences" not in pod["metadata"]

    svc = service_manifest(JOB, "team-a")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]


def pod(phase: str, **status: object) -> dict:
    return {"spec": {"nodeName": "n"}, "status": {"phase": phase, **status}}


def container(state: dict) -> dict:
    return {"containerStatuses": [{"name": "task", "image": "img:1", "state": state}]}


@pytest.mark.parametrize(
    ("body", "running", "started", "exit_code", "end_kind"),
    [
        (pod("Pending"), True, False, None, None),
        (pod("Pending", **container({"waiting": {"reason": "ContainerCreating"}})), True, False, None, None),
        (pod("Running", **container({"running": {}})), True, True, None, None),
        (pod("Succeeded", **container({"terminated": {"exitCode": 0, "reason": "Completed"}})), False, True, 0, None),
        (pod("Failed", **container({"terminated": {"exitCode": 3, "reason": "Error"}})), False, True, 3, None),
        (pod("Failed", **container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})), False, True, 137, EndKind.OUT_OF_MEMORY),
        (pod("Failed", reason="Evicted", message="low on memory"), False, False, None, EndKind.KILLED_BY_PLATFORM),
        # A pull that failed for now (a registry's blip, throttling): the kubelet tries
        # again; the start deadline fails it if it never comes.
        (pod("Pending", **container({"waiting": {"reason": "ImagePullBackOff", "message": "no"}})), True, False, None, None),
        (pod("Pending", **container({"waiting": {"reason": "ErrImagePull", "message": "429 Too Many Requests: toomanyrequests"}})), True, False, None, None),
        # An image that is not there is the user's, permanent: a retry would meet it again
        # (a Kubeflow job without backoffLimit retries without limit otherwise).
        (pod("Pending", **container({"waiting": {"reason": "ErrImagePull", "message": 'failed to pull and unpack image "docker.io/library/pytho:3.11": not found'}})), False, False, None, EndKind.PREPARE_USER),
        (pod("Pending", **container({"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied, repository does not exist or may require authorization"}})), False, False, None, EndKind.PREPARE_USER),
        (pod("Pending", **container({"waiting": {"reason": "InvalidImageName", "message": "x"}})), False, False, None, EndKind.PREPARE_USER),
        (pod("Pending", **container({"waiting": {"reason": "ErrImagePull", "message": "dial tcp: i/o timeout"}})), True, False, None, None),
        (pod("Pending", **container({"waiting": {"reason": "CreateContainerConfigError"}})), False, False, None, EndKind.START_FAILED),
        # A preparation that failed: the user's when what it said names a wrong input,
        # else unknown (a git host down), as on the local backend.
        (pod("Pending", initContainerStatuses=[{"name": "code-source", "state": {"terminated": {"exitCode": 128, "message": "fatal: Remote branch nope not found in upstream origin"}}}]), False, False, None, EndKind.PREPARE_USER),
        (pod("Pending", initContainerStatuses=[{"name": "code-source", "state": {"terminated": {"exitCode": 128, "message": "fatal: unable to access 'https://git.example/x/': Could not resolve host: git.example"}}}]), False, False, None, EndKind.PREPARE_UNKNOWN),
        (pod("Pending", initContainerStatuses=[{"name": "pip-packages", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]), False, False, None, EndKind.OUT_OF_MEMORY),
        # Refused by its node's kubelet: no container ran ("exited with code 1", the
        # user's, was said).
        (pod("Failed", reason="OutOfnvidia.com/gpu", message="Pod was rejected: Node didn't have enough resource"), False, False, None, EndKind.START_FAILED),
        (pod("Failed", reason="UnexpectedAdmissionError", message="Allocate failed"), False, False, None, EndKind.START_FAILED),
        # Ended by the cluster: preempted by the scheduler, evicted by a drain ("exit 143",
        # the user's or unknown, was said).
        (pod("Failed", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted"}], **container({"terminated": {"exitCode": 143, "reason": "Error"}})), False, False, None, EndKind.KILLED_BY_PLATFORM),
        (pod("Running", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}], **container({"terminated": {"exitCode": 137}})), False, False, None, EndKind.KILLED_BY_PLATFORM),
        # A task that ended well though its pod was about to be evicted ended well.
        (pod("Succeeded", conditions=[{"type": "DisruptionTarget", "status": "True"}], **container({"terminated": {"exitCode": 0}})), False, True, 0, None),
    ],
)  # fmt: skip
def test_a_pods_status_reads_as_the_tasks(
    body: dict, running: bool, started: bool, exit_code: int | None, end_kind: EndKind | None
) -> None:
    state = pod_state(body)
    assert (state.running, state.started, state.exit_code) == (running, started, exit_code)
    assert state.end_kind == (end_kind.value if end_kind else None)
    if not running and exit_code is None:
        assert state.reason
    assert pod_state(cached_pod(body)) == state  # the launcher's cache reads the same


def served(pod: dict, phase: str) -> dict:
    """``pod`` as the API server serves it: its defaults, managed fields and status."""
    body = json.loads(json.dumps(pod))
    meta = body["metadata"]
    meta.update(uid="u-1", resourceVersion="12345", creationTimestamp="2026-11-29T07:00:00Z")
    meta["annotations"]["operator.example/owner"] = "team-a"
    meta["managedFields"] = [
        {"manager": "trainyard", "operation": "Update", "fieldsType": "FieldsV1",
         "fieldsV1": {f"f:{k}": {} for k in json.dumps(pod["spec"])[:4000].split('"')[1::2]}},
    ]  # fmt: skip
    for c in body["spec"]["containers"] + body["spec"].get("initContainers", []):
        c.update(terminationMessagePath="/dev/termination-log", imagePullPolicy="IfNotPresent")
    body["spec"].update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler",
                        tolerations=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute",
                                      "operator": "Exists", "tolerationSeconds": 300}])  # fmt: skip
    state = {"terminated": {"exitCode": 3, "reason": "Error"}} if phase == "Failed" else {
        "running": {"startedAt": "2026-11-29T07:00:05Z"}}  # fmt: skip
    body["status"] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "x"}],
        "containerStatuses": [{"name": "task", "image": "pytorch:2", "state": state}],
    }
    return body


@pytest.mark.parametrize("phase", ["Running", "Failed"])
def test_the_cache_keeps_a_small_part_of_a_pod_that_reads_the_same(phase: str) -> None:
    # A finished job's pods stay (their logs) and the launcher's cache holds each one:
    # whole, with its environment, init containers and managed fields.
    role = RoleSpec(name="w", command="python /code/t.py")
    env = {f"PAI_VARIABLE_{i}": "v" * 40 for i in range(40)}
    body = served(
        manifest(role, env=env,
                 code_source=CodeSource(repo="https://git/x.git", mount_path="/code"),
                 pip_packages=["einops"]),
        phase,
    )  # fmt: skip
    kept = cached_pod(body)
    assert len(json.dumps(kept)) < len(json.dumps(body)) / 8
    assert pod_task(kept) == pod_task(body) is not None
    assert pod_state(kept) == pod_state(body)
    assert kept["metadata"]["uid"] == "u-1" and kept["spec"]["nodeName"] == "gpu-1"
    assert "operator.example/owner" not in kept["metadata"]["annotations"]
    for command in (["nvidia-smi"], ["sh", "-c", "echo $PAI_VARIABLE_1"]):
        if phase == "Running":  # an ended pod runs no command
            assert exec_command(kept, env, command) == exec_command(body, env, command)


@pytest.mark.parametrize("label", ["http", "8080", "a--b", "-x-", "Tensor_Board", "a" * 40, "_"])
def test_a_port_label_is_always_a_valid_port_name(label: str) -> None:
    # IANA_SVC_NAME: at most 15 of [a-z0-9-], alphanumeric at both ends, a letter, no
    # "--". A label "8080" or "a--b" made the API server refuse every pod (422).
    name = port_name(label)
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?", name), name
    assert "--" not in name and re.search("[a-z]", name), name
    assert port_name("http") == "http"  # a good one is kept as it is
    assert port_name("a--b") != port_name("a-b")  # two labels stay apart


def test_a_pull_that_failed_for_now_is_the_start_deadlines_progress_note() -> None:
    state = pod_state(
        pod("Pending", **container({"waiting": {"reason": "ErrImagePull", "message": "429 toomanyrequests"}}))
    )  # fmt: skip
    assert state.running and not state.started
    assert (
        state.step
        == "its image cannot be pulled yet (ErrImagePull, image img:1): 429 toomanyrequests"
    )


@pytest.mark.parametrize(
    ("message", "never"),
    [
        ("exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10", False),
        ("exceeded quota: q, requested: pods=1, used: pods=0, limited: pods=0", True),
        ("exceeded quota: q, requested: requests.memory=1Gi, used: requests.memory=0, limited: requests.memory=1000Mi", True),
        ("exceeded quota: q, requested: requests.memory=1G, used: requests.memory=0, limited: requests.memory=1Gi", False),
        ("exceeded quota: q, requested: requests.cpu=2,requests.memory=1Gi, used: requests.cpu=0,requests.memory=0, limited: requests.cpu=1500m,requests.memory=8Gi", True),
        ("exceeded quota: q", False),  # not the admission's own words: waited for
        ("exceeded quota: q, requested: x=??, used: x=0, limited: x=1", False),
        ("forbidden: User cannot create pods", False),
    ],
)  # fmt: skip
def test_a_pod_that_alone_asks_more_than_its_quota_never_fits(message: str, never: bool) -> None:
    assert never_within_quota(f'pods "p" is forbidden: {message}') is never


RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
SSHD_CAPS = {
    "allowPrivilegeEscalation": False,
    "capabilities": {
        "drop": ["ALL"],
        "add": ["NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT"],
    },
}


def test_every_container_of_a_pod_gets_the_operators_container_security_context() -> None:
    # Only the pod's securityContext was set: allowPrivilegeEscalation and capabilities
    # exist only on containers, so no pod could meet PodSecurity "restricted".
    role = RoleSpec(name="w", command="python train.py")
    settings = PodSettings(
        security_context={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        container_security_context=RESTRICTED,
        mpi_container_security_context=SSHD_CAPS,
    )
    kw: dict[str, Any] = {
        "code_source": CodeSource(repo="https://g/r.git", mount_path="/code"),
        "pip_packages": ["einops"],
    }
    pod = manifest(role, settings=settings, **kw)
    containers = pod["spec"]["containers"] + pod["spec"]["initContainers"]
    assert [c["name"] for c in containers] == ["task", "code-source", "pip-packages"]
    for container in containers:
        assert container["securityContext"] == RESTRICTED, container["name"]
    # Each its own copy: a change to one pod's is no other's, nor the settings'.
    containers[0]["securityContext"]["capabilities"]["drop"].append("x")
    assert RESTRICTED["capabilities"] == {"drop": ["ALL"]}
    assert containers[1]["securityContext"] == RESTRICTED
    # An MPI job's task container runs sshd (workers) or ssh (the launcher): the MPI
    # context where the operator set one; its init containers keep the general one.
    mpi = pod_manifest(
        spec=JobSpec(name="j", image="i", roles=[role], **kw), job_id=JOB, attempt=1,
        placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"), env={},
        command="x", namespace="ns", owner_uid="u", settings=settings, mpi=True,
    )  # fmt: skip
    assert mpi["spec"]["containers"][0]["securityContext"] == SSHD_CAPS
    assert all(c["securityContext"] == RESTRICTED for c in mpi["spec"]["initContainers"])
    general_only = PodSettings(container_security_context=RESTRICTED)
    mpi = pod_manifest(
        spec=JobSpec(name="j", image="i", roles=[role]), job_id=JOB, attempt=1,
        placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"), env={},
        command="x", namespace="ns", owner_uid="u", settings=general_only, mpi=True,
    )  # fmt: skip
    assert mpi["spec"]["containers"][0]["securityContext"] == RESTRICTED
    # {} for MPI: the cluster's defaults there, whatever the general one.
    cleared = PodSettings(container_security_context=RESTRICTED, mpi_container_security_context={})
    mpi = pod_manifest(
        spec=JobSpec(name="j", image="i", roles=[role]), job_id=JOB, attempt=1,
        placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"), env={},
        command="x", namespace="ns", owner_uid="u", settings=cleared, mpi=True,
    )  # fmt: skip
    assert "securityContext" not in mpi["spec"]["containers"][0]
    # None set (the platform's default): the cluster's, as before.
    plain = manifest(role, settings=PodSettings(), **kw)
    for container in plain["spec"]["containers"] + plain["spec"]["initContainers"]:
        assert "securityContext" not in container


def test_the_container_security_contexts_are_read_from_the_launchers_settings() -> None:
    from trainyard_launcher.adapters.kubernetes import KubeSettings

    settings = KubeSettings.from_env({
        "YARD_K8S_CONTAINER_SECURITY_CONTEXT": json.dumps(RESTRICTED),
        "YARD_K8S_MPI_CONTAINER_SECURITY_CONTEXT": json.dumps(SSHD_CAPS),
    })  # fmt: skip
    assert settings.pods.container_security_context == RESTRICTED
    assert settings.pods.mpi_container_security_context == SSHD_CAPS
    unset = KubeSettings.from_env({"YARD_K8S_CONTAINER_SECURITY_CONTEXT": ""})
    assert unset.pods.container_security_context is None
    assert unset.pods.mpi_container_security_context is None
    # Found in review: helm renders a value set to null (its way to drop a default) as
    # "null", which stopped the launcher; it is unset, as the pod's context takes it.
    dropped = KubeSettings.from_env({
        "YARD_K8S_CONTAINER_SECURITY_CONTEXT": "null",
        "YARD_K8S_MPI_CONTAINER_SECURITY_CONTEXT": "null",
    })  # fmt: skip
    assert dropped.pods.container_security_context is None
    assert dropped.pods.mpi_container_security_context is None
    # A context it cannot read is rights not taken away: the launcher does not start.
    for bad in ("{", "[]", '"ALL"'):
        with pytest.raises(ValueError, match="YARD_K8S_CONTAINER_SECURITY_CONTEXT"):
            KubeSettings.from_env({"YARD_K8S_CONTAINER_SECURITY_CONTEXT": bad})


def test_no_shared_memory_is_an_empty_read_only_dev_shm_as_on_the_local_backend() -> None:
    # A sizeLimit of 0 is no limit to the kubelet (the tmpfs gets the pod's memory, or
    # the node's where memory is uncapped); the local backend gave the machine's.
    def shm_mount(shm_mb: int) -> dict[str, Any]:
        role = RoleSpec(name="w", command="x", resources=Resources(shm_mb=shm_mb))
        mounts = manifest(role)["spec"]["containers"][0]["volumeMounts"]
        [mount] = [m for m in mounts if m["mountPath"] == "/dev/shm"]
        return mount

    assert shm_mount(0) == {"name": "dshm", "mountPath": "/dev/shm", "readOnly": True}
    assert shm_mount(64) == {"name": "dshm", "mountPath": "/dev/shm"}
