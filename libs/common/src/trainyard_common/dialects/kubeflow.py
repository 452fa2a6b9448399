"""Kubeflow Training Operator v1 (``kubeflow.org/v1``) PyTorchJob and TFJob to and from
the canonical job.

Kubeflow's completion rule is expressed with ``success_rules``: the job succeeds when its
Master (PyTorch) or Chief (TF; else Master, else worker 0) succeeds, or, for a TFJob with
``successPolicy: AllWorkers``, when every worker has; any replica failing for good fails
it (each role's ``min_failed`` stays 1).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from ..events import FieldIssue
from ..jobspec import (
    ALL_TASKS,
    MPI_IMPLEMENTATION_ENV,
    RETRY_UNLIMITED,
    EnvVar,
    JobKind,
    JobSpec,
    PortSpec,
    RestartPolicy,
    RoleSpec,
    RunMode,
    TaskRef,
)
from .fields import mapping
from .k8s_pod import (
    DNS_LABEL_RE,
    DNS_LABEL_RULE,
    Control,
    condition,
    elastic_scale,
    immutable_change,
    is_paused,
    latest_tasks,
    merge_patch,
    pod_template,
    rejection_message,
    resource_metadata,
    shell_command,
    template_field_path,
    timestamp,
    unknown_metadata,
)
from .registry import Dialect
from .translation import Issues, Translation, empty_spec, join, json_type, show, shown_tasks

DIALECT = "kubeflow"
GROUP = "kubeflow.org"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubeflow's ExitCode policy: 1-127 are permanent errors, 128-255 are retried.
RETRYABLE_EXIT_CODES = list(range(128, 256))


@dataclass(frozen=True)
class Kind:
    name: str
    plural: str
    job_kind: JobKind
    replica_key: str
    types: tuple[str, ...]
    container: str  # the container Kubeflow requires by name
    default_restart: RestartPolicy
    fields: frozenset[str]
    # The port every replica gets (Kubeflow adds it to the container when it is not
    # declared: a TFJob's "tfjob-port", 2222 in its pod). Here placement gives each task
    # one, and TF_CONFIG names them.
    default_port: str | None = None
    # Which tasks' success is the job's: "main" (the Chief, Master or Worker 0),
    # "launcher" (MPIJob's Launcher), "every" (every Master, else every Worker).
    success: str = "main"
    # Replica types of which a job has exactly one task.
    single: tuple[str, ...] = ("Master", "Chief", "Launcher")
    # The API versions the kind is served at (MPIJob: the Training Operator's v1 and
    # the MPI Operator's v2beta1, one resource as in a cluster with either installed).
    versions: tuple[str, ...] = (VERSION,)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "PyTorchJob",
            "pytorchjobs",
            JobKind.PYTORCH,
            "pytorchReplicaSpecs",
            ("Master", "Worker"),
            "pytorch",
            RestartPolicy.ON_FAILURE,
            frozenset({"pytorchReplicaSpecs", "runPolicy", "elasticPolicy", "nprocPerNode"}),
        ),
        Kind(
            "TFJob",
            "tfjobs",
            JobKind.TENSORFLOW,
            "tfReplicaSpecs",
            ("Chief", "Master", "Worker", "PS", "Evaluator"),
            "tensorflow",
            RestartPolicy.NEVER,
            frozenset({"tfReplicaSpecs", "runPolicy", "successPolicy", "enableDynamicWorker"}),
            default_port="tfjob-port",
        ),
        Kind(
            "MPIJob",
            "mpijobs",
            JobKind.MPI,
            "mpiReplicaSpecs",
            ("Launcher", "Worker"),
            "mpi",
            RestartPolicy.NEVER,
            frozenset(
                {
                    "mpiReplicaSpecs",
                    "runPolicy",
                    "slotsPerWorker",
                    "mainContainer",
                    "cleanPodPolicy",
                }
            ),
            success="launcher",
            versions=(VERSION, "v2beta1"),
        ),
        Kind(
            "XGBoostJob",
            "xgboostjobs",
            JobKind.XGBOOST,
            "xgbReplicaSpecs",
            ("Master", "Worker"),
            "xgboost",
            RestartPolicy.NEVER,
            frozenset({"xgbReplicaSpecs", "runPolicy"}),
            default_port="xgboostjob-port",
        ),
        Kind(
            "PaddleJob",
            "paddlejobs",
            JobKind.PADDLE,
            "paddleReplicaSpecs",
            ("Master", "Worker"),
            "paddle",
            RestartPolicy.NEVER,
            frozenset({"paddleReplicaSpecs", "runPolicy", "elasticPolicy"}),
            default_port="master",
            # The paddle controller: no count rule for Master (parameter-server mode runs
            # several, its servers); the job succeeds when every Master has.
            success="every",
            single=(),
        ),
        Kind(
            "JAXJob",
            "jaxjobs",
            JobKind.JAX,
            "jaxReplicaSpecs",
            ("Worker",),
            "jax",
            RestartPolicy.NEVER,
            frozenset({"jaxReplicaSpecs", "runPolicy"}),
            default_port="jaxjob-port",
            success="every",
        ),
    )
}
# The MPI Operator's MPIJob (kubeflow.org/v2beta1): its spec fields, its MPI
# implementations (how the hostfile is written) and launcher creation policies.
MPI_V2 = f"{GROUP}/v2beta1"
MPI_V2_FIELDS = frozenset(
    {
        "mpiReplicaSpecs",
        "runPolicy",
        "slotsPerWorker",
        "sshAuthMountPath",
        "launcherCreationPolicy",
        "mpiImplementation",
    }
)
MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
PLURALS: dict[str, Kind] = {k.plural: k for k in KINDS.values()}
_RESTART = {p.value: p for p in RestartPolicy}
_CLEAN_POD = {"None": "None", "All": "All", "Running": "Unfinished"}
_ELASTIC_KEYS = {"min_replicas": "minReplicas", "max_replicas": "maxReplicas"}
_RESTARTING = (RestartPolicy.ON_FAILURE, RestartPolicy.ALWAYS, RestartPolicy.EXIT_CODE)


def key_of(namespace: str, plural: str, name: str) -> str:
    return f"{namespace}/{plural}/{name}"


def field_path(payload: Any, role: str | None, field: str) -> str:
    """Where a canonical field is written in a Kubeflow job: a role is its replica spec,
    keyed by type; its resources are the training container's."""
    if role is None:
        return {"name": "$.metadata.name", "queue": "$.spec.runPolicy.schedulingPolicy.queue"}.get(
            field, "$.spec"
        )
    payload = payload if isinstance(payload, dict) else {}
    kind = KINDS.get(raw_kind) if isinstance(raw_kind := payload.get("kind"), str) else None
    spec = payload.get("spec")
    replicas = spec.get(kind.replica_key) if kind and isinstance(spec, dict) else None
    if kind is None or not isinstance(replicas, dict) or role not in replicas:
        return "$.spec"
    path = join(join("$.spec", kind.replica_key), role)
    entry = replicas[role]
    if field == "role" or field == "name":
        return path
    if field == "replicas":
        return join(path, "replicas")
    if field in ("min_replicas", "max_replicas"):
        # Elastic bounds are the job's elasticPolicy, which applies to the Worker.
        return join("$.spec.elasticPolicy", _ELASTIC_KEYS[field])
    template = entry.get("template") if isinstance(entry, dict) else None
    return template_field_path(template, join(path, "template"), field, (kind.container,))


