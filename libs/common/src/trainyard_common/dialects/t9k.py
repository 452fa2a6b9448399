"""TensorStack T9k Jobs (``batch.tensorstack.dev/v1beta1``): the eight kinds to and from
the canonical job, and a stored job shown back as the T9k resource with its status.

The support matrix of run modes per kind is the seed's (t9k-jobs.md "运行模式"); the
fields, defaults and success rules follow T9k's user manual and API reference. Where
T9k's own documentation spells a field two ways (``enable``/``enabled``,
``replicaSpecs``/``replicasSpec``, ``DeepspeedJob``, ``slotPerWorker``, a restartPolicy
string or object, ``template.containers``), both are accepted and the spelling used is
reported as a warning.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any

from ..events import FieldIssue
from ..jobspec import (
    MPIRUN_ARGS_ENV,
    TF_PORT_LABEL,
    EnvVar,
    JobKind,
    JobSpec,
    PortSpec,
    RestartPolicy,
    RoleSpec,
    RunMode,
    TaskRef,
)
from ..limits import digits
from .fields import mapping
from .k8s_pod import (
    DNS_LABEL_RE,
    DNS_LABEL_RULE,
    Control,
    PodTask,
    condition,
    elastic_scale,
    immutable_change,
    is_paused,
    latest_tasks,
    merge_patch,
    pod_template,
    rejection_message,
    resource_metadata,
    restarts,
    shell_command,
    string_list,
    template_field_path,
    timestamp,
    unknown_metadata,
)
from .registry import Dialect
from .translation import (
    INT_MAX,
    ROLE_NAME_RE,
    ROLE_NAME_RULE,
    Issues,
    Translation,
    as_int,
    empty_spec,
    env_problem,
    join,
    json_type,
    show,
    shown_tasks,
)

DIALECT = "t9k"
GROUP = "batch.tensorstack.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

IMMEDIATE, DEBUG, PAUSE, ELASTIC = "immediate", "debug", "pause", "elastic"

# T9k's ExitCode policy restarts a replica only for these exit codes (user manual,
# "重启机制"): 130 Ctrl+C, 137 SIGKILL, 143 SIGTERM, and 138, which a program may use
# to ask for a restart.
RETRYABLE_EXIT_CODES = [130, 137, 138, 143]


@dataclass(frozen=True)
class Kind:
    name: str
    plural: str
    job_kind: JobKind
    # Run modes the seed's matrix allows for this kind.
    modes: frozenset[str]
    # "replicas": spec.replicaSpecs[]; "worker": spec.worker; "beam": spec.jobTemplate.
    layout: str
    # spec fields this kind defines besides the common ones.
    fields: frozenset[str]
    # The training container's name, where the kind picks it by name.
    container: tuple[str, ...] = ()


_ALL = frozenset({IMMEDIATE, DEBUG, PAUSE})
KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "GenericJob",
            "genericjobs",
            JobKind.GENERIC,
            _ALL,
            "replicas",
            frozenset({"successRules", "failureRules", "service", "cleanUpPolicy"}),
        ),
        Kind(
            "PyTorchTrainingJob",
            "pytorchtrainingjobs",
            JobKind.PYTORCH,
            _ALL | {ELASTIC},
            "replicas",
            frozenset({"runPolicy", "elastic", "torchrunConfig", "tensorboardSpec"}),
            ("python",),
        ),
        Kind(
            "TensorFlowTrainingJob",
            "tensorflowtrainingjobs",
            JobKind.TENSORFLOW,
            _ALL,
            "replicas",
            frozenset({"runPolicy", "tensorboardSpec"}),
            ("tensorflow",),
        ),
        Kind(
            "XGBoostTrainingJob",
            "xgboosttrainingjobs",
            JobKind.XGBOOST,
            _ALL,
            "replicas",
            frozenset({"runPolicy"}),
            ("xgboost",),
        ),
        Kind(
            "MPIJob",
            "mpijobs",
            JobKind.MPI,
            _ALL,
            "worker",
            frozenset({"runPolicy", "worker", "mca", "ssh", "mpiHome"}),
            ("mpi-worker",),
        ),
        Kind(
            "ColossalAIJob",
            "colossalaijobs",
            JobKind.COLOSSALAI,
            _ALL,
            "worker",
            frozenset({"runPolicy", "worker", "launcher", "ssh"}),
            ("worker",),
        ),
        Kind(
            "DeepSpeedJob",
            "deepspeedjobs",
            JobKind.DEEPSPEED,
            _ALL | {ELASTIC},
            "worker",
            frozenset({"runPolicy", "worker", "config", "elastic", "disableCustomEnv"}),
            ("worker",),
        ),
        Kind(
            "BeamJob",
            "beamjobs",
            JobKind.BEAM,
            frozenset({IMMEDIATE}),
            "beam",
            frozenset({"runPolicy", "flinkClusterTemplate", "jobTemplate"}),
        ),
    )
}
PLURALS: dict[str, Kind] = {k.plural: k for k in KINDS.values()}
# Replica types of which a job has one: the master that decides its end (TensorFlow's
# cluster spec takes one chief; PyTorch's and XGBoost's rendezvous one master).
SINGLE_TYPES = {
    "TensorFlowTrainingJob": ("chief",),
    "PyTorchTrainingJob": ("master",),
    "XGBoostTrainingJob": ("master",),
}
# Spellings of a kind found in T9k's own documentation.
# torchrunConfig.rdzvBackend: "可以设置为 c10d、etcd 或 etcd-v2".
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")

# runPolicy.backoffLimit when a job leaves it out (T9k's manual: 默认为 3).
DEFAULT_BACKOFF_LIMIT = 3

KIND_SPELLINGS = {"DeepspeedJob": "DeepSpeedJob"}
_COMMON_SPEC = frozenset({"runMode", "scheduler", "replicaSpecs", "replicasSpec"})

# Which spec fields are kept but have no effect in Trainyard, and why.
_NOT_APPLIED = {
    "service": "replicas reach each other by the host and ports Trainyard gives every "
    "task (TRAINYARD_* and PAI_* variables); no Service is created",
    "tensorboardSpec": "Trainyard starts no TensorBoard",
    "ssh": "tasks are started by Trainyard, not over ssh",
    "mpiHome": "tasks run the command directly, not under mpirun",
    "launcher": "no separate launcher replica runs; every worker runs the command",
    "disableCustomEnv": "every task gets its environment directly",
    "flinkClusterTemplate": "Trainyard runs no Flink cluster; the Beam pipeline runs with "
    "the runner its own options name",
}

_RESTART = {p.value: p for p in RestartPolicy}

_JOB_FIELDS = {
    "name": "$.metadata.name",
    "queue": "$.spec.scheduler.t9kScheduler.queue",
    "priority": "$.spec.scheduler.t9kScheduler.priority",
    "retry_limit": "$.spec.runPolicy.backoffLimit",
    "max_running_minutes": "$.spec.runPolicy.activeDeadlineSeconds",
    "roles": "$.spec.replicaSpecs",
}


def _role_location(
    kind: Kind | None, spec: dict[str, Any], role: str
) -> tuple[str, Any, str] | None:
    """(the role's path, its pod template, the template's path) in a T9k spec."""
    if kind is not None and kind.layout == "worker":
        worker = spec.get("worker")
        template = worker.get("template") if isinstance(worker, dict) else None
        return "$.spec.worker", template, "$.spec.worker.template"
    if kind is not None and kind.layout == "beam":
        job = spec.get("jobTemplate")
        job = job.get("spec") if isinstance(job, dict) else None
        template = job.get("template") if isinstance(job, dict) else None
        return "$.spec.jobTemplate", template, "$.spec.jobTemplate.spec.template"
    key = (
        "replicasSpec" if "replicaSpecs" not in spec and "replicasSpec" in spec else "replicaSpecs"
    )
    entries = spec.get(key)
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict) and entry.get("type") == role:
            path = f"$.spec.{key}[{i}]"
            return path, entry.get("template"), f"{path}.template"
    return None


def field_path(payload: Any, role: str | None, field: str) -> str:
    """Where a canonical field is written in a T9k job: a role is its replica spec (by
    type), the worker, or the Beam job template; its resources are read from the
    training container's requests or limits, whichever the figure came from."""
    if role is None:
        return _JOB_FIELDS.get(field, "$.spec")
    payload = payload if isinstance(payload, dict) else {}
    spec = mapping(payload.get("spec"))
    kind_name = payload.get("kind")
    kind = (
        KINDS.get(KIND_SPELLINGS.get(kind_name, kind_name)) if isinstance(kind_name, str) else None
    )
    found = _role_location(kind, spec, role)
    if found is None:
        return "$.spec"
    path, template, template_path = found
    if field == "role":
        return path
    if field == "replicas":
        return join(path, "replicas")
    if field in ("min_replicas", "max_replicas"):
        return _elastic_path(spec, field)
    if field == "name":
        return join(path, "type") if "[" in path else path
    return template_field_path(template, template_path, field, kind.container if kind else ())


