"""What a task is on Kubernetes, as plain data: names, labels, the Pod of a task, the
per-job headless Service, the per-attempt owner object, and how a Pod's status reads as
a task's (docs/kubernetes.md). No I/O: adapters/kubernetes.py sends and watches these.

Names. A job's objects are named from its id (an RFC 1123 label, at most 63
characters): the Service ``ty-<job id>`` (every job's pods resolve as
``<pod>.<service>.<namespace>.svc``), the attempt's owner ConfigMap
``ty-<job id>-a<attempt>`` (it holds the MPI hostfile, and every pod of the attempt
names it as owner, so deleting it deletes them), and each task's Pod
``ty-<job id>-a<attempt>-<role>-<index>``.

Commands. A container argv (``entrypoint``/``args``: Kubeflow, T9k) is the Pod's
``command``/``args`` as written: ``args`` alone keep the image's entrypoint, and the
kubelet expands ``$(VAR)``. A shell command line (OpenPAI, PAI-DLC, TI) runs as
``sh -c`` with every ``$`` doubled, so the kubelet's expansion leaves the shell's text
as the user wrote it. A command line with the job's secrets substituted in it
(OpenPAI's ``<% $secrets.x %>``) is not in the Pod, which whoever may ``get pods`` in
its namespace reads: the line is the one key of an immutable Secret (``command_secret``)
made before the Pod, owned by the attempt's owner until then (a job with secrets always
has one) and by the Pod after, mounted at ``/var/run/trainyard``; the Pod's shell runs
it with ``exec``, so the command is the container's first process, as it was on the
command line (``hides_command``, ``_run_hidden``).

Environment. A shell command line's task gets OpenPAI's variables (``PAI_*``) exported by
its shell before the command (``shell_exports``), as OpenPAI's own runtime exports the
half of them it computes; the rest (``TRAINYARD_*``, the framework's, the job's own, the
GPUs') is the container's env, as is everything for a container argv. Some fifty
variables as env entries made a pod 10.5 kB as stored and tripled what it cost the API
server and KWOK (each entry is a node of every managed-fields comparison and of every
encoding): 28 ms of control-plane CPU a pod against 18-20 with them in the command line
(bench/README.md, the Kubernetes backend).

GPUs. Whole GPUs are ``nvidia.com/gpu`` requests and limits: the device plugin picks
them on the node placement chose, and the container sees them as 0..n-1, so the host
indices placement picked are not passed. A share of one GPU (gpu < 1, placement's
GPU-sharing) cannot be an extended-resource request (those are whole numbers), so such a
task requests none and gets ``NVIDIA_VISIBLE_DEVICES`` set to the GPU placement gave it
(the NVIDIA container runtime honours it) with the share as an annotation: the
device plugin does not know of it, which is why placement, not the Kubernetes
scheduler, decides every node's GPUs (pods are bound by ``nodeName``).
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainyard_common.dialects.k8s_pod import quantity
from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec, reaches_pod
from trainyard_common.sources import Claim, NodePath, mount_problem, read_source, shown

from .failure import EndKind, preparation_kind

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "trainyard"
INSTALLATION_LABEL = "trainyard.dev/installation"
JOB_LABEL = "trainyard.dev/job"
ATTEMPT_LABEL = "trainyard.dev/attempt"
ROLE_LABEL = "trainyard.dev/role"
INDEX_LABEL = "trainyard.dev/index"
ROLE_ANNOTATION = "trainyard.dev/role-name"  # the role as written (labels are restricted)
GPU_SHARE_ANNOTATION = "trainyard.dev/gpu-share"
GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER = "task"
MPI_DIR = "/etc/mpi"
HOSTFILE_KEY = "hostfile"
SHM_VOLUME = "dshm"
COMMAND_VOLUME = "command"
COMMAND_DIR = "/var/run/trainyard"
COMMAND_KEY = "command"

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")

# Container states that mean the task can never start as asked.
START_FAILURES = {
    "ImagePullBackOff": "its image cannot be pulled",
    "ErrImagePull": "its image cannot be pulled",
    "InvalidImageName": "its image name is not valid",
    "ErrImageNeverPull": "its image is not on the node and may not be pulled",
    "CreateContainerConfigError": "its container cannot be configured",
    "CreateContainerError": "its container cannot be created",
    "RunContainerError": "its container cannot be run",
}


def _label(text: str, limit: int) -> str:
    """``text`` as part of a DNS label: lower case, [a-z0-9-], at most ``limit``; a
    digest keeps two different texts apart when cutting or changing made them alike."""
    cleaned = _NOT_LABEL.sub("-", text.lower()).strip("-") or "x"
    if cleaned == text and len(cleaned) <= limit:
        return cleaned
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{cleaned[: max(limit - 7, 1)].strip('-')}-{digest}"


_SERVICE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")


def port_name(label: str) -> str:
    """A port label as a container port's name, which must be an IANA service name: at
    most 15 of [a-z0-9-], a letter among them, no "--" (a label "8080" or "a--b" made
    the API server refuse the pod, 422, a permanent failure)."""
    name = _label(label, 15)
    if _SERVICE_NAME.fullmatch(name) and "--" not in name and re.search("[a-z]", name):
        return name
    digest = hashlib.sha256(label.encode()).hexdigest()[:6]
    base = re.sub("-+", "-", name)[:7].strip("-")
    return f"{base}-p{digest}" if base else f"p{digest}"


_NOT_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both
    ends); the annotations keep the exact text."""
    cleaned = _NOT_LABEL_VALUE.sub("-", text).strip("-._")
    if cleaned == text and len(cleaned) <= 63:
        return cleaned
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{cleaned[:56].strip('-._')}-{digest}".strip("-")