def _run_policy(spec: dict[str, Any], issues: Issues) -> dict[str, Any]:
    raw = spec.get("runPolicy")
    path = "$.spec.runPolicy"
    out: dict[str, Any] = {}
    if raw is None:
        return out
    if not isinstance(raw, dict):
        issues.error(path, f"runPolicy must be an object, not {json_type(raw)}", "type")
        return out
    backoff = issues.integer(raw, "backoffLimit", path, required=False, minimum=0)
    if backoff is not None:
        out["retry_limit"] = backoff
    deadline = issues.integer(raw, "activeDeadlineSeconds", path, required=False, minimum=1)
    if deadline is not None:
        out["max_running_minutes"] = math.ceil(deadline / 60)
    if "cleanPodPolicy" in raw:
        policy = raw["cleanPodPolicy"]
        if not isinstance(policy, str) or policy not in _CLEAN_POD:
            issues.error(
                join(path, "cleanPodPolicy"),
                f"cleanPodPolicy {show(policy)} must be one of None, Running, All",
                "enum",
            )
        else:
            out["cleanup_policy"] = _CLEAN_POD[policy]
    if "suspend" in raw:
        if not isinstance(raw["suspend"], bool):
            issues.error(join(path, "suspend"), "suspend must be a boolean", "type")
        elif raw["suspend"]:
            out["run_mode"] = RunMode.PAUSE
    scheduling = raw.get("schedulingPolicy")
    spath = join(path, "schedulingPolicy")
    if isinstance(scheduling, dict):
        queue = issues.string(scheduling, "queue", spath, required=False, non_blank=True)
        if queue is not None:
            out["queue"] = queue
        for extra in sorted(k for k in scheduling if k != "queue"):
            issues.warn(
                join(spath, extra),
                f"schedulingPolicy.{extra} is kept but not "
                "applied: Trainyard's placement is gang scheduling already",
                "not_applied",
            )
    elif scheduling is not None:
        issues.error(spath, "schedulingPolicy must be an object", "type")
    for extra in sorted(
        k
        for k in raw
        if k
        not in (
            "backoffLimit",
            "activeDeadlineSeconds",
            "cleanPodPolicy",
            "suspend",
            "schedulingPolicy",
        )
    ):
        issues.warn(join(path, extra), f"runPolicy.{extra} is kept but not applied", "not_applied")
    return out