def _elastic_path(spec: dict[str, Any], field: str) -> str:
    """Where an elastic bound is written: spec.elastic where the job enables it (read
    last, so it is the one applied), else runMode.elastic."""
    key = "minReplicas" if field == "min_replicas" else "maxReplicas"
    elastic = spec.get("elastic")
    if isinstance(elastic, dict) and (elastic.get("enabled") or elastic.get("enable")):
        return join("$.spec.elastic", key)
    return join("$.spec.runMode.elastic", key)


def key_of(namespace: str, plural: str, name: str) -> str:
    return f"{namespace}/{plural}/{name}"


def t9k_priority(value: int) -> int:
    """T9k's 0-100 priority on Trainyard's 1-9 scale (50, the documented example, is 5)."""
    return 1 + round(value * 8 / 100)


# ------------------------------------------------------------------------ translation


@dataclass
class _Role:
    spec: RoleSpec
    path: str
    limit: int | None = None  # GenericJob restartPolicy.limit
    written: bool = False  # whether the replica writes a restartPolicy of its own


def _enabled(obj: dict[str, Any], path: str, issues: Issues) -> bool:
    """``enabled``, or ``enable`` as parts of T9k's documentation write it."""
    key = "enabled"
    if "enabled" not in obj and "enable" in obj:
        key = "enable"
        issues.warn(
            join(path, "enable"),
            "'enable' is read as 'enabled' (the API field's "
            "name; parts of T9k's documentation write 'enable')",
            "spelling",
        )
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        issues.error(join(path, key), f"{key} must be a boolean, not {json_type(value)}", "type")
        return False
    return value


def _restart_policy(
    raw: Any, path: str, kind: Kind, issues: Issues, pod_policy: str | None, pod_path: str
) -> tuple[RestartPolicy, int | None]:
    if raw is None and pod_policy is not None:
        # T9k overrides the pod's own policy; its DeepSpeed and ColossalAI examples still
        # set only that one, so it is taken as the replica's policy.
        issues.warn(
            pod_path,
            "the pod template's restartPolicy is used as the replica's "
            "restartPolicy (T9k sets pods to Never and restarts replicas itself)",
            "spelling",
        )
        raw, path = pod_policy, pod_path
    if raw is None:
        return RestartPolicy.ON_FAILURE, None  # T9k's default for every kind
    limit: int | None = None
    if isinstance(raw, dict):
        if kind.name != "GenericJob":
            issues.warn(
                path,
                f"restartPolicy is written as an object {{policy, limit}} "
                f"(GenericJob's form); {kind.name} documents a string",
                "spelling",
            )
        policy = raw.get("policy")
        limit = issues.integer(raw, "limit", path, required=False, minimum=0)
        for key in sorted(k for k in raw if k not in ("policy", "limit")):
            issues.warn(
                join(path, key),
                f"unknown restartPolicy field {show(key)} is ignored",
                "unknown_field",
            )
        ppath = join(path, "policy")
    elif isinstance(raw, str):
        if kind.name == "GenericJob":
            issues.warn(
                path,
                "restartPolicy is written as a string; GenericJob documents "
                "an object {policy, limit}",
                "spelling",
            )
        policy, ppath = raw, path
    else:
        issues.error(
            path,
            f"restartPolicy must be a string or an object {{policy, limit}}, not {json_type(raw)}",
            "type",
        )
        return RestartPolicy.ON_FAILURE, None
    if policy is None:
        issues.error(
            ppath,
            "restartPolicy.policy is required (Never, OnFailure, Always or ExitCode)",
            "required",
        )
        return RestartPolicy.ON_FAILURE, limit
    if not isinstance(policy, str) or policy not in _RESTART:
        issues.error(
            ppath,
            f"restartPolicy {show(policy)} must be one of Never, OnFailure, Always, ExitCode",
            "enum",
        )
        return RestartPolicy.ON_FAILURE, limit
    return _RESTART[policy], limit


def _command(pod: PodTask, kind: Kind, spec: dict[str, Any], issues: Issues) -> str:
    """The task's shell command: the kind's own launch fields where it has them, else
    the container's command and args."""
    argv = pod.argv
    if kind.name == "PyTorchTrainingJob":
        torchrun = spec.get("torchrunConfig")
        if isinstance(torchrun, dict) and _enabled(torchrun, "$.spec.torchrunConfig", issues):
            return shell_command(_torchrun(torchrun, pod, issues))
    if not pod.container_path:
        return ""  # the template itself is missing or broken, and said so
    # The container runs as Kubernetes runs it (its command replaces the image's
    # entrypoint, its args alone keep it): _role_spec keeps the argv for the backend.
    return shell_command(argv)


def _torchrun(config: dict[str, Any], pod: PodTask, issues: Issues) -> list[str]:
    # T9k runs `torchrun <options> <args>` and ignores the container's command.
    path = "$.spec.torchrunConfig"
    argv = ["torchrun"]
    # "除了可以指定一个数字字符串之外，还可以设置为 gpu" (a number, or the replica's GPUs).
    procs = config.get("procPerNode", "1")
    if procs == "gpu":
        procs = str(int(pod.resources.gpu) or 1)
    elif isinstance(procs, int) and not isinstance(procs, bool) and 1 <= procs <= INT_MAX:
        procs = str(procs)
    elif not (isinstance(procs, str) and digits(procs) and 1 <= int(procs) <= INT_MAX):
        issues.error(
            join(path, "procPerNode"),
            f'procPerNode {show(procs)} must be a number of processes ("2", at most '
            f'{INT_MAX}) or "gpu"',
            "invalid",
        )
        procs = "1"
    argv.append(f"--nproc_per_node={procs}")
    restarts_ = issues.integer(config, "maxRestarts", path, required=False, minimum=0)
    if restarts_ is not None:
        argv.append(f"--max_restarts={restarts_}")
    backend = config.get("rdzvBackend")
    if backend in RDZV_BACKENDS:
        argv.append(f"--rdzv_backend={backend}")
        if backend == "c10d":
            # c10d needs an endpoint every agent reaches: without one each meets at its
            # own localhost:29400. The launcher gives every torch task the first
            # replica's address; an --rdzv_endpoint in extraOptions, later on the
            # line, still wins. The agent on that address hosts the store (torch's
            # own rule; on one machine the first to bind it, the others connect).
            argv.append("--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)")
    elif backend not in (None, ""):
        issues.error(
            join(path, "rdzvBackend"),
            f"rdzvBackend {show(backend)} must be one of {', '.join(RDZV_BACKENDS)}",
            "enum",
        )
    argv += string_list(config, "extraOptions", path, issues)
    for key in sorted(
        k
        for k in config
        if k
        not in ("enabled", "enable", "procPerNode", "maxRestarts", "rdzvBackend", "extraOptions")
    ):
        issues.warn(
            join(path, key),
            f"torchrunConfig.{key} is kept but not passed to torchrun",
            "not_applied",
        )
    if not pod.args:
        issues.error(
            join(pod.container_path, "args"),
            "with torchrunConfig enabled the "
            "training script and its arguments come from args, which is empty",
            "required",
        )
    return argv + pod.args


