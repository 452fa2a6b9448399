"""OpenPAI v1 job JSON (the SCM submit-job format, seed §4) to and from the canonical job.

``validate_openpai`` checks every rule of the §4 field table on the raw payload;
``translate_openpai`` builds the best JobSpec it can from any input, substituting the
canonical default for a field it cannot use (the errors say which), so callers always
get a spec to show alongside the errors.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from ..events import FieldIssue
from ..jobspec import (
    RETRY_ALWAYS,
    JobSpec,
    PortSpec,
    Resources,
    RestartPolicy,
    RoleSpec,
    env_list,
)
from .fields import boolean_hint
from .registry import Dialect
from .translation import (
    INT_MAX,
    JOB_NAME_RE,
    JOB_NAME_RULE,
    PORT_MAX,
    ROLE_NAME_RE,
    ROLE_NAME_RULE,
    Issues,
    Translation,
    bounded_int,
    empty_spec,
    env_problem,
    join,
    json_type,
    show,
    shown_tasks,
)

DIALECT = "openpai"

JOB_KEYS = frozenset(
    {
        "jobName",
        "image",
        "authFile",
        "dataDir",
        "outputDir",
        "codeDir",
        "virtualCluster",
        "taskRoles",
        "gpuType",
        "retryCount",
        "jobEnvs",
        "extras",
    }
)
# Kept with the original payload but never warned about: ``extras`` is OpenPAI's free
# slot, and ``tmp`` is what the SCM web form adds (both seed examples carry it).
QUIET_KEYS = frozenset({"extras", "tmp"})
ROLE_KEYS = frozenset(
    {
        "name",
        "taskNumber",
        "cpuNumber",
        "memoryMB",
        "shmMB",
        "gpuNumber",
        "storageGB",
        "portList",
        "command",
        "minFailedTaskCount",
        "minSucceededTaskCount",
    }
)
PORT_KEYS = frozenset({"label", "beginAt", "portNumber"})

DEFAULT_SHM_MB = 64

# Canonical field -> OpenPAI key, for errors found after translation (cluster checks).
_JOB_FIELDS = {
    "name": "jobName",
    "image": "image",
    "auth_file": "authFile",
    "data_dir": "dataDir",
    "output_dir": "outputDir",
    "code_dir": "codeDir",
    "queue": "virtualCluster",
    "gpu_type": "gpuType",
    "retry_limit": "retryCount",
    "env": "jobEnvs",
    "roles": "taskRoles",
}
_ROLE_FIELDS = {
    "name": "name",
    "replicas": "taskNumber",
    "cpu": "cpuNumber",
    "memory_mb": "memoryMB",
    "shm_mb": "shmMB",
    "gpu": "gpuNumber",
    "storage_gb": "storageGB",
    "command": "command",
    "ports": "portList",
    "min_failed": "minFailedTaskCount",
    "min_succeeded": "minSucceededTaskCount",
}


def field_path(payload: Any, role: str | None, field: str) -> str:
    """Where a canonical field is written in an OpenPAI payload ("role": the task role
    itself, found by its name)."""
    if field == "keep_failed_for_debug":
        return "$.jobEnvs.isDebug"
    if field in ("gpu_type", "image") or role is None:
        # gpuType and image are job-wide in OpenPAI, whichever role the problem is in.
        key = _JOB_FIELDS.get(field)
        return f"$.{key}" if key else "$"
    raw = payload.get("taskRoles") if isinstance(payload, dict) else None
    index = (
        next((i for i, r in enumerate(raw) if isinstance(r, dict) and r.get("name") == role), None)
        if isinstance(raw, list)
        else None
    )
    if index is None:
        return "$.taskRoles"
    path = f"$.taskRoles[{index}]"
    key = _ROLE_FIELDS.get(field)
    return f"{path}.{key}" if key else path


# --------------------------------------------------------------------------- validation


NOT_APPLIED = {
    "authFile": "authFile is kept but not used: no image is pulled with a registry "
    "authentication file here (on Kubernetes, the operator's YARD_K8S_IMAGE_PULL_SECRETS "
    "apply)",
    "codeDir": "codeDir is given to the tasks as PAI_CODE_DIR but not copied into them "
    "(there is no HDFS here): put the code where the tasks can read it",
}


def check_openpai(payload: Any) -> Issues:
    """Every rule of the §4 table, as errors, plus advisory warnings."""
    issues = Issues()
    if not isinstance(payload, dict):
        issues.error("$", f"an OpenPAI job must be a JSON object, not {json_type(payload)}", "type")
        return issues

    issues.string(payload, "jobName", "$", required=True, pattern=JOB_NAME_RE, rule=JOB_NAME_RULE)
    issues.string(payload, "image", "$", required=True, non_blank=True)
    for key in ("authFile", "dataDir", "outputDir", "codeDir", "virtualCluster", "gpuType"):
        issues.string(payload, key, "$", required=False)
    # What the seed says OpenPAI does with these, Trainyard does not: said, not hidden.
    for key, why in NOT_APPLIED.items():
        if isinstance(payload.get(key), str) and payload[key].strip():
            issues.warn(join("$", key), why, "not_applied")
    # OpenPAI's own schema (rest-server config/job.js): an integer of at least -2, no
    # more bound than the seed's ("不低于0"); an int32 here. -1 retries a failed job
    # without limit, -2 runs it again after every end, success too (FrameworkLauncher's
    # unlimited and extended-unlimited retry counts).
    retries = issues.integer(
        payload, "retryCount", "$", required=False, minimum=RETRY_ALWAYS, maximum=INT_MAX
    )
    if retries is not None and retries < 0:
        # Taken, as OpenPAI takes it; the guide says "at least 0", so said what it does.
        issues.warn(
            "$.retryCount",
            "retryCount -1 retries a failed job without limit"
            if retries == -1
            else "retryCount -2 runs the job again after every end, success too, until it "
            "is stopped",
            "retries_without_limit",
        )
    _check_job_envs(payload, issues)
    if (
        "extras" in payload
        and payload["extras"] is not None
        and not isinstance(payload["extras"], dict)
    ):
        issues.error(
            "$.extras", f"extras must be an object, not {json_type(payload['extras'])}", "type"
        )

    unknown = sorted(k for k in payload if k not in JOB_KEYS and k not in QUIET_KEYS)
    for key in unknown:
        issues.warn(join("$", key), f"unknown field {show(key)} is ignored", "unknown_field")

    roles = payload.get("taskRoles")
    if roles is None:
        issues.error(
            "$.taskRoles", "taskRoles is required (a list with at least one role)", "required"
        )
        return issues
    if not isinstance(roles, list):
        issues.error("$.taskRoles", f"taskRoles must be a list, not {json_type(roles)}", "type")
        return issues
    if not roles:
        issues.error("$.taskRoles", "taskRoles must hold at least one task role", "required")
    first_use: dict[str, int] = {}
    for i, role in enumerate(roles):
        path = f"$.taskRoles[{i}]"
        if not isinstance(role, dict):
            issues.error(path, f"a task role must be an object, not {json_type(role)}", "type")
            continue
        name = _check_role(role, path, issues)
        if name is not None:
            if name in first_use:
                issues.error(
                    f"{path}.name",
                    f"task role name {show(name)} is already used by "
                    f"taskRoles[{first_use[name]}]; names must be unique in a job",
                    "duplicate",
                )
            else:
                first_use[name] = i
    return issues


def _check_job_envs(payload: dict[str, Any], issues: Issues) -> None:
    envs = payload.get("jobEnvs")
    if envs is None:
        return
    if not isinstance(envs, dict):
        issues.error("$.jobEnvs", f"jobEnvs must be an object, not {json_type(envs)}", "type")
        return
    if "isDebug" in envs and not isinstance(envs["isDebug"], bool):
        issues.error(
            "$.jobEnvs.isDebug",
            f"jobEnvs.isDebug must be a boolean, not {json_type(envs['isDebug'])}"
            f"{boolean_hint(envs['isDebug'])}",
            "type",
        )
    for key, value in envs.items():
        if problem := env_problem(str(key), value if isinstance(value, str) else ""):
            issues.error(join("$.jobEnvs", str(key)), problem)
        elif str(key).startswith("PAI_"):
            # The guide: jobEnvs "may not replace" the platform's; said, not left silent.
            issues.warn(
                join("$.jobEnvs", str(key)),
                f"{key} is the platform's to set (PAI_*): the task sees the platform's "
                "value where it sets one, not this",
                "env_reserved",
            )
        elif isinstance(value, dict | list):
            issues.warn(
                join("$.jobEnvs", key),
                f"jobEnvs value {show(key)} is {json_type(value)}; it is passed "
                "to the job as JSON text",
                "env_not_scalar",
            )


def _check_role(role: dict[str, Any], path: str, issues: Issues) -> str | None:
    name = issues.string(
        role, "name", path, required=True, pattern=ROLE_NAME_RE, rule=ROLE_NAME_RULE
    )
    tasks = issues.integer(role, "taskNumber", path, required=True, minimum=1)
    issues.integer(role, "cpuNumber", path, required=True, minimum=1)
    memory = issues.integer(role, "memoryMB", path, required=True, minimum=100)
    shm = issues.integer(role, "shmMB", path, required=False, minimum=0)
    if shm is not None and memory is not None and shm > memory:
        issues.warn(
            f"{path}.shmMB",
            f"shmMB ({shm}) is larger than memoryMB ({memory}); shared memory "
            "counts against the task's memory",
            "shm_above_memory",
        )
    issues.integer(role, "gpuNumber", path, required=True, minimum=0)
    issues.integer(role, "storageGB", path, required=False, minimum=0)
    issues.string(role, "command", path, required=True, non_blank=True)
    for key in ("minFailedTaskCount", "minSucceededTaskCount"):
        count = issues.integer(role, key, path, required=False, minimum=1, nullable=True)
        if count is not None and tasks is not None and count > tasks:
            # OpenPAI's schema: .max(Joi.ref('taskNumber')) (checkMinTaskNumber: "should
            # not be greater than tasks number"). Kept, the rule could never trigger: a
            # job all of whose tasks failed would succeed.
            issues.error(
                join(path, key),
                f"{key} ({count}) must not be greater than taskNumber ({tasks})",
                "count_above_tasks",
            )
    _check_ports(role, path, issues)
    for key in sorted(k for k in role if k not in ROLE_KEYS):
        issues.warn(
            join(path, key), f"unknown task role field {show(key)} is ignored", "unknown_field"
        )
    return name


def _check_ports(role: dict[str, Any], path: str, issues: Issues) -> None:
    ports = role.get("portList")
    if ports is None:
        return
    list_path = f"{path}.portList"
    if not isinstance(ports, list):
        issues.error(list_path, f"portList must be a list, not {json_type(ports)}", "type")
        return
    first_use: dict[str, int] = {}
    for j, port in enumerate(ports):
        port_path = f"{list_path}[{j}]"
        if not isinstance(port, dict):
            issues.error(
                port_path, f"a portList entry must be an object, not {json_type(port)}", "type"
            )
            continue
        label = issues.string(
            port, "label", port_path, required=True, pattern=ROLE_NAME_RE, rule=ROLE_NAME_RULE
        )
        if label is not None:
            if label in first_use:
                issues.error(
                    f"{port_path}.label",
                    f"port label {show(label)} is already used by "
                    f"portList[{first_use[label]}]; labels must be unique in a role",
                    "duplicate",
                )
            else:
                first_use[label] = j
        begin = issues.integer(
            port, "beginAt", port_path, required=True, minimum=0, maximum=PORT_MAX
        )
        count = issues.integer(
            port, "portNumber", port_path, required=True, minimum=1, maximum=PORT_MAX
        )
        if begin and count is not None and begin + count - 1 > PORT_MAX:
            issues.error(
                f"{port_path}.portNumber",
                f"ports {begin}..{begin + count - 1} do not fit below 65536 "
                "(beginAt + portNumber - 1 must be at most 65535)",
                "range",
            )
        for key in sorted(k for k in port if k not in PORT_KEYS):
            issues.warn(
                join(port_path, key),
                f"unknown portList field {show(key)} is ignored",
                "unknown_field",
            )


def validate_openpai(payload: Any) -> list[FieldIssue]:
    """The errors in an OpenPAI job payload; empty when it breaks no rule."""
    return check_openpai(payload).errors


def openpai_warnings(payload: Any) -> list[FieldIssue]:
    return check_openpai(payload).warnings


# -------------------------------------------------------------------------- translation


def _int(value: Any, default: int, minimum: int) -> int:
    return bounded_int(value, default, minimum)  # type: ignore[return-value]


def _opt_int(value: Any, minimum: int) -> int | None:
    return bounded_int(value, None, minimum)


def _text(value: Any) -> str | None:
    """Optional strings: OpenPAI's form sends "" for "not given"."""
    return value if isinstance(value, str) and value else None