def _restart(raw: Any, path: str, kind: Kind, issues: Issues) -> RestartPolicy:
    if raw is None:
        return kind.default_restart
    if not isinstance(raw, str) or raw not in _RESTART:
        issues.error(
            path,
            f"restartPolicy {show(raw)} must be one of Always, OnFailure, Never, ExitCode",
            "enum",
        )
        return kind.default_restart
    return _RESTART[raw]


def _roles(
    kind: Kind, spec: dict[str, Any], issues: Issues, *, named_container: bool = True
) -> list[RoleSpec]:
    """The replica specs as roles; ``named_container``: the operator runs the container
    named after the framework (the Training Operator), not the first one (the MPI
    Operator v2)."""
    path = join("$.spec", kind.replica_key)
    raw = spec.get(kind.replica_key)
    if not isinstance(raw, dict) or not raw:
        issues.error(
            path,
            f"{kind.replica_key} is required (an object of replica specs by "
            f"type: {', '.join(kind.types)})"
            if raw is None
            else f"{kind.replica_key} must be a non-empty object",
            "required" if raw is None else "type",
        )
        return []
    roles: list[RoleSpec] = []
    for rtype, entry in raw.items():
        rpath = join(path, str(rtype))
        if rtype not in kind.types:
            issues.error(
                rpath, f"replica type {show(rtype)} must be one of {', '.join(kind.types)}", "enum"
            )
            continue
        if not isinstance(entry, dict):
            issues.error(rpath, f"a replica spec must be an object, not {json_type(entry)}", "type")
            continue
        replicas = issues.integer(entry, "replicas", rpath, required=False, minimum=1)
        if rtype in kind.single and replicas is not None and replicas > 1:
            issues.error(
                join(rpath, "replicas"),
                f"{rtype} must have exactly 1 replica, got {replicas}",
                "range",
            )
        policy = _restart(entry.get("restartPolicy"), join(rpath, "restartPolicy"), kind, issues)
        pod = pod_template(
            entry.get("template"),
            join(rpath, "template"),
            issues,
            preferred=(kind.container,),
            owner=f"replica type {rtype}",
        )
        if (
            named_container
            and pod.container_name not in (None, kind.container)
            and pod.container_path
        ):
            issues.warn(
                join(pod.container_path, "name"),
                f"Kubeflow runs the container "
                f"named {kind.container!r}; none is, so {pod.container_name!r} is "
                "run",
                "spelling",
            )
        for extra in sorted(k for k in entry if k not in ("replicas", "restartPolicy", "template")):
            issues.warn(
                join(rpath, extra),
                f"unknown replica spec field {show(extra)} is kept but not used",
                "unknown_field",
            )
        # The container runs as Kubernetes runs it: its command replaces the image's
        # entrypoint, its args alone keep it (the backend decides whether it can).
        command = shell_command(pod.argv)
        roles.append(
            RoleSpec(
                name=str(rtype),
                replicas=replicas or 1,
                resources=pod.resources,
                image=pod.image,
                image_pull_policy=pod.image_pull_policy,
                command=command,
                entrypoint=pod.command or None,
                args=pod.args,
                annotations=pod.annotations,
                volumes=pod.volumes,
                env=pod.env,
                ports=[PortSpec(label=kind.default_port)] if kind.default_port else [],
                restart_policy=policy,
                node_selector=pod.node_selector,
                retryable_exit_codes=list(RETRYABLE_EXIT_CODES)
                if policy is RestartPolicy.EXIT_CODE
                else [],
            )
        )
    return roles