def _deepspeed_command(spec: dict[str, Any], pod: PodTask, issues: Issues) -> str | None:
    config = spec.get("config")
    if config is None:
        return None
    path = "$.spec.config"
    if not isinstance(config, dict):
        issues.error(path, f"config must be an object, not {json_type(config)}", "type")
        return None
    if "slotPerWorker" in config and "slotsPerWorker" not in config:
        issues.warn(
            join(path, "slotPerWorker"),
            "'slotPerWorker' is read as "
            "'slotsPerWorker' (the API field; T9k's example writes slotPerWorker)",
            "spelling",
        )
    for key in ("slotsPerWorker", "slotPerWorker", "localRank", "autotune", "otherArgs"):
        if key in config:
            issues.warn(
                join(path, key),
                f"config.{key} is kept but not applied: each "
                "worker runs the program once, without the deepspeed launcher",
                "not_applied",
            )
    custom = config.get("customCommand")
    if custom is not None:
        if not isinstance(custom, str) or not custom.strip():
            issues.error(
                join(path, "customCommand"), "customCommand must be a non-empty string", "type"
            )
            return ""
        return custom
    run = config.get("run")
    if run is None:
        return None
    rpath = join(path, "run")
    if not isinstance(run, dict):
        issues.error(rpath, f"run must be an object, not {json_type(run)}", "type")
        return ""
    given = [k for k in ("python", "module", "exec") if k in run]
    if len(given) != 1:
        issues.error(
            rpath,
            f"run needs exactly one of python, module or exec, got {', '.join(given) or 'none'}",
            "invalid",
        )
        return ""
    words = run[given[0]]
    if isinstance(words, str):
        # T9k's DeepSpeedJob example writes run.python as one string, not a list.
        issues.warn(
            join(rpath, given[0]),
            f"run.{given[0]} is a string; it is read as a "
            "one-item list (the API field is a list of strings)",
            "spelling",
        )
        words = [words] if words.strip() else []
    else:
        words = string_list(run, given[0], rpath, issues)
    if not words:
        issues.error(join(rpath, given[0]), f"run.{given[0]} must name what to run", "required")
        return ""
    prefix = {"python": ["python"], "module": ["python", "-m"], "exec": []}[given[0]]
    return shell_command(prefix + words)


def _replica_roles(kind: Kind, spec: dict[str, Any], issues: Issues) -> list[_Role]:
    key = "replicaSpecs"
    if "replicaSpecs" not in spec and "replicasSpec" in spec:
        key = "replicasSpec"
        issues.warn(
            "$.spec.replicasSpec",
            "'replicasSpec' is read as 'replicaSpecs' (the API field's name)",
            "spelling",
        )
    path = join("$.spec", key)
    tf = kind.job_kind is JobKind.TENSORFLOW
    raw = spec.get(key)
    if raw is None:
        issues.error(
            "$.spec.replicaSpecs",
            "replicaSpecs is required (a list with at least one replica spec)",
            "required",
        )
        return []
    if not isinstance(raw, list) or not raw:
        issues.error(
            path,
            "replicaSpecs must be a non-empty list",
            "type" if not isinstance(raw, list) else "required",
        )
        return []
    roles: list[_Role] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        rpath = f"{path}[{i}]"
        if not isinstance(entry, dict):
            issues.error(rpath, f"a replica spec must be an object, not {json_type(entry)}", "type")
            continue
        rtype = issues.string(
            entry, "type", rpath, required=True, pattern=ROLE_NAME_RE, rule=ROLE_NAME_RULE
        )
        if rtype is not None:
            if rtype in seen:
                issues.error(
                    join(rpath, "type"),
                    f"type {show(rtype)} is already used by "
                    f"{key}[{seen[rtype]}]; replica types must be unique",
                    "duplicate",
                )
            else:
                seen[rtype] = i
        if (
            kind.name == "TensorFlowTrainingJob"
            and rtype is not None
            and rtype not in ("chief", "worker", "ps", "evaluator")
        ):
            issues.error(
                join(rpath, "type"),
                f"type {show(rtype)} must be one of chief, worker, ps, evaluator",
                "enum",
            )
        if (
            kind.name == "XGBoostTrainingJob"
            and rtype is not None
            and rtype not in ("master", "worker")
        ):
            issues.error(
                join(rpath, "type"), f"type {show(rtype)} must be master or worker", "enum"
            )
        replicas = issues.integer(entry, "replicas", rpath, required=False, minimum=1)
        if replicas is not None and replicas > 1 and rtype in SINGLE_TYPES.get(kind.name, ()):
            issues.error(
                join(rpath, "replicas"),
                f"a {kind.name} has one {rtype} (its master), not {replicas}",
                "range",
            )
        pod = pod_template(
            entry.get("template"),
            join(rpath, "template"),
            issues,
            preferred=kind.container,
            owner=f"replica type {show(rtype)}",
        )
        policy, limit = _restart_policy(
            entry.get("restartPolicy"),
            join(rpath, "restartPolicy"),
            kind,
            issues,
            pod.restart_policy,
            f"{rpath}.template.spec.restartPolicy",
        )
        if "scalingWeight" in entry:
            issues.warn(
                join(rpath, "scalingWeight"),
                "scalingWeight is kept but not "
                "applied: elastic roles scale between their own bounds",
                "not_applied",
            )
        for extra in sorted(
            k
            for k in entry
            if k not in ("type", "replicas", "template", "restartPolicy", "scalingWeight")
        ):
            issues.warn(
                join(rpath, extra),
                f"unknown replica spec field {show(extra)} is kept but not used",
                "unknown_field",
            )
        command = _command(pod, kind, spec, issues)
        _substitutions(pod, issues)
        roles.append(
            _Role(
                _role_spec(rtype or "", replicas or 1, pod, command, policy, tf_port=tf),
                rpath,
                limit,
                written=entry.get("restartPolicy") is not None or pod.restart_policy is not None,
            )
        )
    return roles


def _substitutions(pod: PodTask, issues: Issues) -> None:
    words = [*pod.argv, *(e.value for e in pod.env)]
    if pod.container_path and any("$(" in w for w in words):
        issues.warn(
            pod.container_path,
            "T9k's variable substitution ($(type), $(rank), "
            "$(replicas[...]), $(service...)) is not performed; Trainyard gives "
            "each task TRAINYARD_ROLE, TRAINYARD_INDEX and the PAI_* variables "
            "instead",
            "not_applied",
        )