def _min_count(role: dict[str, Any], key: str, absent: int | None) -> int | None:
    # OpenPAI: a missing key takes the default; an explicit null means "never".
    if key not in role:
        return absent
    return _opt_int(role[key], 1) if role[key] is not None else None


def _env_scalar(value: Any) -> Any:
    if isinstance(value, dict | list):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, RecursionError):
            return ""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return value


# Every task role gets an http and an ssh port unless its portList names them (the v1
# rest-server's generateFrameworkDescription: {start: 0, count: 1} each, after the
# role's own): PAI_TASK_ROLE_<role>_HOST_LIST is ip:http-port, and SSH needs its port.
DEFAULT_PORTS = ("http", "ssh")


def _ports(raw: Any) -> list[PortSpec]:
    ports = []
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("label"), str):
            ports.append(
                PortSpec(
                    label=entry["label"],
                    begin_at=_int(entry.get("beginAt"), 0, 0),
                    count=_int(entry.get("portNumber"), 1, 1),
                )
            )
    named = {p.label for p in ports}
    return ports + [PortSpec(label=label) for label in DEFAULT_PORTS if label not in named]


def _role(raw: dict[str, Any], gpu_type: str | None) -> RoleSpec:
    name = raw.get("name")
    command = raw.get("command")
    return RoleSpec(
        name=name if isinstance(name, str) else "",
        replicas=_int(raw.get("taskNumber"), 1, 1),
        resources=Resources(
            cpu=float(_int(raw.get("cpuNumber"), 1, 1)),
            memory_mb=_int(raw.get("memoryMB"), 1024, 100),
            shm_mb=_int(raw.get("shmMB"), DEFAULT_SHM_MB, 0),
            gpu=float(_int(raw.get("gpuNumber"), 0, 0)),
            gpu_type=gpu_type,
            storage_gb=_opt_int(raw.get("storageGB"), 0),
        ),
        command=command if isinstance(command, str) else "",
        ports=_ports(raw.get("portList")),
        min_failed=_min_count(raw, "minFailedTaskCount", 1),
        min_succeeded=_min_count(raw, "minSucceededTaskCount", None),
        # OpenPAI's retryCount retries a failed command too (its job exit spec calls an
        # exit code 1 unknown, RETRY_TO_MAX); a permanent failure never (docs/lifecycle.md).
        restart_policy=RestartPolicy.ON_FAILURE,
    )