def _elastic(spec: dict[str, Any], roles: list[RoleSpec], issues: Issues) -> bool:
    raw = spec.get("elasticPolicy")
    path = "$.spec.elasticPolicy"
    if raw is None:
        return False
    if not isinstance(raw, dict):
        issues.error(path, "elasticPolicy must be an object", "type")
        return False
    lo = issues.integer(raw, "minReplicas", path, required=False, minimum=1)
    hi = issues.integer(raw, "maxReplicas", path, required=False, minimum=1)
    for extra in sorted(k for k in raw if k not in ("minReplicas", "maxReplicas")):
        issues.warn(
            join(path, extra), f"elasticPolicy.{extra} is kept but not applied", "not_applied"
        )
    if lo is not None and hi is not None and lo > hi:
        issues.error(
            join(path, "minReplicas"),
            f"minReplicas ({lo}) must not exceed maxReplicas ({hi})",
            "range",
        )
        return False
    for i, role in enumerate(roles):
        if role.name == "Worker":
            low = lo if lo is not None else role.replicas
            high = hi if hi is not None else max(role.replicas, low)
            roles[i] = role.model_copy(
                update={
                    "min_replicas": low,
                    "max_replicas": high,
                    "replicas": min(max(role.replicas, low), high),
                }
            )
    return True


def _mpi(spec: dict[str, Any], roles: list[RoleSpec], issues: Issues, *, v2: bool) -> None:
    """MPIJob's own fields: a Launcher is required (it runs mpirun); slotsPerWorker is
    what the hostfile gives each worker, which here is one slot per GPU (1 without)."""
    if roles and not any(r.name == "Launcher" for r in roles):
        issues.error(
            "$.spec.mpiReplicaSpecs.Launcher",
            "an MPIJob needs a Launcher replica spec (it runs mpirun over the workers)",
            "required",
        )
    slots = issues.integer(spec, "slotsPerWorker", "$.spec", required=False, minimum=1)
    worker = next((r for r in roles if r.name == "Worker"), None)
    if slots is not None and worker is not None and slots != max(1, int(worker.resources.gpu)):
        issues.warn(
            "$.spec.slotsPerWorker",
            f"slotsPerWorker {slots} is kept but not applied: each worker's hostfile line "
            f"has one slot per GPU ({max(1, int(worker.resources.gpu))} here)",
            "not_applied",
        )
    for extra in ("mainContainer", "cleanPodPolicy"):
        if extra in spec and not v2:
            issues.warn(
                join("$.spec", extra),
                f"{extra} is kept but not applied (runPolicy.cleanPodPolicy is)",
                "not_applied",
            )


def _mpi_v2(spec: dict[str, Any], issues: Issues) -> list[EnvVar]:
    """The MPI Operator v2's own fields: ``mpiImplementation`` (OpenMPI, Intel, MPICH)
    decides the hostfile's form (``host slots=N`` or Hydra's ``host:N``) and is given to
    the tasks; ``launcherCreationPolicy`` needs nothing here (the gang starts together,
    workers with the launcher); ``sshAuthMountPath`` is kept, unused (nothing connects
    over ssh: ranks start through the launcher's agent)."""
    implementation = issues.string(spec, "mpiImplementation", "$.spec", required=False)
    if implementation is not None and implementation not in MPI_IMPLEMENTATIONS:
        issues.error(
            "$.spec.mpiImplementation",
            f"mpiImplementation {show(implementation)} must be one of "
            f"{', '.join(MPI_IMPLEMENTATIONS)}",
            "enum",
        )
        implementation = None
    policy = issues.string(spec, "launcherCreationPolicy", "$.spec", required=False)
    if policy is not None and policy not in ("AtStartup", "WaitForWorkersReady"):
        issues.error(
            "$.spec.launcherCreationPolicy",
            f"launcherCreationPolicy {show(policy)} must be AtStartup or WaitForWorkersReady",
            "enum",
        )
    if issues.string(spec, "sshAuthMountPath", "$.spec", required=False) is not None:
        issues.warn(
            "$.spec.sshAuthMountPath",
            "sshAuthMountPath is kept but not used: ranks start through the launcher's "
            "agent, not ssh",
            "not_applied",
        )
    return [EnvVar(name=MPI_IMPLEMENTATION_ENV, value=implementation or "OpenMPI")]