def _role_spec(
    name: str,
    replicas: int,
    pod: PodTask,
    command: str,
    policy: RestartPolicy,
    *,
    tf_port: bool = False,
) -> RoleSpec:
    # Where the command is the container's own argv, the role keeps it as a container's
    # command and args; a command the kind builds (torchrun, mpirun) is a shell line.
    container = pod.container_path and command == shell_command(pod.argv)
    return RoleSpec(
        name=name,
        replicas=replicas,
        resources=pod.resources,
        image=pod.image,
        image_pull_policy=pod.image_pull_policy,
        command=command,
        entrypoint=(pod.command or None) if container else None,
        args=pod.args if container else None,
        annotations=pod.annotations,
        volumes=pod.volumes,
        env=pod.env,
        restart_policy=policy,
        node_selector=pod.node_selector,
        retryable_exit_codes=list(RETRYABLE_EXIT_CODES)
        if policy is RestartPolicy.EXIT_CODE
        else [],
        # Every replica of a TensorFlowTrainingJob gets TF_CONFIG: a port of its own.
        ports=[PortSpec(label=TF_PORT_LABEL)] if tf_port else [],
    )


def _worker_role(kind: Kind, spec: dict[str, Any], issues: Issues) -> list[_Role]:
    path = "$.spec.worker"
    worker = spec.get("worker")
    if worker is None:
        issues.error(
            path,
            f"worker is required: a {kind.name} runs its replicas from spec.worker",
            "required",
        )
        return []
    if not isinstance(worker, dict):
        issues.error(path, f"worker must be an object, not {json_type(worker)}", "type")
        return []
    replicas = issues.integer(worker, "replicas", path, required=False, minimum=1)
    pod = pod_template(
        worker.get("template"),
        join(path, "template"),
        issues,
        preferred=kind.container,
        owner="the worker",
    )
    policy, limit = _restart_policy(
        worker.get("restartPolicy"),
        join(path, "restartPolicy"),
        kind,
        issues,
        pod.restart_policy,
        f"{path}.template.spec.restartPolicy",
    )
    known = {"replicas", "template", "restartPolicy"}
    command: str | None = None
    mpi_env: list[EnvVar] = []
    if kind.name == "MPIJob":
        known |= {"cmd", "extraMPIArgs"}
        cmd = string_list(worker, "cmd", path, issues)
        # Worker 0 runs cmd under mpirun across the workers (the launcher's MPI layout):
        # extra arguments go on that mpirun line, MCA parameters into the environment
        # Open MPI reads them from.
        mpi_env.extend(_mca_env(spec.get("mca"), "$.spec.mca", issues))
        extra_args = string_list(worker, "extraMPIArgs", path, issues)
        for index, arg in enumerate(extra_args):
            # They reach mpirun through a variable: a NUL would end it there.
            if "\0" in arg:
                issues.error(
                    f"{join(path, 'extraMPIArgs')}[{index}]",
                    "an mpirun argument must not hold a NUL character",
                )
        if extra_args:
            mpi_env.append(EnvVar(name=MPIRUN_ARGS_ENV, value=shlex.join(extra_args)))
        if cmd:
            command = shell_command(cmd)
        elif "cmd" not in worker:
            issues.error(
                join(path, "cmd"), "cmd is required: the MPI program every worker runs", "required"
            )
            command = ""
    elif kind.name == "ColossalAIJob":
        known |= {"command", "procPerWorker", "torchArgs"}
        script = string_list(worker, "command", path, issues)
        procs = issues.integer(worker, "procPerWorker", path, required=False, minimum=1)
        torch_args = string_list(worker, "torchArgs", path, issues)
        if script:
            # ColossalAI's launcher starts the script under torchrun on every worker.
            command = shell_command(
                ["torchrun", f"--nproc_per_node={procs or 1}", *torch_args, *script]
            )
        else:
            issues.error(
                join(path, "command"),
                "command is required: the training script and its arguments",
                "required",
            )
            command = ""
    elif kind.name == "DeepSpeedJob":
        command = _deepspeed_command(spec, pod, issues)
    for extra in sorted(k for k in worker if k not in known):
        issues.warn(
            join(path, extra),
            f"unknown worker field {show(extra)} is kept but not used",
            "unknown_field",
        )
    if command is None:
        command = _command(pod, kind, spec, issues)
    elif pod.argv:
        issues.warn(
            pod.container_path,
            f"the container's command and args are not run: "
            f"{kind.name} workers run the command its spec gives",
            "not_applied",
        )
    role = _role_spec("worker", replicas or 1, pod, command, policy)
    if mpi_env:
        role = role.model_copy(update={"env": [*role.env, *mpi_env]})
    return [_Role(role, path, limit)]


def _mca_env(mca: Any, path: str, issues: Issues) -> list[EnvVar]:
    """T9k's ``spec.mca`` map as the ``OMPI_MCA_<name>`` variables Open MPI reads."""
    if mca is None:
        return []
    if not isinstance(mca, dict):
        issues.error(
            path,
            f"mca must be a map of MCA parameter names to values, not {json_type(mca)}",
            "type",
        )
        return []
    env = []
    for name, value in mca.items():
        if not isinstance(value, str | int | float):
            issues.error(
                join(path, str(name)),
                f"an MCA parameter's value must be a string or a number, not {json_type(value)}",
                "type",
            )
            continue
        var = EnvVar(name=f"OMPI_MCA_{name}", value=str(value))
        if problem := env_problem(var.name, var.value):
            issues.error(join(path, str(name)), problem)
            continue
        env.append(var)
    return env


def _beam_role(kind: Kind, spec: dict[str, Any], issues: Issues) -> list[_Role]:
    path = "$.spec.jobTemplate"
    template = spec.get("jobTemplate")
    if not isinstance(template, dict):
        issues.error(
            path,
            "jobTemplate is required (a batch/v1 JobTemplateSpec whose pod "
            "submits the Beam pipeline)"
            if template is None
            else f"jobTemplate must be an object, not {json_type(template)}",
            "required" if template is None else "type",
        )
        return []
    job = template.get("spec")
    jpath = join(path, "spec")
    if not isinstance(job, dict):
        issues.error(
            jpath, "jobTemplate.spec is required (an object with a pod template)", "required"
        )
        return []
    for extra in sorted(k for k in job if k != "template"):
        issues.warn(
            join(jpath, extra),
            f"batch/v1 Job field {show(extra)} is kept but not applied",
            "not_applied",
        )
    pod = pod_template(
        job.get("template"), join(jpath, "template"), issues, owner="the Beam submit job"
    )
    policy, _ = _restart_policy(
        None, "", kind, issues, pod.restart_policy, f"{jpath}.template.spec.restartPolicy"
    )
    command = _command(pod, kind, spec, issues)
    return [_Role(_role_spec("job", 1, pod, command, policy), path)]