def service_name(job_id: str) -> str:
    return f"ty-{_label(job_id, 40)}"


def owner_name(job_id: str, attempt: int) -> str:
    return f"{service_name(job_id)}-a{attempt}"


def pod_name(job_id: str, attempt: int, role: str, index: int) -> str:
    return f"{owner_name(job_id, attempt)}-{_label(role, 10)}-{index}"


def is_lone(spec: JobSpec) -> bool:
    """Whether every attempt of the job is one task, and stays one: one replica in all
    and no elastic bound above it. (A job placed without a gang may start with fewer
    tasks than it has and get the rest later in the same attempt: only the spec says
    what an attempt may become, not its first placement.)"""
    most = sum(
        max(r.replicas, r.max_replicas if r.max_replicas is not None else 0) for r in spec.roles
    )
    return most == 1


def needs_service(spec: JobSpec) -> bool:
    """Whether the job's attempts get its headless Service.

    A lone task (``is_lone``) has no peer to find it, so it gets none: the Service, its
    EndpointSlice and their controllers cost the API server and etcd more than the pod
    itself (bench/README.md, the Kubernetes backend). It reaches itself at its
    hostname, which the kubelet writes into its ``/etc/hosts``."""
    return not is_lone(spec)


def needs_owner(spec: JobSpec, hostfile: str | None) -> bool:
    """Whether an attempt gets its owner ConfigMap: it holds an MPI hostfile, or it
    has several pods to delete at once, or its tasks' command lines may carry the job's
    secrets (their Secrets are made before their pods: the owner holds them). A lone
    task's pod is otherwise the whole attempt and is deleted as itself."""
    return hostfile is not None or not is_lone(spec) or bool(spec.secrets)


def task_address(
    job_id: str, attempt: int, role: str, index: int, namespace: str, *, lone: bool = False
) -> str:
    """The name the attempt's tasks reach this one at: its DNS name under the job's
    headless Service, or, for the attempt's only task (``lone``, no Service), its
    hostname (Kubeflow's PyTorchJob gives its master ``localhost`` likewise)."""
    name = pod_name(job_id, attempt, role, index)
    if lone:
        return name
    return f"{name}.{service_name(job_id)}.{namespace}.svc"


def command_secret_name(job_id: str, attempt: int, role: str, index: int) -> str:
    return f"{pod_name(job_id, attempt, role, index)}-command"


def job_labels(job_id: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, JOB_LABEL: label_value(job_id)}


def task_labels(job_id: str, attempt: int, role: str, index: int) -> dict[str, str]:
    return {
        **job_labels(job_id),
        ATTEMPT_LABEL: str(attempt),
        ROLE_LABEL: label_value(role),
        INDEX_LABEL: str(index),
    }


@dataclass(frozen=True)
class PodTask:
    """Which task a pod of ours is, read from its labels and annotations."""

    job_id: str
    attempt: int
    role: str
    index: int


def pod_task(pod: dict[str, Any]) -> PodTask | None:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if labels.get(MANAGED_BY) != MANAGER:
        return None
    try:
        return PodTask(
            job_id=annotations.get(JOB_LABEL) or labels[JOB_LABEL],
            attempt=int(labels[ATTEMPT_LABEL]),
            role=annotations.get(ROLE_ANNOTATION) or labels[ROLE_LABEL],
            index=int(labels[INDEX_LABEL]),
        )
    except (KeyError, ValueError):
        return None