def _success(
    kind: Kind, spec: dict[str, Any], roles: list[RoleSpec], issues: Issues
) -> list[list[TaskRef]]:
    by_name = {r.name: r for r in roles}
    policy = spec.get("successPolicy") if kind.name == "TFJob" else None
    if policy not in (None, "", "AllWorkers"):
        issues.error(
            "$.spec.successPolicy", f'successPolicy {show(policy)} must be "" or AllWorkers', "enum"
        )
    # Every worker, however many (a list of each would be as large as the job is wide);
    # a Chief or Master decides alone, successPolicy or not (the tf controller applies it
    # only without one).
    chief = "Chief" in by_name or "Master" in by_name
    if policy == "AllWorkers" and "Worker" in by_name and not chief:
        return [[TaskRef(role="Worker", index=ALL_TASKS)]]
    if kind.success == "launcher" and "Launcher" in by_name:
        return [[TaskRef(role="Launcher", index=0)]]
    if kind.success == "every":
        every = next((t for t in ("Master", "Worker") if t in by_name), None)
        if every is not None:
            return [[TaskRef(role=every, index=ALL_TASKS)]]
    for main in ("Chief", "Master", "Worker"):
        if main in by_name:
            return [[TaskRef(role=main, index=0)]]
    return []


def translate_kubeflow(payload: Any, user: str = "") -> Translation:
    issues = Issues()
    if not isinstance(payload, dict):
        issues.error("$", f"a Kubeflow job must be an object, not {json_type(payload)}", "type")
        return Translation(empty_spec(user=user), DIALECT, issues.errors, issues.warnings)
    version = payload.get("apiVersion")
    kind = KINDS.get(raw_kind) if isinstance(raw_kind := payload.get("kind"), str) else None
    allowed = [f"{GROUP}/{v}" for v in (kind.versions if kind else (VERSION,))]
    if version not in allowed:
        issues.error(
            "$.apiVersion",
            f"apiVersion must be {' or '.join(repr(a) for a in allowed)}, got {show(version)}",
            "invalid" if version is not None else "required",
        )
    v2 = version == MPI_V2
    if kind is None:
        issues.error(
            "$.kind", f"kind {show(payload.get('kind'))} must be one of {', '.join(KINDS)}", "enum"
        )
    meta = payload.get("metadata")
    name, namespace = "", "default"
    if isinstance(meta, dict):
        name = (
            issues.string(
                meta, "name", "$.metadata", required=True, pattern=DNS_LABEL_RE, rule=DNS_LABEL_RULE
            )
            or ""
        )
        namespace = (
            issues.string(
                meta,
                "namespace",
                "$.metadata",
                required=False,
                pattern=DNS_LABEL_RE,
                rule=DNS_LABEL_RULE,
            )
            or "default"
        )
        unknown_metadata(meta, issues)
    else:
        issues.error("$.metadata", "metadata is required (an object with a name)", "required")
    spec = payload.get("spec")
    if not isinstance(spec, dict):
        issues.error("$.spec", "spec is required (an object)", "required")
    if kind is None or not isinstance(spec, dict):
        key = key_of(namespace, kind.plural, name) if kind and name else None
        return Translation(empty_spec(name, user), DIALECT, issues.errors, issues.warnings, key=key)
    for extra in sorted(k for k in spec if k not in (MPI_V2_FIELDS if v2 else kind.fields)):
        issues.warn(
            join("$.spec", extra),
            f"{extra} is not a field of {kind.name}; it is kept but not used",
            "unknown_field",
        )
    for extra in ("nprocPerNode", "enableDynamicWorker"):
        if extra in spec and extra in kind.fields:
            issues.warn(
                join("$.spec", extra),
                f"{extra} is kept but not applied: each task runs its command once",
                "not_applied",
            )
    roles = _roles(kind, spec, issues, named_container=not v2)
    env: list[EnvVar] = []
    if kind.name == "MPIJob":
        _mpi(spec, roles, issues, v2=v2)
        if v2:
            env = _mpi_v2(spec, issues)
    fields = _run_policy(spec, issues)
    if "retry_limit" not in fields and any(r.restart_policy in _RESTARTING for r in roles):
        # The training operator without a backoffLimit (PastBackoffLimit: "if
        # BackoffLimit == nil { return false }"): a replica that restarts does so without
        # limit (here a new attempt; a failure a new attempt would repeat still ends it).
        fields["retry_limit"] = RETRY_UNLIMITED
    elastic = kind.name == "PyTorchJob" and _elastic(spec, roles, issues)
    run_mode = fields.pop("run_mode", RunMode.ELASTIC if elastic else RunMode.IMMEDIATE)
    job = JobSpec(
        name=name,
        kind=kind.job_kind,
        user=user,
        run_mode=run_mode,
        roles=roles,
        success_rules=_success(kind, spec, roles, issues),
        image=next((r.image for r in roles if r.image), None),
        namespace=namespace,
        env=env,
        **fields,
    )
    return Translation(
        job,
        DIALECT,
        issues.errors,
        issues.warnings,
        key=key_of(namespace, kind.plural, name) if name else None,
    )