def translate_openpai(payload: Any, user: str = "") -> Translation:
    """Any input to a JobSpec plus the §4 errors and warnings; never raises."""
    issues = check_openpai(payload)
    if not isinstance(payload, dict):
        return Translation(empty_spec(user=user), DIALECT, issues.errors, issues.warnings)

    gpu_type = _text(payload.get("gpuType"))
    raw_roles = payload.get("taskRoles")
    roles = (
        [_role(r, gpu_type) for r in raw_roles if isinstance(r, dict)]
        if isinstance(raw_roles, list)
        else []
    )
    envs = payload.get("jobEnvs")
    envs = envs if isinstance(envs, dict) else {}
    name = payload.get("jobName")
    spec = JobSpec(
        name=name if isinstance(name, str) else "",
        user=user,
        queue=_text(payload.get("virtualCluster")) or "default",
        image=_text(payload.get("image")),
        env=env_list({k: _env_scalar(v) for k, v in envs.items()}),
        code_dir=_text(payload.get("codeDir")),
        data_dir=_text(payload.get("dataDir")),
        output_dir=_text(payload.get("outputDir")),
        auth_file=_text(payload.get("authFile")),
        retry_limit=_int(payload.get("retryCount"), 0, RETRY_ALWAYS),
        # The launcher's platformSpecificParameters.gangAllocation: false places the
        # tasks one by one.
        gang=not (
            isinstance(extras := payload.get("extras"), dict)
            and extras.get("gangAllocation") is False
        ),  # fmt: skip
        keep_failed_for_debug=envs.get("isDebug") is True,
        roles=roles,
    )
    return Translation(spec, DIALECT, issues.errors, issues.warnings, key=spec.name or None)