def _run_policy(kind: Kind, spec: dict[str, Any], issues: Issues) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if kind.name == "GenericJob":
        # GenericJob has no runPolicy: its clean-up policy is a spec field.
        policy = spec.get("cleanUpPolicy")
        if policy is not None:
            out["cleanup_policy"] = _cleanup(policy, "$.spec.cleanUpPolicy", issues)
        return out
    # backoffLimit: restarts all replicas share; its default (3) is set by the caller,
    # after a replica's restartPolicy.limit has had its say.
    raw = spec.get("runPolicy")
    path = "$.spec.runPolicy"
    if raw is None:
        return out
    if not isinstance(raw, dict):
        issues.error(path, f"runPolicy must be an object, not {json_type(raw)}", "type")
        return out
    known = {
        "backoffLimit",
        "activeDeadlineSeconds",
        "cleanUpPolicy",
        "cleanUpWorkers",
        "cleanUpCluster",
    }
    backoff = issues.integer(raw, "backoffLimit", path, required=False, minimum=0)
    if backoff is not None:
        out["retry_limit"] = backoff
    deadline = issues.integer(raw, "activeDeadlineSeconds", path, required=False, minimum=1)
    if deadline is not None:
        out["max_running_minutes"] = math.ceil(deadline / 60)
    if "cleanUpPolicy" in raw:
        out["cleanup_policy"] = _cleanup(raw["cleanUpPolicy"], join(path, "cleanUpPolicy"), issues)
    for flag in ("cleanUpWorkers", "cleanUpCluster"):
        if flag in raw:
            value = raw[flag]
            if not isinstance(value, bool):
                issues.error(join(path, flag), f"{flag} must be a boolean", "type")
            else:
                out["cleanup_policy"] = "All" if value else "None"
    for extra in sorted(k for k in raw if k not in known):
        issues.warn(
            join(path, extra),
            f"unknown runPolicy field {show(extra)} is kept but not used",
            "unknown_field",
        )
    return out


def _cleanup(value: Any, path: str, issues: Issues) -> str | None:
    if value not in ("None", "All", "Unfinished"):
        issues.error(
            path, f"cleanUpPolicy {show(value)} must be one of None, All, Unfinished", "enum"
        )
        return None
    return str(value)


def _scheduler(spec: dict[str, Any], issues: Issues) -> dict[str, Any]:
    raw = spec.get("scheduler")
    path = "$.spec.scheduler"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        issues.error(path, f"scheduler must be an object, not {json_type(raw)}", "type")
        return {}
    for extra in sorted(k for k in raw if k != "t9kScheduler"):
        issues.warn(
            join(path, extra),
            f"scheduler {show(extra)} is kept but not used: "
            "Trainyard's placement schedules every job",
            "unknown_field",
        )
    t9k = raw.get("t9kScheduler")
    tpath = join(path, "t9kScheduler")
    if t9k is None:
        return {}
    if not isinstance(t9k, dict):
        issues.error(tpath, f"t9kScheduler must be an object, not {json_type(t9k)}", "type")
        return {}
    out: dict[str, Any] = {}
    queue = issues.string(t9k, "queue", tpath, required=False, non_blank=True)
    if queue is not None:
        out["queue"] = queue
    priority = issues.integer(t9k, "priority", tpath, required=False, minimum=0, maximum=100)
    if priority is not None:
        out["priority"] = t9k_priority(priority)
    for extra in sorted(k for k in t9k if k not in ("queue", "priority")):
        issues.warn(
            join(tpath, extra),
            f"unknown t9kScheduler field {show(extra)} is kept but not used",
            "unknown_field",
        )
    return out


def _mode_specs(entries: Any, path: str, types: set[str], item: str, issues: Issues) -> None:
    """Check debug replicaSpecs / pause resumeSpecs; they are kept with the job."""
    if entries is None:
        return
    if not isinstance(entries, list):
        issues.error(path, f"{item} must be a list, not {json_type(entries)}", "type")
        return
    for i, entry in enumerate(entries):
        epath = f"{path}[{i}]"
        if not isinstance(entry, dict):
            issues.error(epath, f"a {item} entry must be an object", "type")
            continue
        rtype = issues.string(entry, "type", epath, required=True)
        if rtype is not None and types and rtype not in types:
            issues.error(
                join(epath, "type"),
                f"type {show(rtype)} is not a replica type of "
                f"this job ({', '.join(sorted(types))})",
                "unknown_reference",
            )
        string_list(entry, "command", epath, issues)
        string_list(entry, "args", epath, issues)
        if "skipInitContainer" in entry and not isinstance(entry["skipInitContainer"], bool):
            issues.error(
                join(epath, "skipInitContainer"), "skipInitContainer must be a boolean", "type"
            )


def _elastic(raw: Any, path: str, issues: Issues) -> tuple[bool, dict[str, int]]:
    if not isinstance(raw, dict):
        issues.error(path, f"elastic must be an object, not {json_type(raw)}", "type")
        return False, {}
    on = _enabled(raw, path, issues)
    lo = issues.integer(raw, "minReplicas", path, required=on, minimum=1)
    hi = issues.integer(raw, "maxReplicas", path, required=on, minimum=1)
    want = issues.integer(raw, "expectedReplicas", path, required=False, minimum=1)
    for extra in sorted(
        k
        for k in raw
        if k not in ("enabled", "enable", "minReplicas", "maxReplicas", "expectedReplicas")
    ):
        issues.warn(
            join(path, extra), f"unknown elastic field {show(extra)} is ignored", "unknown_field"
        )
    if not on or lo is None or hi is None:
        return on, {}
    if lo > hi:
        issues.error(
            join(path, "minReplicas"),
            f"minReplicas ({lo}) must not exceed maxReplicas ({hi})",
            "range",
        )
        return on, {}
    if want is not None and not lo <= want <= hi:
        issues.error(
            join(path, "expectedReplicas"),
            f"expectedReplicas ({want}) must lie between minReplicas ({lo}) and maxReplicas ({hi})",
            "range",
        )
        return on, {}
    return on, {"min_replicas": lo, "max_replicas": hi, "replicas": want or lo}