def cached_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the launcher keeps of a pod the API server served: what ``pod_task``,
    ``pod_state`` and ``exec_command`` read (its name, uid, our labels and annotations,
    its node, its status, how the task container starts while it may still run), not
    its environment, volumes, init containers or managed fields. A finished job's pods
    stay in the cluster for their logs, and the cache holds each: served whole, some
    tens of kilobytes apiece in memory."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    kept_meta: dict[str, Any] = {
        k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta
    }
    for part in ("labels", "annotations"):
        ours = {
            k: v
            for k, v in (meta.get(part) or {}).items()
            if k == MANAGED_BY or k.startswith("trainyard.dev/")
        }
        if ours:
            kept_meta[part] = ours
    kept_spec: dict[str, Any] = {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {}
    status = pod.get("status") or {}
    if status.get("phase") not in ("Succeeded", "Failed"):
        # Commands are run in it while it runs: exec_command reads whether its shell
        # started it (the rest of that line can be long: OpenPAI's exports).
        kept_spec["containers"] = [
            {"name": c.get("name"), "command": (c.get("command") or [])[:2]}
            for c in spec.get("containers") or ()
            if c.get("name") == CONTAINER
        ]
    return {"metadata": kept_meta, "spec": kept_spec, "status": status}


# The ResourceQuota admission's refusal: "exceeded quota: <name>, requested: k=v,...,
# used: k=v,..., limited: k=v,..." (the resources the object would take past a hard
# limit, what the namespace uses of them, and the limits).
_QUOTA = re.compile(r"exceeded quota: [^,]*, requested: (\S*), used: (\S*), limited: (\S*)")


def never_within_quota(message: str) -> bool:
    """Whether a quota refusal is of an object that alone asks more than the quota's
    hard limit (no end of other pods will make room: refused, not tried again)."""
    match = _QUOTA.search(message)
    if match is None:
        return False
    requested, _, limited = (
        dict(item.partition("=")[::2] for item in part.split(",") if "=" in item)
        for part in match.groups()
    )
    for name, asked in requested.items():
        wanted, limit = quantity(asked), quantity(limited.get(name))
        if wanted is not None and limit is not None and wanted > limit:
            return True
    return False


# --------------------------------------------------------------------------- objects


@dataclass(frozen=True)
class PodSettings:
    """What the operator decides for every pod (the launcher's settings)."""

    service_account: str = "default"
    # The pod's securityContext, as the operator configures it (never the platform's).
    security_context: dict[str, Any] | None = None
    # The securityContext of the task's container and of the init containers (code
    # source, pip packages), the operator's: what only a container has
    # (allowPrivilegeEscalation, capabilities, privileged, readOnlyRootFilesystem), so
    # that pods can meet PodSecurity "restricted".
    container_security_context: dict[str, Any] | None = None
    # The task container's in an MPI job's pods instead, where set: its workers run
    # sshd as root (Kubeflow's and T9k's images), which cannot start without SETUID,
    # SETGID and SYS_CHROOT (privilege separation) nor bind port 22 without
    # NET_BIND_SERVICE. Unset: ``container_security_context``.
    mpi_container_security_context: dict[str, Any] | None = None
    image_pull_secrets: tuple[str, ...] = ()
    # The image that clones a job's code source in an init container.
    git_image: str = "alpine/git:2.47.2"
    # The directories of the nodes a data source may be a path in (hostPath, read-only:
    # YARD_K8S_HOST_PATHS, sources.read_host_paths); none: no node path.
    host_paths: tuple[str, ...] = ()
    # Annotations every pod gets unless its template sets them (the operator's: a
    # sidecar opt-out; on a KWOK test cluster, how long tasks "run").
    annotations: tuple[tuple[str, str], ...] = ()


class PodProblem(ValueError):
    """The task cannot be a pod as asked; ``str(exc)`` names the field and why."""


def escape_shell(command: str) -> str:
    """A shell command line the kubelet's ``$(VAR)`` expansion leaves as it is."""
    return command.replace("$", "$$")


# T9k's debug mode on Kubernetes: the pod is made ready as usual (its code, data and
# packages by the init containers), then this runs in place of the command (or of the
# container's argv) until the job is stopped; `yard exec` runs commands in it. POSIX sh
# only: an image's sleep may not take "infinity".
DEBUG_KEEPALIVE = (
    "echo 'trainyard: debug mode: the command is not run; this task stays up until the "
    "job is stopped (yard exec runs commands in it)' >&2; while :; do sleep 3600; done"
)


def container_command(
    role: RoleSpec, command: str, exports: str = "", *, hidden: bool = False
) -> dict[str, Any]:
    if role.container_form:
        argv: dict[str, Any] = {}
        if role.entrypoint:
            argv["command"] = list(role.entrypoint)
        if role.args:
            argv["args"] = list(role.args)
        return argv
    if hidden:
        return {"command": ["/bin/sh", "-c", escape_shell(_run_hidden(exports + command))]}
    return {"command": ["/bin/sh", "-c", escape_shell(exports + command)]}


# Linux caps one argument at 128 KiB (MAX_ARG_STRLEN); a line past this is sourced.
HIDDEN_EXEC_MAX_BYTES = 120 * 1024


def _run_hidden(line: str) -> str:
    """How the pod's shell runs a line kept in the task's Secret (command_secret): read
    whole (a ``.`` sentinel keeps its trailing newlines; an unreadable file or a missing
    ``cat`` fails the task, never runs nothing) and run by a shell exec'd in place of
    this one, so the task's command is still the container's first process (bash runs a
    -c line's last command in its own place, and gets the kubelet's SIGTERM), as with
    the line itself in the pod. A line too long for one argument is sourced instead
    (bash then stays the first process)."""
    path = f"{COMMAND_DIR}/{COMMAND_KEY}"
    if len(line.encode()) > HIDDEN_EXEC_MAX_BYTES:
        return f". {path}"
    return f'line=$(cat {path} && echo .) || exit 127; exec /bin/sh -c "${{line%.}}"'


def hides_command(role: RoleSpec, carries_secrets: bool) -> bool:
    """Whether a task's command line goes in a Secret of its own rather than in the
    Pod: it carries the job's secrets (substituted for ``<% $secrets.x %>``: the launch
    says so, whatever quoting a framework's wrapper gave them since). A container argv
    is never substituted."""
    return carries_secrets and not role.container_form


# Linux caps one argument at 128 KiB (MAX_ARG_STRLEN): past this, variables stay env
# entries (a job of a thousand tasks has a PAI_HOST_IP_* for each).
EXPORTS_MAX_BYTES = 64 * 1024
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def shell_exports(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """``env`` split for a shell command line: what stays the container's env, and the
    ``export`` line (ending in a newline) that gives the shell the rest, OpenPAI's
    variables, before the command. A name the shell cannot export stays an env entry."""
    kept: dict[str, str] = {}
    words: list[str] = []
    size = len("export \n")
    for name, value in env.items():
        word = f"{name}={_sh(value)}"
        cost = len(escape_shell(word).encode()) + 1
        if name.startswith("PAI_") and _SHELL_NAME.match(name) and size + cost <= EXPORTS_MAX_BYTES:
            words.append(word)
            size += cost
        else:
            kept[name] = value
    return kept, ("export " + " ".join(words) + "\n" if words else "")


def exec_command(pod: dict[str, Any], env: dict[str, str], command: list[str]) -> list[str]:
    """``command`` as it is run in the task's pod (the exec subresource): where the pod's
    shell exported OpenPAI's variables before the task's command, the same ``export``
    line before this one, so it sees the environment the task's command saw. (An exec's
    argv is not the kubelet's to expand: no ``$`` is doubled.)"""
    containers = (pod.get("spec") or {}).get("containers") or []
    task: dict[str, Any] = next((c for c in containers if c.get("name") == CONTAINER), {})
    if (task.get("command") or [])[:2] != ["/bin/sh", "-c"]:
        return command
    _, exports = shell_exports(env)
    return ["/bin/sh", "-c", exports + 'exec "$@"', "sh", *command] if exports else command


def _quantity_cpu(cpu: float) -> str:
    return f"{round(cpu * 1000)}m"


def resources(role: RoleSpec, placement: TaskPlacement) -> tuple[dict[str, Any], dict[str, str]]:
    """The container's resources and the environment a GPU share adds."""
    r = role.resources
    requests: dict[str, str] = {"cpu": _quantity_cpu(r.cpu), "memory": f"{r.memory_mb}Mi"}
    env: dict[str, str] = {}
    if r.gpu >= 1:
        requests[GPU_RESOURCE] = str(int(r.gpu))
    elif r.gpu > 0 and placement.gpu_indices:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g) for g in placement.gpu_indices)
        env["CUDA_VISIBLE_DEVICES"] = "0"
    # Limits are the requests (a Guaranteed pod), but what the job leaves uncapped.
    limits = {k: v for k, v in requests.items() if k not in r.uncapped}
    return {"requests": dict(requests), "limits": limits}, env