def _looks_like(payload: dict[str, Any]) -> bool:
    return "jobName" in payload or "taskRoles" in payload


REGISTRATION = Dialect(
    name=DIALECT,
    signature="openpai (an object with jobName or taskRoles)",
    looks_like=_looks_like,
    translate=translate_openpai,
    field_path=field_path,
    validate=lambda payload, spec: validate_openpai(payload),
    warnings=lambda payload, spec: openpai_warnings(payload),
)


# -------------------------------------------------------------------------------- views
#
# OpenPAI rest-server's shapes (src/rest-server/src/models/v2/job/k8s.js:
# convertFrameworkDetail, convertTaskDetail, convertFrameworkSummary), rendered from the
# canonical job view (status's job_view) of a job submitted in either OpenPAI dialect.
# A view may carry ``stop_requested`` (a stop was asked for and the job is not over).

# OpenPAI's job states and the framework (sub)state behind each of ours.
_JOB_STATE = {
    "SUBMITTED": ("WAITING", "AttemptCreationPending"),
    "ACCEPTED": ("WAITING", "AttemptCreationPending"),
    "QUEUED": ("WAITING", "AttemptCreationPending"),
    "PLACED": ("WAITING", "AttemptPreparing"),
    "RUNNING": ("RUNNING", "AttemptRunning"),
    "SUCCEEDED": ("SUCCEEDED", "Completed"),
    "FAILED": ("FAILED", "Completed"),
    "STOPPED": ("STOPPED", "Completed"),
    "REJECTED": ("FAILED", "Completed"),
    # OpenPAI has no pause: a paused job waits for its next attempt (a resume).
    "PAUSED": ("WAITING", "AttemptCreationPending"),
}
_TASK_STATE = {
    "STARTING": "WAITING",
    "RUNNING": "RUNNING",
    "SUCCEEDED": "SUCCEEDED",
    "FAILED": "FAILED",
    "STOPPED": "STOPPED",
}
# OpenPAI's exit code for a job stopped by its user (runtime exit spec).
STOPPED_EXIT_CODE = -210