def _run_mode(
    kind: Kind, spec: dict[str, Any], types: set[str], issues: Issues
) -> tuple[RunMode, dict[str, int]]:
    """The run mode, enforcing the seed's matrix, and the elastic bounds if any."""
    enabled: list[tuple[str, str]] = []
    bounds: dict[str, int] = {}
    raw = spec.get("runMode")
    path = "$.spec.runMode"
    if raw is not None and not isinstance(raw, dict):
        issues.error(path, f"runMode must be an object, not {json_type(raw)}", "type")
        raw = None
    for mode, value in (raw or {}).items():
        mpath = join(path, str(mode))
        if mode not in (DEBUG, PAUSE, ELASTIC):
            issues.error(
                mpath,
                f"unknown run mode {show(mode)}; T9k's are debug, pause and "
                "elastic (immediate is the default)",
                "enum",
            )
            continue
        if mode == ELASTIC:
            on, found = _elastic(value, mpath, issues)
            bounds = found or bounds
        elif not isinstance(value, dict):
            issues.error(mpath, f"runMode.{mode} must be an object, not {json_type(value)}", "type")
            continue
        else:
            on = _enabled(value, mpath, issues)
            if mode == DEBUG:
                _mode_specs(
                    value.get("replicaSpecs"),
                    join(mpath, "replicaSpecs"),
                    types,
                    "replicaSpecs",
                    issues,
                )
                if value.get("replicaSpecs"):
                    issues.warn(
                        join(mpath, "replicaSpecs"),
                        "debug replicaSpecs are kept "
                        "with the job; Trainyard's debug mode starts the roles "
                        "without running their commands",
                        "not_applied",
                    )
            else:
                _mode_specs(
                    value.get("resumeSpecs"),
                    join(mpath, "resumeSpecs"),
                    types,
                    "resumeSpecs",
                    issues,
                )
                if value.get("resumeSpecs"):
                    issues.warn(
                        join(mpath, "resumeSpecs"),
                        "resumeSpecs are kept with the job; Trainyard resumes the "
                        "replicas with their own commands",
                        "not_applied",
                    )
            for extra in sorted(
                k for k in value if k not in ("enabled", "enable", "replicaSpecs", "resumeSpecs")
            ):
                issues.warn(
                    join(mpath, extra),
                    f"unknown runMode.{mode} field {show(extra)} is ignored",
                    "unknown_field",
                )
        if on:
            enabled.append((mode, mpath))
        elif mode not in kind.modes:
            issues.warn(
                mpath,
                f"runMode.{mode} is not supported by {kind.name}; it is "
                "disabled here, so it is ignored",
                "unsupported_mode",
            )
    if "elastic" in spec and "elastic" in kind.fields:
        # PyTorchTrainingJob and DeepSpeedJob write elastic training as spec.elastic.
        on, found = _elastic(spec["elastic"], "$.spec.elastic", issues)
        bounds = found or bounds
        if on:
            enabled.append((ELASTIC, "$.spec.elastic"))
    for mode, mpath in enabled:
        if mode not in kind.modes:
            supported = ", ".join(m for m in (IMMEDIATE, DEBUG, PAUSE, ELASTIC) if m in kind.modes)
            issues.error(
                mpath,
                f"$.spec.runMode.{mode}: {kind.name} does not support the "
                f"{mode} run mode (it supports: {supported})",
                "unsupported_mode",
            )
    modes = {mode for mode, _ in enabled}
    if DEBUG in modes and PAUSE in modes:
        issues.error(path, "debug and pause cannot both be enabled", "conflict")
    if PAUSE in modes:
        return RunMode.PAUSE, bounds
    if DEBUG in modes:
        return RunMode.DEBUG, bounds
    if ELASTIC in modes:
        return RunMode.ELASTIC, bounds
    return RunMode.IMMEDIATE, {}


def _rules(raw: Any, path: str, roles: dict[str, int], issues: Issues) -> list[list[TaskRef]]:
    """GenericJob successRules / failureRules: a list of {type: [index, ...]}."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.error(
            path, f"{path.rsplit('.', 1)[-1]} must be a list of objects {{type: [indices]}}", "type"
        )
        return []
    rules: list[list[TaskRef]] = []
    for i, rule in enumerate(raw):
        rpath = f"{path}[{i}]"
        if not isinstance(rule, dict) or not rule:
            issues.error(rpath, "a rule must be a non-empty object {type: [indices]}", "type")
            continue
        refs: list[TaskRef] = []
        for rtype, indices in rule.items():
            tpath = join(rpath, str(rtype))
            if rtype not in roles:
                issues.error(
                    tpath,
                    f"replica type {show(rtype)} is not in replicaSpecs "
                    f"({', '.join(sorted(roles)) or 'none'})",
                    "unknown_reference",
                )
                continue
            if not isinstance(indices, list) or not indices:
                issues.error(tpath, "a rule lists the replica indices as a non-empty list", "type")
                continue
            for j, index in enumerate(indices):
                number = as_int(index)
                if number is None or not 0 <= number < roles[rtype]:
                    issues.error(
                        f"{tpath}[{j}]",
                        f"index {show(index)} must be an integer "
                        f"from 0 to {roles[rtype] - 1} ({rtype} has "
                        f"{roles[rtype]} replica(s))",
                        "range",
                    )
                    continue
                refs.append(TaskRef(role=str(rtype), index=number))
        if refs:
            rules.append(refs)
    return rules


def _metadata(payload: dict[str, Any], issues: Issues) -> tuple[str, str]:
    meta = payload.get("metadata")
    if not isinstance(meta, dict):
        issues.error(
            "$.metadata",
            "metadata is required (an object with a name)"
            if meta is None
            else f"metadata must be an object, not {json_type(meta)}",
            "required" if meta is None else "type",
        )
        return "", "default"
    name = issues.string(
        meta, "name", "$.metadata", required=True, pattern=DNS_LABEL_RE, rule=DNS_LABEL_RULE
    )
    namespace = issues.string(
        meta, "namespace", "$.metadata", required=False, pattern=DNS_LABEL_RE, rule=DNS_LABEL_RULE
    )
    unknown_metadata(meta, issues)
    return name or "", namespace or "default"


def check_kind(payload: dict[str, Any], issues: Issues) -> Kind | None:
    version = payload.get("apiVersion")
    if version != API_VERSION:
        issues.error(
            "$.apiVersion",
            f"apiVersion must be {API_VERSION!r}, got {show(version)}"
            if version is not None
            else f"apiVersion is required ({API_VERSION!r})",
            "invalid" if version is not None else "required",
        )
    kind_name = payload.get("kind")
    if isinstance(kind_name, str) and kind_name in KIND_SPELLINGS:
        issues.warn(
            "$.kind",
            f"kind {kind_name!r} is read as "
            f"{KIND_SPELLINGS[kind_name]!r} (T9k's documentation writes both)",
            "spelling",
        )
        kind_name = KIND_SPELLINGS[kind_name]
    kind = KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        issues.error(
            "$.kind",
            f"kind {show(kind_name)} is not a T9k job kind; kinds: {', '.join(KINDS)}"
            if kind_name is not None
            else f"kind is required (one of {', '.join(KINDS)})",
            "enum" if kind_name is not None else "required",
        )
    return kind


def translate_t9k(payload: Any, user: str = "") -> Translation:
    """Any input to a JobSpec plus the problems found; never raises."""
    issues = Issues()
    if not isinstance(payload, dict):
        issues.error("$", f"a T9k job must be an object, not {json_type(payload)}", "type")
        return Translation(empty_spec(user=user), DIALECT, issues.errors, issues.warnings)
    kind = check_kind(payload, issues)
    name, namespace = _metadata(payload, issues)
    for extra in sorted(
        k for k in payload if k not in ("apiVersion", "kind", "metadata", "spec", "status")
    ):
        issues.warn(join("$", extra), f"unknown field {show(extra)} is ignored", "unknown_field")
    spec = payload.get("spec")
    if not isinstance(spec, dict):
        issues.error(
            "$.spec",
            "spec is required (an object)"
            if spec is None
            else f"spec must be an object, not {json_type(spec)}",
            "required" if spec is None else "type",
        )
        spec = None
    if kind is None or spec is None:
        key = key_of(namespace, kind.plural, name) if kind and name else None
        return Translation(empty_spec(name, user), DIALECT, issues.errors, issues.warnings, key=key)

    for extra in sorted(k for k in spec if k not in _COMMON_SPEC | kind.fields):
        issues.warn(
            join("$.spec", extra),
            f"{extra} is not a field of {kind.name}; it is kept but not used",
            "unknown_field",
        )
    for field_name, why in _NOT_APPLIED.items():
        if field_name in spec and field_name in kind.fields:
            issues.warn(
                join("$.spec", field_name),
                f"{field_name} is kept but not applied: {why}",
                "not_applied",
            )

    if kind.layout == "replicas":
        roles = _replica_roles(kind, spec, issues)
    elif kind.layout == "worker":
        roles = _worker_role(kind, spec, issues)
    else:
        roles = _beam_role(kind, spec, issues)
    counts = {r.spec.name: r.spec.replicas for r in roles if r.spec.name}
    run_mode, bounds = _run_mode(kind, spec, set(counts), issues)
    if bounds:
        for role in roles:
            role.spec = role.spec.model_copy(update=bounds)
        counts = {r.spec.name: r.spec.replicas for r in roles if r.spec.name}

    fields: dict[str, Any] = {**_run_policy(kind, spec, issues), **_scheduler(spec, issues)}
    limits = [r.limit for r in roles if r.limit is not None]
    if limits and "retry_limit" not in fields:
        # GenericJob limits restarts per replica type; Trainyard counts one limit per
        # job, so the largest one stands for all.
        fields["retry_limit"] = max(limits)
        if len(set(limits)) > 1:
            issues.warn(
                "$.spec.replicaSpecs",
                f"restartPolicy limits differ per replica "
                f"type ({', '.join(map(str, limits))}); the job's retry limit is "
                f"the largest, {max(limits)}",
                "not_applied",
            )
    if kind.name != "GenericJob":
        # "spec.runPolicy.backoffLimit 字段（默认为 3）".
        fields.setdefault("retry_limit", DEFAULT_BACKOFF_LIMIT)
    elif not limits:
        # GenericJob's manual names limit "the most restarts" and gives it no default:
        # none written, none made (said where a replica asks to be restarted).
        for role in roles:
            if role.written and role.spec.restart_policy is not RestartPolicy.NEVER:
                issues.warn(
                    join(role.path, "restartPolicy"),
                    f"restartPolicy {role.spec.restart_policy.value} without a limit: "
                    "restartPolicy.limit is the most restarts, and none is given, so the "
                    "replica is not restarted",
                    "not_applied",
                )

    success: list[list[TaskRef]] = []
    failure: list[list[TaskRef]] = []
    role_specs = [r.spec for r in roles]
    if kind.name == "GenericJob":
        success = _rules(spec.get("successRules"), "$.spec.successRules", counts, issues)
        failure = _rules(spec.get("failureRules"), "$.spec.failureRules", counts, issues)
        if failure:
            # With failureRules only those rules fail the job, as in T9k.
            role_specs = [r.model_copy(update={"min_failed": None}) for r in role_specs]
    elif role_specs and kind.name == "XGBoostTrainingJob" and "master" not in counts:
        issues.error(
            "$.spec.replicaSpecs",
            "an XGBoostTrainingJob needs a replica spec of type master",
            "required",
        )
    else:
        success = _default_success(kind, role_specs)
        never = {r.name for r in role_specs if r.restart_policy is RestartPolicy.NEVER}
        if success and never:
            # The master decides failure too (T9k's manual, "成功和失败"): a replica that is
            # never restarted fails the job only when it is the master. One that restarts
            # still ends the attempt, which is how Trainyard restarts it.
            [[master]] = success
            role_specs = [
                r.model_copy(update={"min_failed": None}) if r.name in never else r
                for r in role_specs
            ]
            if master.role in never:
                failure = [[master]]

    job = JobSpec(
        name=name,
        kind=kind.job_kind,
        user=user,
        run_mode=run_mode,
        roles=role_specs,
        success_rules=success,
        failure_rules=failure,
        image=next((r.image for r in role_specs if r.image), None),
        namespace=namespace,
        **fields,
    )
    return Translation(
        job,
        DIALECT,
        issues.errors,
        issues.warnings,
        key=key_of(namespace, kind.plural, name) if name else None,
    )


def _default_success(kind: Kind, roles: list[RoleSpec]) -> list[list[TaskRef]]:
    """Who decides success for a training kind: its master replica (T9k manual,
    "成功和失败"); ColossalAI, MPI and Beam succeed when every task does."""
    names = [r.name for r in roles]
    if not names or kind.name in ("ColossalAIJob", "MPIJob", "BeamJob"):
        return []
    if kind.name == "TensorFlowTrainingJob":
        master = "chief" if "chief" in names else "worker" if "worker" in names else names[0]
    elif kind.name == "XGBoostTrainingJob":
        master = "master"
    elif kind.name == "PyTorchTrainingJob":
        master = "master" if "master" in names else names[0]
    else:  # DeepSpeedJob: worker-0 is the main node
        master = names[0]
    return [[TaskRef(role=master, index=0)]]


def validate_t9k(payload: Any, spec: JobSpec) -> list[FieldIssue]:
    return translate_t9k(payload, spec.user).errors


def _looks_like(payload: dict[str, Any]) -> bool:
    version = payload.get("apiVersion")
    return isinstance(version, str) and version.startswith(f"{GROUP}/")


# ------------------------------------------------------------------------------ PATCH

# What a PATCH may change on a submitted T9k job: the pause run mode, and the size of
# an elastic job (expectedReplicas, or a replica spec's replicas).
_CHANGEABLE = (
    ("spec", "runMode", "pause"),
    ("spec", "runMode", "elastic", "expectedReplicas"),
    ("spec", "elastic", "expectedReplicas"),
    ("spec", "replicaSpecs", "*", "replicas"),
    ("spec", "replicasSpec", "*", "replicas"),
)


def _pause(job: dict[str, Any]) -> dict[str, Any] | None:
    """A job's runMode.pause, None where it has none."""
    pause = mapping(mapping(job.get("spec")).get("runMode")).get(PAUSE)
    return pause if isinstance(pause, dict) else None