def _env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in env.items()]


# What NVIDIA's container runtime reads to give a container GPUs: a pod gets them from
# the device plugin (whole GPUs) or the platform (a share), never from the job's env,
# where NVIDIA_VISIBLE_DEVICES=all gave a pod that asked for none every GPU of its node.
GPU_RUNTIME_VARIABLES = frozenset({
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
})  # fmt: skip


def task_env_for_pod(env: dict[str, str], role: RoleSpec) -> dict[str, str]:
    """The task's environment as a pod gets it: host GPU indices mean nothing inside a
    container (the device plugin's GPUs are 0..n-1 there). A task without GPUs keeps
    CUDA_VISIBLE_DEVICES empty, which hides any GPU a runtime might show it. The GPU
    runtime's own variables are dropped (the share's are set after)."""
    out = {k: v for k, v in env.items() if k not in GPU_RUNTIME_VARIABLES}
    if role.resources.gpu > 0:
        out.pop("CUDA_VISIBLE_DEVICES", None)
    return out


def data_volume(
    source: str,
    index: int,
    settings: PodSettings,
    writable: bool = False,
    field_name: str = "data_sources",
) -> dict[str, Any]:
    """A data source as a pod volume: ``pvc://<claim>[/<sub path>]`` (read-write where
    ``writable``) or a node path (``/path``, ``file:///path``) in a directory the
    operator lists (``settings.host_paths``), never in a system tree (always read-only:
    the node's files are not a job's to change)."""
    where = f"{field_name}[{index}].source"
    problem = mount_problem(source, "kubernetes", settings.host_paths)
    found = read_source(source)
    if problem is None and isinstance(found, Claim):
        return {
            "persistentVolumeClaim": {"claimName": found.name, "readOnly": not writable},
            "subPath": found.sub_path,
        }
    if problem is None and isinstance(found, NodePath):
        return {"hostPath": {"path": found.path, "type": "Directory"}, "subPath": ""}
    raise PodProblem(f"{where}: {shown(source)}: {problem}")