def control_from_patch(current: dict[str, Any], patch: Any) -> Control:
    """What a merge patch of a submitted Kubeflow job asks for: ``runPolicy.suspend``
    true pauses it, false (or removing it) resumes it; a new ``replicas`` of an elastic
    PyTorchJob's Worker (within elasticPolicy's bounds) scales it. Anything else is
    refused, naming the field."""
    if not isinstance(patch, dict):
        return Control(
            errors=[
                FieldIssue(
                    path="$",
                    code="type",
                    message=(f"a merge patch must be a JSON object, not {json_type(patch)}"),
                )
            ]
        )
    patched = merge_patch(current, patch)
    after = translate_kubeflow(patched)
    if after.errors:
        return Control(errors=after.errors)
    kind = KINDS[patched["kind"]]  # the translation has checked it
    changeable = (
        ("spec", "runPolicy", "suspend"),
        *(("spec", kind.replica_key, t, "replicas") for t in kind.types),
    )
    changed = immutable_change(
        current,
        patched,
        changeable,
        "spec.runPolicy.suspend (pause or resume the job) and the replicas of an elastic Worker",
    )
    if changed is not None:
        return Control(errors=[changed])
    control = Control()
    spec_patch = mapping(patch.get("spec"))
    policy = spec_patch.get("runPolicy")
    if isinstance(policy, dict) and "suspend" in policy:
        control.pause = after.spec.run_mode is RunMode.PAUSE
    roles = {r.name: r for r in after.spec.roles}

    def counts(resource: dict[str, Any]) -> dict[str, Any]:
        specs = resource["spec"].get(kind.replica_key)
        return (
            {t: e.get("replicas", 1) for t, e in specs.items() if isinstance(e, dict)}
            if isinstance(specs, dict)
            else {}
        )

    before = counts(current) if isinstance(current.get("spec"), dict) else {}
    for rtype, replicas in counts(patched).items():
        if rtype in roles and replicas != before.get(rtype):
            path = join(join(join("$.spec", kind.replica_key), rtype), "replicas")
            count = elastic_scale(roles[rtype], replicas, path, control.errors)
            if count is not None:
                control.scale[rtype] = count
    return control


def validate_kubeflow(payload: Any, spec: JobSpec) -> list[FieldIssue]:
    return translate_kubeflow(payload, spec.user).errors


def _looks_like(payload: dict[str, Any]) -> bool:
    version = payload.get("apiVersion")
    return isinstance(version, str) and version.startswith(f"{GROUP}/")