_CHANGEABLE_TEXT = (
    "spec.runMode.pause (pause or resume the job) and, for an elastic job, "
    "runMode.elastic.expectedReplicas or a replica spec's replicas"
)


def _replica_counts(resource: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    spec = mapping(resource.get("spec"))
    key = (
        "replicasSpec" if "replicaSpecs" not in spec and "replicasSpec" in spec else "replicaSpecs"
    )
    entries = spec.get(key)
    return {
        entry["type"]: (entry.get("replicas", 1), f"$.spec.{key}[{i}].replicas")
        for i, entry in enumerate(entries if isinstance(entries, list) else [])
        if isinstance(entry, dict) and isinstance(entry.get("type"), str)
    }


def control_from_patch(current: dict[str, Any], patch: Any) -> Control:
    """What a merge patch of a submitted T9k job (``current``, as created) asks for:
    ``spec.runMode.pause.enabled`` true pauses it, false (or removing ``pause``) resumes
    it; a new ``expectedReplicas`` scales every elastic role to it, a replica spec's new
    ``replicas`` scales that role. Anything else is refused, naming the field."""
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
    after = translate_t9k(patched)
    if after.errors:
        return Control(errors=after.errors)
    changed = immutable_change(current, patched, _CHANGEABLE, _CHANGEABLE_TEXT)
    # Taking pause away resumes the job, resumeSpecs and all; else they must stay.
    pause, before = _pause(patched), _pause(current) or {}
    if (
        changed is None
        and pause is not None
        and (pause.get("resumeSpecs") or None) != (before.get("resumeSpecs") or None)
    ):
        # "不可以更改 spec.runMode.pause.resumeSpecs" (T9k's manual): set before pausing.
        changed = FieldIssue(
            path="$.spec.runMode.pause.resumeSpecs",
            code="immutable",
            message="spec.runMode.pause.resumeSpecs cannot be changed on a submitted job "
            "(T9k: set them when the job is created)",
        )
    if changed is not None:
        return Control(errors=[changed])
    control = Control()
    spec_patch = mapping(patch.get("spec"))
    modes = mapping(spec_patch.get("runMode"))
    # A pause asked for or taken away, alone or with the whole runMode (null).
    if PAUSE in modes or ("runMode" in spec_patch and spec_patch["runMode"] is None):
        control.pause = after.spec.run_mode is RunMode.PAUSE
    roles = {r.name: r for r in after.spec.roles}
    elastic = [r for r in after.spec.roles if r.min_replicas is not None]
    for part, path in (
        (modes.get(ELASTIC), "$.spec.runMode.elastic.expectedReplicas"),
        (spec_patch.get(ELASTIC), "$.spec.elastic.expectedReplicas"),
    ):
        if isinstance(part, dict) and "expectedReplicas" in part:
            if not elastic:
                control.errors.append(
                    FieldIssue(
                        path=path,
                        code="immutable",
                        message=("expectedReplicas scales an elastic job; this job is not elastic"),
                    )
                )
            # The translation has checked expectedReplicas against the bounds.
            control.scale = {r.name: r.replicas for r in elastic}
    before = _replica_counts(current)
    for rtype, (replicas, path) in _replica_counts(patched).items():
        if rtype in roles and replicas != before.get(rtype, (None, ""))[0]:
            count = elastic_scale(roles[rtype], replicas, path, control.errors)
            if count is not None:
                control.scale[rtype] = count
    return control


# ----------------------------------------------------------------------------- render

_TASK_PHASE = {
    "STARTING": "Pending",
    "RUNNING": "Running",
    "SUCCEEDED": "Succeeded",
    "FAILED": "Failed",
    "STOPPED": "Deleted",
}
_AGGREGATE = ("creating", "pending", "running", "succeeded", "failed", "unknown", "deleted")


def job_phase(view: dict[str, Any]) -> str:
    state = view.get("state")
    if state in ("SUCCEEDED",):
        return "Succeeded"
    if state in ("FAILED", "REJECTED", "STOPPED"):
        return "Failed"
    if is_paused(view):
        return "Paused"
    if state == "RUNNING":
        return "Running"
    return "Pending"


def render(kind_plural: str, job_view: dict[str, Any]) -> dict[str, Any]:
    """The T9k resource as submitted (``job_view["original"]``, the payload kept with the
    job) with a T9k-shaped status rendered from the canonical job view."""
    view = job_view
    original = view.get("original")
    original = original if isinstance(original, dict) else {}
    kind = PLURALS.get(kind_plural)
    resource: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": kind.name if kind else original.get("kind"),
        "metadata": resource_metadata(view, original),
        "spec": original.get("spec", {}),
        "status": t9k_status(view),
    }
    return resource