def pod_manifest(
    *,
    spec: JobSpec,
    job_id: str,
    attempt: int,
    placement: TaskPlacement,
    env: dict[str, str],
    command: str,
    namespace: str,
    owner_uid: str | None,
    settings: PodSettings,
    mpi: bool = False,
    carries_secrets: bool = False,
    writable_claims: bool = False,
    debug: bool = False,
) -> dict[str, Any]:
    """The Pod of one task, bound to the node placement chose. Where its command line
    carries the job's secrets (``hides_command``), the line is left to the task's
    Secret (``command_secret``), which the adapter makes before the pod.
    ``writable_claims``: the namespace is kept to the job's user (its claims are their
    team's), so a claim is mounted read-write (outputs, checkpoints); elsewhere every
    user may mount it, read-only. ``debug`` (T9k's debug mode): DEBUG_KEEPALIVE runs in
    place of the command or the container's argv."""
    role = spec.role(placement.role)
    image = role.image or spec.image
    if not image:
        raise PodProblem(f"role {role.name!r}: no image to run (set the role's or the job's)")
    name = pod_name(job_id, attempt, placement.role, placement.index)
    res, gpu_env = resources(role, placement)
    pod_env, exports = _container_env(role, env, gpu_env)
    hidden = hides_command(role, carries_secrets) and not debug
    if not role.container_form and "\x00" in command and not debug:
        # No argument (and no shell reading a file: dash drops it) can hold one.
        raise PodProblem(f"role {role.name!r}: the command line holds a NUL character")
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        **({"imagePullPolicy": role.image_pull_policy} if role.image_pull_policy else {}),
        **(
            {"command": ["/bin/sh", "-c", escape_shell(exports + DEBUG_KEEPALIVE)]}
            if debug
            else container_command(role, command, exports, hidden=hidden)
        ),
        "env": _env_list(pod_env),
        "resources": res,
        "volumeMounts": [
            {
                "name": SHM_VOLUME,
                "mountPath": "/dev/shm",
                # shm_mb 0: an empty read-only /dev/shm, as on the local backend (a
                # sizeLimit of 0 is no limit to the kubelet: the pod's memory).
                **({"readOnly": True} if role.resources.shm_mb <= 0 else {}),
            }
        ],
    }
    ports = [
        {"name": port_name(a.label), "containerPort": port, "protocol": "TCP"}
        for a in placement.ports
        for i, port in enumerate(a.ports)
        if i == 0
    ] + [
        {"containerPort": port, "protocol": "TCP"}
        for a in placement.ports
        for i, port in enumerate(a.ports)
        if i > 0
    ]
    if ports:
        container["ports"] = ports
    volumes: list[dict[str, Any]] = [
        {
            "name": SHM_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": f"{role.resources.shm_mb}Mi"},
        }
    ]
    init: list[dict[str, Any]] = []
    if hidden:
        # Made before the pod (command_secret).
        secret = command_secret_name(job_id, attempt, placement.role, placement.index)
        volumes.append(
            {"name": COMMAND_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o444}}
        )
        container["volumeMounts"].append(
            {"name": COMMAND_VOLUME, "mountPath": COMMAND_DIR, "readOnly": True}
        )
    if mpi:
        volumes.append({"name": "mpi", "configMap": {"name": owner_name(job_id, attempt)}})
        container["volumeMounts"].append({"name": "mpi", "mountPath": MPI_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "ssh",
                "secret": {
                    "secretName": f"{owner_name(job_id, attempt)}-ssh",
                    "defaultMode": 0o600,
                },
            }
        )
        container["volumeMounts"].append(
            {"name": "ssh", "mountPath": "/root/.ssh", "readOnly": True}
        )
    if spec.code_source is not None:
        code = spec.code_source
        volumes.append({"name": "code", "emptyDir": {}})
        container["volumeMounts"].append({"name": "code", "mountPath": code.mount_path})
        clone = ["git", "clone", "--quiet"]
        clone += ["--branch", code.branch] if code.branch else []
        clone += ["--", code.repo, "/code"]
        script = " ".join(_sh(w) for w in clone)
        if code.commit:
            script += f" && git -C /code checkout --quiet --detach {_sh(code.commit)}"
        init.append(
            {
                "name": "code-source",
                "image": settings.git_image,
                "command": ["/bin/sh", "-c", escape_shell(script)],
                "volumeMounts": [{"name": "code", "mountPath": "/code"}],
            }
        )
    # The job's data sources, then the claims the role's pod template mounts (T9k,
    # Kubeflow), alike: read-write only in a namespace kept to the job's user.
    sources = [("data", spec.data_sources, "data_sources"), ("vol", role.volumes, "volumes")]
    for prefix, listed, field_name in sources:
        for i, data in enumerate(listed):
            writable = writable_claims and not data.read_only
            volume = data_volume(data.source, i, settings, writable, field_name)
            sub = volume.pop("subPath")
            volumes.append({"name": f"{prefix}-{i}", **volume})
            mount: dict[str, Any] = {
                "name": f"{prefix}-{i}",
                "mountPath": data.mount_path,
                "readOnly": volume.get("persistentVolumeClaim", {}).get("readOnly", True),
            }
            if sub:
                mount["subPath"] = sub
            container["volumeMounts"].append(mount)
    if spec.pip_packages or spec.pip_requirements_dir:
        # What the task mounts (its code, its data, its claims), so a requirements
        # file there (PAI-DLC's ThirdpartyLibDir: "/root/code/", in the code source
        # cloned by the init container before) is read as the local backend reads it.
        seen = [m for m in container["volumeMounts"] if m["name"] != SHM_VOLUME]
        packages = {"name": "packages", "mountPath": "/opt/trainyard/packages"}
        volumes.append({"name": "packages", "emptyDir": {}})
        container["volumeMounts"].append(packages)
        install = ["pip", "install", "--no-input", "--target", "/opt/trainyard/packages"]
        install += list(spec.pip_packages)
        if spec.pip_requirements_dir:
            install += ["-r", f"{spec.pip_requirements_dir.rstrip('/')}/requirements.txt"]
        init.append(
            {
                "name": "pip-packages",
                "image": image,
                "command": install,
                "volumeMounts": [packages, *seen],
            }
        )
        python_path = "/opt/trainyard/packages"
        if env.get("PYTHONPATH"):
            python_path += ":" + env["PYTHONPATH"]
        container["env"].append({"name": "PYTHONPATH", "value": python_path})
    pod_spec: dict[str, Any] = {
        "nodeName": placement.node,
        "hostname": name,
        "subdomain": service_name(job_id),
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        # A task gets no credentials of the cluster unless the operator's account says.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 30,
    }
    context = settings.container_security_context
    if mpi and settings.mpi_container_security_context is not None:
        context = settings.mpi_container_security_context
    if context:
        container["securityContext"] = copy.deepcopy(context)
    if init:
        # A failed preparation's last output lines become its terminated.message, which
        # tells a wrong input (the user's) from a registry or index that did not answer.
        pod_spec["initContainers"] = [
            {
                **step,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                **(
                    {"securityContext": copy.deepcopy(settings.container_security_context)}
                    if settings.container_security_context
                    else {}
                ),
            }
            for step in init
        ]
    if settings.security_context:
        pod_spec["securityContext"] = dict(settings.security_context)
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    annotations = dict(settings.annotations)
    annotations.update({a.name: a.value for a in role.annotations if reaches_pod(a.name)})
    annotations[JOB_LABEL] = job_id
    annotations[ROLE_ANNOTATION] = placement.role
    if 0 < role.resources.gpu < 1:
        annotations[GPU_SHARE_ANNOTATION] = f"{role.resources.gpu:g}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": task_labels(job_id, attempt, placement.role, placement.index),
            "annotations": annotations,
            **(
                {}
                if owner_uid is None  # a lone task's pod is its attempt (needs_owner)
                else {
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "name": owner_name(job_id, attempt),
                            "uid": owner_uid,
                            # No blockOwnerDeletion: deletes are in the background (it
                            # matters only to a foreground one), and where the API
                            # server enforces owner permissions (OpenShift's default)
                            # setting it needs update on configmaps/finalizers, which
                            # the launcher's role does not grant: every pod a 403.
                            "controller": True,
                        }
                    ]
                }
            ),
        },
        "spec": pod_spec,
    }