def render(kind_plural: str, job_view: dict[str, Any]) -> dict[str, Any]:
    """The resource as submitted with a Kubeflow JobStatus (conditions, replicaStatuses,
    startTime, completionTime) from the canonical job view."""
    view = job_view
    original = mapping(view.get("original"))
    kind = PLURALS.get(kind_plural)
    state = view.get("state")
    created = timestamp(view.get("submitted_at"))
    updated = timestamp(view.get("updated_at")) or created
    finished = timestamp(view.get("finished_at"))
    name = view.get("name") or ""
    label = kind.name if kind else "Job"
    reason = str(view.get("reason") or "")
    conditions = [
        condition("Created", True, f"{label}Created", f"{label} {name} is created.", created)
    ]
    retried = next(
        (
            a
            for a in view.get("attempts") or []
            if isinstance(a, dict)
            and a.get("retried_as") == view.get("attempt")
            and a.get("state") == "FAILED"
            and not a.get("interrupted")
        ),
        None,
    )
    if retried is not None and state in ("QUEUED", "PLACED"):
        # Between a failed attempt and its retry's start: the operator's Restarting, which
        # takes Running's place (filterOutCondition) until the job runs again.
        conditions.append(
            condition(
                "Restarting",
                True,
                f"{label}Restarting",
                str(retried.get("reason") or f"{label} {name} is restarting."),
                updated,
            )
        )
    elif state in ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED"):
        conditions.append(
            condition(
                "Running",
                state == "RUNNING",
                f"{label}Running",
                f"{label} {name} is running.",
                updated,
            )
        )
    if state == "SUCCEEDED":
        conditions.append(
            condition(
                "Succeeded",
                True,
                f"{label}Succeeded",
                reason or f"{label} {name} successfully completed.",
                finished,
            )
        )
    elif state in ("FAILED", "STOPPED", "REJECTED"):
        why = {"FAILED": f"{label}Failed", "STOPPED": f"{label}Stopped", "REJECTED": "Rejected"}[
            state
        ]
        message = rejection_message(view) if state == "REJECTED" else reason
        conditions.append(condition("Failed", True, why, message, finished))
    if is_paused(view):
        conditions.append(
            condition(
                "Suspended", True, f"{label}Suspended", f"{label} {name} is suspended.", updated
            )
        )
    tasks = latest_tasks(view)
    replica_statuses: dict[str, dict[str, int]] = {}
    roles = [r for r in (view.get("spec") or {}).get("roles") or [] if isinstance(r, dict)]
    for role, shown in zip(roles, shown_tasks(roles), strict=True):
        rname = str(role.get("name"))
        counts = {"active": 0, "succeeded": 0, "failed": 0}
        for index in range(shown):
            task_state = (tasks.get((rname, index)) or {}).get("state")
            if task_state in ("STARTING", "RUNNING"):
                counts["active"] += 1
            elif task_state == "SUCCEEDED":
                counts["succeeded"] += 1
            elif task_state == "FAILED":
                counts["failed"] += 1
        replica_statuses[rname] = counts
    status: dict[str, Any] = {"conditions": conditions, "replicaStatuses": replica_statuses}
    # When its first task started: none yet while every task is still being placed or
    # started (their views have no time then), and then startTime is left out.
    started = [
        moment
        for t in tasks.values()
        if t.get("state") not in (None, "PENDING", "STARTING")
        and (moment := timestamp(t.get("started_at") or t.get("updated_at")))
    ]
    if started and state != "REJECTED":
        status["startTime"] = min(started)
    if finished and state in ("SUCCEEDED", "FAILED", "STOPPED"):
        status["completionTime"] = finished
    spec = copy.deepcopy(mapping(original.get("spec")))
    # As the Training Operator defaults every job it stores: runPolicy is always there
    # (clients such as the Kubeflow SDK's models require it).
    if not isinstance(spec.get("runPolicy"), dict):
        spec["runPolicy"] = {}
    return {
        "apiVersion": original.get("apiVersion") or API_VERSION,
        "kind": label if kind else original.get("kind"),
        "metadata": resource_metadata(view, original),
        "spec": spec,
        "status": status,
    }


REGISTRATION = Dialect(
    name=DIALECT,
    signature=f"kubeflow (an object with apiVersion {API_VERSION})",
    looks_like=_looks_like,
    translate=translate_kubeflow,
    field_path=field_path,
    validate=validate_kubeflow,
)