def epoch_ms(value: Any) -> int | None:
    """A time as OpenPAI writes it: milliseconds since the epoch."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000)
    return None


def framework_name(view: dict[str, Any]) -> str:
    return f"{view.get('user') or ''}~{view.get('name') or ''}"


def _job_state(view: dict[str, Any]) -> tuple[str, str, str]:
    state, sub = _JOB_STATE.get(view.get("state") or "", ("UNKNOWN", "Unknown"))
    execution = "STOP" if view.get("stop_requested") else "START"
    if execution == "STOP" and state in ("WAITING", "RUNNING"):
        state, sub = "STOPPING", "AttemptDeletionPending"
    return state, sub, execution


def _exit_code(view: dict[str, Any]) -> int | None:
    code = view.get("exit_code")
    if code is None and view.get("state") == "STOPPED":
        return STOPPED_EXIT_CODE
    if code is None and view.get("state") == "SUCCEEDED":
        return 0
    return code


def _retry_details(view: dict[str, Any]) -> dict[str, int]:
    """OpenPAI's ``retryDetails``: the failed attempts that ran again, by whose failure
    (unknown ones count as the user's). Not every earlier attempt: a pause, a preemption,
    a scale or a restart ends one without a retry."""
    details = {"user": 0, "platform": 0, "resource": 0}
    attempts = view.get("attempts")
    if not isinstance(attempts, list):
        retries = view.get("retries")
        details["user"] = retries if isinstance(retries, int) else 0
        return details
    for ended in attempts:
        if isinstance(ended, dict) and ended.get("retried_as") and not ended.get("interrupted"):
            details["platform" if ended.get("failure_class") == "platform" else "user"] += 1
    return details


def _spec_roles(view: dict[str, Any]) -> list[dict[str, Any]]:
    spec = view.get("spec") or {}
    roles = spec.get("roles") if isinstance(spec, dict) else None
    return [r for r in roles if isinstance(r, dict)] if isinstance(roles, list) else []


def _task_status(
    view: dict[str, Any], role: str, index: int, task: dict[str, Any] | None, attempt: int
) -> dict[str, Any]:
    task = task or {}
    state = _TASK_STATE.get(task.get("state") or "", "WAITING")
    ended = state in ("SUCCEEDED", "FAILED", "STOPPED")
    job_id = view.get("id") or ""
    return {
        "taskIndex": index,
        "taskUid": f"{job_id}:{attempt}:{role}:{index}",
        "taskState": state,
        # The same id the task sees as PAI_CONTAINER_ID.
        "containerId": f"{job_id}-{attempt}-{role}-{index}" if task else None,
        "containerIp": task.get("host_ip"),
        "containerNodeName": task.get("node"),
        "containerPorts": {
            p["label"]: ",".join(str(n) for n in p.get("ports", []))
            for p in task.get("ports") or []
            if isinstance(p, dict) and "label" in p
        },
        "containerGpus": None,
        # OpenPAI's own log route (its locations lead to Trainyard's log API), as the
        # task's attempts give it.
        "containerLog": task_log_path(view, attempt, role, index),
        "containerExitCode": task.get("exit_code"),
        "containerExitSpec": None,
        "containerExitDiagnostics": task.get("reason"),
        "retries": 0,
        "accountableRetries": 0,
        "createdTime": None,
        "launchedTime": None,
        "completedTime": epoch_ms(task.get("updated_at")) if ended else None,
        "attemptId": attempt - 1,
        "attemptState": state,
        "currentAttemptCreatedTime": None,
        "currentAttemptLaunchedTime": None,
        "currentAttemptCompletedTime": epoch_ms(task.get("updated_at")) if ended else None,
    }


def render_status(view: dict[str, Any], attempt: int | None = None) -> dict[str, Any]:
    """``GET /api/v2/jobs/{user}~{name}``: the job's status as OpenPAI answers it. Only
    the latest attempt's tasks are shown, as OpenPAI does; a task not placed yet is
    WAITING. ``attempt`` (``.../attempts/{jobAttemptId}``: OpenPAI counts from 0, we from
    1): that attempt's tasks instead, and its own state when it ended."""
    state, sub, execution = _job_state(view)
    latest = view.get("attempt") or 1
    if attempt is not None and attempt != latest:
        earlier = _ended_attempt(view, attempt) or {}
        state, sub = _JOB_STATE.get(earlier.get("state") or "", ("FAILED", "Completed"))
        execution = "START"
    attempt = attempt or latest
    retries = _retry_details(view)
    ended = sub == "Completed"
    reason = view.get("reason")
    tasks: dict[Any, dict[str, Any]] = dict(_tasks_of(view, attempt))
    task_roles: dict[str, Any] = {}
    roles = _spec_roles(view)
    for role, count in zip(roles, shown_tasks(roles, 1), strict=True):
        name = str(role.get("name", ""))
        task_roles[name] = {
            "taskRoleStatus": {"name": name},
            "taskStatuses": [
                _task_status(view, name, i, tasks.get((name, i)), attempt) for i in range(count)
            ],
        }
    submitted = epoch_ms(view.get("submitted_at"))
    completed = epoch_ms(view.get("finished_at")) if ended else None
    return {
        "debugId": framework_name(view),
        "name": view.get("name"),
        "tags": list(view.get("tags") or []),
        "jobPriority": view.get("priority"),
        "jobStatus": {
            "username": view.get("user"),
            "state": state,
            "subState": sub,
            "executionType": execution,
            "retries": sum(retries.values()),
            "retryDetails": retries,
            "retryDelayTime": 0,
            "createdTime": submitted,
            "launchedTime": None,
            "completedTime": completed,
            "attemptId": attempt - 1,
            "attemptState": state,
            "appId": view.get("id"),
            "appProgress": 1 if ended else 0,
            "appTrackingUrl": "",
            "appCreatedTime": submitted,
            "appLaunchedTime": None,
            "appCompletedTime": completed,
            "appExitCode": _exit_code(view) if ended else None,
            "appExitSpec": None,
            "appExitDiagnostics": reason if ended else None,
            "appExitMessages": None,
            "appExitTriggerMessage": reason if ended else None,
            "appExitTriggerTaskRoleName": None,
            "appExitTriggerTaskIndex": None,
            "appExitType": None,
            "virtualCluster": view.get("queue"),
        },
        "taskRoles": task_roles,
    }


def _ended_attempt(view: dict[str, Any], attempt: int) -> dict[str, Any] | None:
    """An earlier attempt as the view remembers it (how it ended), or None."""
    for ended in view.get("attempts") or []:
        if isinstance(ended, dict) and ended.get("attempt") == attempt:
            return ended
    return None


def attempt_numbers(view: dict[str, Any]) -> list[int]:
    """Every attempt the job had, oldest first (ours count from 1)."""
    earlier = {a.get("attempt") for a in view.get("attempts") or [] if isinstance(a, dict)}
    return sorted({n for n in earlier if isinstance(n, int)} | {view.get("attempt") or 1})


def _tasks_of(view: dict[str, Any], attempt: int) -> dict[tuple[str, int], dict[str, Any]]:
    return {
        (str(t.get("role")), int(t.get("index") or 0)): t
        for t in view.get("tasks") or []
        if isinstance(t, dict) and (t.get("attempt") or 1) == attempt
    }


def render_job_attempt(view: dict[str, Any], attempt: int) -> dict[str, Any]:
    """One attempt as OpenPAI's job history answers it (``JobAttempt``:
    ``GET .../job-attempts[/{attemptIndex}]``)."""
    latest = view.get("attempt") or 1
    status = render_status(view, attempt)["jobStatus"]
    ended = _ended_attempt(view, attempt) if attempt != latest else None
    tasks = _tasks_of(view, attempt)
    roles = _spec_roles(view)
    code = ended.get("exit_code") if ended else status.get("appExitCode")
    reason = ended.get("reason") if ended else status.get("appExitDiagnostics")
    started = [epoch_ms(t.get("started_at")) for t in tasks.values() if t.get("started_at")]
    finished = epoch_ms(ended.get("ended_at")) if ended else status.get("completedTime")
    gpus = sum(
        int(r.get("replicas") or 1) * float((r.get("resources") or {}).get("gpu") or 0)
        for r in roles
    )
    return {
        "jobName": view.get("name"),
        "frameworkName": framework_name(view),
        "uid": f"{view.get('id')}-{attempt}",
        "userName": view.get("user"),
        "state": status["state"],
        "originState": status["subState"],
        "attemptIndex": attempt - 1,
        "jobStartedTime": epoch_ms(view.get("submitted_at")),
        "attemptStartedTime": min((t for t in started if t), default=None),
        "attemptCompletedTime": finished,
        "exitCode": code,
        "exitPhrase": status["state"].title() if finished else None,
        "exitType": status["state"].title() if finished else None,
        "exitDiagnostics": reason,
        "appExitTriggerMessage": reason,
        "appExitTriggerTaskRoleName": None,
        "appExitTriggerTaskIndex": None,
        "appExitSpec": None,
        "appExitDiagnostics": reason,
        "appExitMessages": None,
        "totalGpuNumber": int(gpus) if float(gpus).is_integer() else gpus,
        "totalTaskNumber": sum(int(r.get("replicas") or 1) for r in roles),
        "totalTaskRoleNumber": len(roles),
        "taskRoles": {
            str(r.get("name")): {
                "taskRoleStatus": {"name": str(r.get("name"))},
                "taskStatuses": [
                    {
                        "taskIndex": i,
                        "taskState": _TASK_STATE.get(
                            (tasks.get((str(r.get("name")), i)) or {}).get("state") or "",
                            "WAITING",
                        ),
                        "containerId": f"{view.get('id')}-{attempt}-{r.get('name')}-{i}",
                        "containerIp": (tasks.get((str(r.get("name")), i)) or {}).get("host_ip"),
                        "containerExitCode": (tasks.get((str(r.get("name")), i)) or {}).get(
                            "exit_code"
                        ),
                    }
                    for i in range(count)
                ],
            }
            for r, count in zip(roles, shown_tasks(roles, 1), strict=True)
        },
        "isLatest": attempt == latest,
    }


def task_log_path(view: dict[str, Any], attempt: int, role: str, index: int) -> str:
    """Where OpenPAI's clients ask for a task's log locations (``getTaskLogs``)."""
    return (
        f"/api/v2/jobs/{framework_name(view)}/attempts/{attempt - 1}/taskRoles/{role}"
        f"/taskIndex/{index}/attempts/0/logs"
    )


def render_task(view: dict[str, Any], attempt: int, role: str, index: int) -> dict[str, Any] | None:
    """``GET .../attempts/{a}/taskRoles/{role}/taskIndex/{i}/attempts`` (OpenPAI's
    TaskStatus with its attempts): a task runs once per job attempt here, so it has one
    attempt of its own. None when the job has no such task."""
    spec_role = next((r for r in _spec_roles(view) if r.get("name") == role), None)
    if spec_role is None or not 0 <= index < int(spec_role.get("replicas") or 1):
        return None
    task = _tasks_of(view, attempt).get((role, index))
    status = _task_status(view, role, index, task, attempt)
    created = epoch_ms((task or {}).get("started_at"))
    return {
        "taskIndex": index,
        "taskUid": status["taskUid"],
        "taskState": status["taskState"],
        "retries": 0,
        "accountableRetries": 0,
        "createdTime": created,
        "launchedTime": created,
        "completedTime": status["completedTime"],
        "username": view.get("user"),
        "jobName": view.get("name"),
        "jobAttemptId": attempt - 1,
        "taskRoleName": role,
        "attempts": [
            {
                "attemptId": 0,
                "attemptState": status["taskState"],
                "currentAttemptCreatedTime": created,
                "currentAttemptLaunchedTime": created,
                "currentAttemptCompletedTime": status["completedTime"],
                "containerId": status["containerId"],
                "containerIp": status["containerIp"],
                "containerNodeName": status["containerNodeName"],
                "containerPorts": status["containerPorts"],
                "containerGpus": None,
                "containerLog": status["containerLog"],
                "containerExitCode": status["containerExitCode"],
                "containerExitSpec": None,
                "containerExitDiagnostics": status["containerExitDiagnostics"],
            }
        ],
    }


# History events of a job as OpenPAI's job events (Kubernetes events of its pods):
# (type, reason) by event type.
_EVENTS = {
    "JobQueued": ("Warning", "FailedScheduling"),
    "JobPlaced": ("Normal", "Scheduled"),
    "JobRejected": ("Warning", "FailedCreate"),
    "JobRetrying": ("Warning", "BackOff"),
    "JobInterrupted": ("Normal", "Killing"),
    "JobFinished": ("Normal", "Completed"),
    "StopJob": ("Normal", "Killing"),
}


def render_events(
    view: dict[str, Any], history: list[dict[str, Any]], kind: str | None
) -> dict[str, Any]:
    """``GET .../events``: the job's history as OpenPAI's job events (newest first, as
    OpenPAI sorts them by lastTimestamp), each a Kubernetes-event-like record; ``kind``
    filters by type (``Warning``, ``Normal``)."""
    data = []
    for item in history:
        event = item.get("event") or {}
        name = item.get("type") or ""
        role, index = event.get("role"), event.get("index")
        if name == "TaskStateChanged":
            state = event.get("state")
            if state not in ("RUNNING", "FAILED", "SUCCEEDED"):
                continue
            found = {
                "RUNNING": ("Normal", "Started"),
                "FAILED": ("Warning", "Failed"),
                "SUCCEEDED": ("Normal", "Completed"),
            }[state]
            message = event.get("reason") or f"task {role}[{index}] {state.lower()}"
        elif name in _EVENTS:
            found = _EVENTS[name]
            message = (
                "; ".join(event.get("reasons") or [])
                or event.get("reason")
                or "; ".join(
                    f"{e.get('path')}: {e.get('message')}" for e in event.get("errors") or []
                )
                or name
            )
        else:
            continue
        if kind and found[0] != kind:
            continue
        at = item.get("occurred_at")
        data.append(
            {
                "uid": item.get("event_id"),
                "frameworkName": framework_name(view),
                "podUid": None,
                "taskroleName": role,
                "taskName": f"{view.get('name')}-{role}-{index}" if role is not None else None,
                "taskIndex": index,
                "type": found[0],
                "reason": found[1],
                "message": message,
                "firstTimestamp": at,
                "lastTimestamp": at,
                "count": 1,
                "sourceComponent": "trainyard",
                "sourceHost": None,
            }
        )
    data.reverse()
    return {"totalCount": len(data), "data": data}


# ``GET /api/v2/info``.
CLUSTER_INFO = {
    "name": "PAI RESTful API",
    "version": "v1.8.0",
    "launcherType": "k8s",
    "authnMethod": "basic",
}


def render_list_item(view: dict[str, Any]) -> dict[str, Any]:
    """One job of ``GET /api/v2/jobs`` as OpenPAI lists it."""
    state, sub, execution = _job_state(view)
    retries = _retry_details(view)
    roles = _spec_roles(view)

    def number(value: Any, default: float) -> float:
        return value if isinstance(value, int | float) and not isinstance(value, bool) else default

    gpus = sum(
        number(r.get("replicas"), 1) * number((r.get("resources") or {}).get("gpu"), 0)
        for r in roles
    )
    return {
        "debugId": framework_name(view),
        "name": view.get("name"),
        "username": view.get("user"),
        "state": state,
        "subState": sub,
        "executionType": execution,
        "tags": list(view.get("tags") or []),
        "retries": sum(retries.values()),
        "retryDetails": retries,
        "retryDelayTime": 0,
        "submissionTime": epoch_ms(view.get("submitted_at")),
        "createdTime": epoch_ms(view.get("submitted_at")),
        "launchedTime": None,
        "completedTime": epoch_ms(view.get("finished_at")) if sub == "Completed" else None,
        "appExitCode": _exit_code(view) if sub == "Completed" else None,
        "virtualCluster": view.get("queue"),
        "totalGpuNumber": int(gpus) if float(gpus).is_integer() else gpus,
        "totalTaskNumber": int(sum(number(r.get("replicas"), 1) for r in roles)),
        "totalTaskRoleNumber": len(roles),
        "jobPriority": view.get("priority"),
    }


def _resources(cpu: float, memory_mb: float, gpus: float) -> dict[str, Any]:
    def whole(value: float) -> float:
        return int(value) if float(value).is_integer() else value

    return {
        "cpu": whole(cpu),
        "vCores": whole(cpu),
        "memory": whole(memory_mb),
        "gpu": whole(gpus),
        "GPUs": whole(gpus),
    }


def render_virtual_clusters(cluster: dict[str, Any]) -> dict[str, Any]:
    """``GET /api/v2/virtual-clusters``: each queue as an OpenPAI virtual cluster, from
    placement's cluster view (its nodes' capacity, each queue's quota and use). Capacity
    is a share of the cluster's GPUs (its CPUs where it has none), in percent; a queue
    without a quota is guaranteed nothing and may use everything (maxCapacity 100)."""
    nodes = cluster.get("nodes") or []
    total = {
        key: sum(float((n.get("capacity") or {}).get(key) or 0) for n in nodes)
        for key in ("cpu", "memory_mb", "gpus")
    }
    basis = "gpus" if total["gpus"] else "cpu"
    out: dict[str, Any] = {}
    for queue in cluster.get("queues") or []:
        quota = queue.get("quota") or {}
        used = queue.get("used") or {}
        guaranteed = {key: float(quota.get(key) or 0) for key in ("cpu", "memory_mb", "gpus")}

        def percent(value: float) -> float:
            return round(100.0 * value / total[basis], 2) if total[basis] else 0.0

        out[str(queue.get("name"))] = {
            "capacity": percent(guaranteed[basis]),
            "usedCapacity": percent(float(used.get(basis) or 0)),
            "maxCapacity": 100.0 if queue.get("borrowing", True) else percent(guaranteed[basis]),
            "dedicated": False,
            "resourcesUsed": _resources(
                float(used.get("cpu") or 0),
                float(used.get("memory_mb") or 0),
                float(used.get("gpus") or 0),
            ),  # fmt: skip
            "resourcesGuaranteed": _resources(
                guaranteed["cpu"], guaranteed["memory_mb"], guaranteed["gpus"]
            ),
            "resourcesTotal": _resources(total["cpu"], total["memory_mb"], total["gpus"]),
            "waitingJobs": queue.get("waiting", 0),
        }
    return out


def render_sku_types(cluster: dict[str, Any]) -> dict[str, Any]:
    """``GET /api/v2/virtual-clusters/{vc}/sku-types``: a SKU per GPU model (or CPU node
    kind), as HiveD names them, with what one GPU of it brings (a node's CPU and memory
    divided by its GPUs)."""
    skus: dict[str, Any] = {}
    for node in cluster.get("nodes") or []:
        capacity = node.get("capacity") or {}
        gpus = float(capacity.get("gpus") or 0)
        name = str(node.get("gpu_type") or ("cpu" if not gpus else "gpu"))
        per = gpus or 1.0
        skus.setdefault(
            name,
            {
                "cpu": round(float(capacity.get("cpu") or 0) / per, 3),
                "memory": int(float(capacity.get("memory_mb") or 0) / per),
                "gpu": 1 if gpus else 0,
            },
        )
    return skus