def _container_env(
    role: RoleSpec, env: dict[str, str], gpu_env: dict[str, str]
) -> tuple[dict[str, str], str]:
    """The task container's env entries, and for a shell command line the ``export``
    line its shell runs first (``shell_exports``)."""
    if role.resources.gpu <= 0:
        # A CUDA image's own NVIDIA_VISIBLE_DEVICES=all would show it every GPU of its
        # node where the runtime honours the variable: none, for a pod that asked none.
        gpu_env = {**gpu_env, "NVIDIA_VISIBLE_DEVICES": "void"}
    pod_env = {**task_env_for_pod(env, role), **gpu_env}
    if role.container_form:
        return pod_env, ""
    return shell_exports(pod_env)


def command_secret(
    *,
    spec: JobSpec,
    job_id: str,
    attempt: int,
    placement: TaskPlacement,
    env: dict[str, str],
    command: str,
    namespace: str,
    owner_uid: str,
) -> dict[str, Any]:
    """The Secret holding a task's command line (``hides_command``), with the export
    line the pod's shell would have run before it, as the shell reads it (no ``$``
    doubled: the kubelet does not expand a file). Owned by the attempt's owner until
    its pod is made, which the adapter then makes its only owner; immutable, so no
    kubelet watches it."""
    role = spec.role(placement.role)
    _, exports = _container_env(role, env, resources(role, placement)[1])
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": command_secret_name(job_id, attempt, placement.role, placement.index),
            "namespace": namespace,
            "labels": task_labels(job_id, attempt, placement.role, placement.index),
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": owner_name(job_id, attempt),
                    "uid": owner_uid,
                }
            ],
        },
        "type": "Opaque",
        "immutable": True,
        "stringData": {COMMAND_KEY: exports + command},
    }