def t9k_status(view: dict[str, Any]) -> dict[str, Any]:
    state = view.get("state")
    phase = job_phase(view)
    created = timestamp(view.get("submitted_at"))
    updated = timestamp(view.get("updated_at")) or created
    finished = timestamp(view.get("finished_at")) or updated
    reason = str(view.get("reason") or "")
    spec = view.get("spec") or {}
    tasks = latest_tasks(view)

    roles = [r for r in spec.get("roles") or [] if isinstance(r, dict)]
    aggregate = dict.fromkeys(_AGGREGATE, 0)
    task_list: list[dict[str, Any]] = []
    per_role: dict[str, dict[str, int]] = {}
    name = view.get("name") or ""
    for role, shown in zip(roles, shown_tasks(roles), strict=True):
        rname = str(role.get("name"))
        counts = {"active": 0, "succeeded": 0, "failed": 0}
        replicas = []
        for index in range(shown):
            task = tasks.get((rname, index))
            if task is None:
                tphase = (
                    "Pending"
                    if state not in ("REJECTED", "STOPPED", "FAILED", "SUCCEEDED")
                    else "Deleted"
                )
                tphase = "Creating" if state == "PLACED" else tphase
            else:
                tphase = (
                    _TASK_PHASE.get(str(task.get("state")), "Unknown")
                    if task.get("state")
                    else "Creating"
                )
            aggregate[tphase.lower()] = aggregate.get(tphase.lower(), 0) + 1
            if tphase in ("Pending", "Running", "Creating"):
                counts["active"] += 1
            elif tphase == "Succeeded":
                counts["succeeded"] += 1
            elif tphase == "Failed":
                counts["failed"] += 1
            exit_code = task.get("exit_code") if task else None
            replica: dict[str, Any] = {
                "name": f"{name}-{rname}-{index}",
                "index": index,
                "phase": tphase,
                "exitCode": exit_code,
                "node": task.get("node") if task else None,
            }
            if task and task.get("state") in ("SUCCEEDED", "FAILED", "STOPPED"):
                replica["containers"] = [
                    {"exitCode": exit_code, "state": "Terminated", "reason": task.get("reason")}
                ]
            replicas.append(replica)
        per_role[rname] = counts
        task_list.append(
            {"type": rname, "restartCount": restarts(view, rname), "replicas": replicas, **counts}
        )

    conditions = [
        condition(
            "Initialized",
            state not in ("SUBMITTED", "ACCEPTED", "QUEUED", "REJECTED"),
            "-" if state != "REJECTED" else "Rejected",
            "The job has been initialized successfully."
            if state not in ("SUBMITTED", "ACCEPTED", "QUEUED", "REJECTED")
            else "The job is waiting for resources: " + reason
            if state == "QUEUED" and reason
            else "The job is not initialized.",
            created,
        )
    ]
    failed_tasks = sum(c["failed"] for c in per_role.values())
    if state == "REJECTED":
        message = rejection_message(view)
        conditions += [
            condition("Running", False, "Rejected", message, finished),
            condition("Completed", False, "Rejected", message, finished),
            condition("Failed", True, "Rejected", message, finished),
        ]
    elif state in ("SUCCEEDED", "FAILED", "STOPPED"):
        outcome = {"SUCCEEDED": "Succeeded", "FAILED": "Failed", "STOPPED": "Stopped"}[state]
        message = reason or (
            "The job has finished successfully." if state == "SUCCEEDED" else "The job has failed."
        )
        conditions += [
            condition("Running", False, outcome, message, finished),
            condition(
                "ReplicaFailure",
                failed_tasks > 0,
                "-" if not failed_tasks else "ReplicaFailed",
                f"{failed_tasks} replica(s) failed"
                if failed_tasks
                else "All pods are running normally.",
                finished,
            ),
            condition("Completed", state == "SUCCEEDED", outcome, message, finished),
            condition("Failed", state != "SUCCEEDED", outcome, message, finished),
        ]
    else:
        running = state == "RUNNING"
        conditions += [
            condition(
                "Running",
                running,
                "-",
                "All pods are running normally."
                if running
                else (reason or "The job is waiting to run."),
                updated,
            ),
            condition(
                "ReplicaFailure",
                failed_tasks > 0,
                "-",
                f"{failed_tasks} replica(s) failed"
                if failed_tasks
                else "All pods are running normally.",
                updated,
            ),
        ]
    if phase == "Paused":
        conditions.append(condition("Paused", True, "Paused", "The job is in pause mode.", updated))
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "tasks": task_list,
        "aggregate": aggregate,
        "replicaStatuses": per_role,
    }
    if view.get("queue_position") is not None and state == "QUEUED":
        status["queuePosition"] = view.get("queue_position")
    return status


REGISTRATION = Dialect(
    name=DIALECT,
    signature=f"t9k (an object with apiVersion {API_VERSION})",
    looks_like=_looks_like,
    translate=translate_t9k,
    field_path=field_path,
    validate=validate_t9k,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "PLURALS",
    "REGISTRATION",
    "RETRYABLE_EXIT_CODES",
    "control_from_patch",
    "key_of",
    "render",
    "translate_t9k",
    "validate_t9k",
]