def _sh(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def service_manifest(job_id: str, namespace: str) -> dict[str, Any]:
    """The job's headless Service: DNS names for its pods, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job_id),
            "namespace": namespace,
            "labels": job_labels(job_id),
        },
        "spec": {
            "clusterIP": "None",
            "selector": job_labels(job_id),
            "publishNotReadyAddresses": True,
        },
    }


def owner_manifest(
    job_id: str, attempt: int, namespace: str, hostfile: str | None
) -> dict[str, Any]:
    """The attempt's owner (and its MPI hostfile): deleting it deletes every pod."""
    data = {HOSTFILE_KEY: hostfile} if hostfile is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": owner_name(job_id, attempt),
            "namespace": namespace,
            "labels": {**job_labels(job_id), ATTEMPT_LABEL: str(attempt)},
            "annotations": {JOB_LABEL: job_id},
        },
        "data": data,
    }


def mpi_hostfile(hosts: list[tuple[str, int]], hydra: bool = False) -> str:
    """Open MPI's "host slots=N" lines, or Hydra's "host:N" (Intel MPI, MPICH)."""
    if hydra:
        return "".join(f"{host}:{slots}\n" for host, slots in hosts)
    return "".join(f"{host} slots={slots}\n" for host, slots in hosts)


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class PodState:
    """How a task's pod stands, in the launcher's terms."""

    running: bool  # not ended (Pending counts: the task has not ended)
    started: bool = False  # its container runs (or ran)
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    end_kind: str | None = None
    ended_at: float | None = None
    step: str | None = None  # what a pending pod waits for


def _time(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _task_container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next(
        (c for c in statuses if c.get("name") == CONTAINER), statuses[0] if statuses else {}
    )


def pod_state(pod: dict[str, Any]) -> PodState:
    """The task as its pod shows it (a dict as the API serves it)."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    container = _task_container(pod)
    state = container.get("state") or {}
    if status.get("reason") == "Evicted" or (
        phase == "Failed" and status.get("reason") in ("Preempting", "Terminated", "Shutdown")
    ):
        return PodState(
            running=False,
            reason=f"the pod was {status.get('reason', 'evicted').lower()} by its node: "
            f"{status.get('message') or 'no message'}",
            end_kind=EndKind.KILLED_BY_PLATFORM.value,
        )
    ended = state.get("terminated") or {}
    disrupted = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        ),
        None,
    )
    if disrupted is not None and (phase == "Failed" or ended.get("exitCode", 0) != 0):
        # The cluster ended it (the scheduler's preemption, a drain's eviction, the
        # taint manager, the kubelet's shutdown): it then only reads as "exit 143".
        return PodState(
            running=False,
            reason=f"the pod was ended by the cluster ({disrupted.get('reason') or 'disrupted'}): "
            f"{disrupted.get('message') or 'no message'}",
            end_kind=EndKind.KILLED_BY_PLATFORM.value,
            ended_at=_time(ended.get("finishedAt")),
        )
    if phase == "Failed" and not ended and status.get("reason"):
        # Refused by its node's kubelet (pods are bound by name, so its admission is the
        # only check): no container ran, only the pod's reason says why.
        return PodState(
            running=False,
            reason=f"could not start: its node refused the pod ({status['reason']}): "
            f"{status.get('message') or 'no message'}",
            end_kind=EndKind.START_FAILED.value,
        )
    for init in status.get("initContainerStatuses") or []:
        terminated = (init.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            # As on the local backend: the user's when what it said names a wrong input
            # (a branch not there, no such package), else unknown (a git host or an
            # index that did not answer), which may be retried.
            said = str(terminated.get("message") or "").strip()
            if terminated.get("reason") == "OOMKilled":
                prepared = EndKind.OUT_OF_MEMORY
            else:
                prepared = preparation_kind(said)
            return PodState(
                running=False,
                exit_code=None,
                reason=f"preparing the task ({init.get('name')}) failed: exit code "
                f"{terminated.get('exitCode')}, {terminated.get('reason') or 'no reason'}"
                + (f": {said[-300:]}" if said else ""),
                end_kind=prepared.value,
                ended_at=_time(terminated.get("finishedAt")),
            )
        waiting = (init.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in START_FAILURES:
            return _start_failure(waiting, init.get("image"))
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in START_FAILURES:
        return _start_failure(waiting, container.get("image"))
    terminated = state.get("terminated")
    if phase in ("Succeeded", "Failed") or terminated:
        terminated = terminated or {}
        code = terminated.get("exitCode")
        if code is None:
            code = 0 if phase == "Succeeded" else 1
        signal = terminated.get("signal")
        reason = terminated.get("reason")
        kind = None
        text = None
        if reason == "OOMKilled":
            kind = EndKind.OUT_OF_MEMORY.value
            text = "killed for going past its memory limit (OOMKilled)"
        elif reason not in (None, "Completed", "Error"):
            text = f"{reason}: {terminated.get('message') or ''}".strip(": ")
        return PodState(
            running=False,
            started=True,
            exit_code=int(code),
            signal=int(signal) if signal else None,
            reason=text,
            end_kind=kind,
            ended_at=_time(terminated.get("finishedAt")),
        )
    if phase == "Running" and state.get("running") is not None:
        return PodState(running=True, started=True)
    step = waiting.get("reason") or (
        "scheduled on its node" if pod.get("spec", {}).get("nodeName") else "waiting for a node"
    )
    if waiting.get("message"):
        step = f"{step}: {waiting['message']}"
    return PodState(running=True, started=False, step=step[:200])


# An image that is not there, said so by the kubelet (or an image name that cannot be
# one): the user's input, which a new attempt would only meet again (OpenPAI's
# ContainerImageNotExists: permanent). A registry that did not answer is not that.
_NO_SUCH_IMAGE = re.compile(
    r"not found|manifest unknown|does not exist|repository .* not exist", re.IGNORECASE
)


def _start_failure(waiting: dict[str, Any], image: str | None) -> PodState:
    reason = waiting["reason"]
    message = str(waiting.get("message") or "")
    pulling = reason in ("ErrImagePull", "ImagePullBackOff")
    users = reason in ("InvalidImageName", "ErrImageNeverPull") or (
        pulling and bool(_NO_SUCH_IMAGE.search(message))
    )
    if pulling and not users:
        # A registry that did not answer, throttled pulls (429 toomanyrequests), a
        # blip: the kubelet tries again with a backoff, as Kubernetes leaves such a pod
        # to. Still starting, then, until the start deadline (a platform failure that
        # names this step); failed at once, a job without retries failed for a blip.
        step = f"its image cannot be pulled yet ({reason}" + (f", image {image}" if image else "")
        return PodState(running=True, started=False, step=(step + f"): {message}")[:200])
    return PodState(
        running=False,
        reason=f"could not start: {START_FAILURES[reason]} ({reason}"
        + (f", image {image}" if image else "")
        + (f"): {message}" if message else ")"),
        end_kind=(EndKind.PREPARE_USER if users else EndKind.START_FAILED).value,
    )
