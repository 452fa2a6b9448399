"""Tencent Cloud TI jobs (the ``tictl`` Job object, seed ``tencent-ti-job.md``) to and from
the canonical job. Pure: the runtime table is data, read once (``load_table``).

What goes where (docs/dialects/ti.md has the whole table):

- ``name`` -> the job name; ``cluster`` -> the queue. Names are unique per cluster, so
  the dialect key is ``"<cluster>/<name>"``.
- ``masterType`` / ``workerType`` / ``parameterServerType`` (machine types ``aUbGcP``)
  and ``workerCount`` / ``parameterServerCount`` -> roles ``worker``, ``ps``, ``master``.
- ``command`` + ``args`` -> one shell command, every item shell-quoted (exec semantics:
  no shell expansion; write ``["sh", "-c", "..."]`` for that).
- ``runtimeVersion`` -> image and kind through the runtime table (``ti_runtimes.yaml``,
  ``YARD_TI_RUNTIMES`` names another file).
- ``packageDir`` -> data sources, in order.
- ``createTime`` / ``startTime`` / ``endTime`` / ``state`` / ``message`` are output only:
  ignored on input, with a warning. :func:`render` produces them.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..events import FieldIssue
from ..jobspec import (
    TF_PORT_LABEL,
    DataSource,
    EnvVar,
    JobKind,
    JobSpec,
    PortSpec,
    Resources,
    RoleSpec,
)
from ..limits import MAX_DIGITS
from .fields import mapping
from .registry import Dialect
from .translation import (
    INT_MAX,
    JOB_NAME_RE,
    JOB_NAME_RULE,
    Issues,
    Translation,
    empty_spec,
    join,
    json_type,
    show,
)

DIALECT = "ti"
RUNTIMES_ENV = "YARD_TI_RUNTIMES"

INPUT_KEYS = frozenset(
    {
        "name",
        "masterType",
        "workerType",
        "parameterServerType",
        "workerCount",
        "parameterServerCount",
        "packageDir",
        "command",
        "args",
        "cluster",
        "runtimeVersion",
    }
)
OUTPUT_ONLY = ("createTime", "startTime", "endTime", "state", "message")
# tictl's --region is no field of the Job object; the CLI sends it here and it is kept
# as a label so the job still says where it was meant to run.
REGION_KEY = "region"
REGION_LABEL = "ti.region"
# Keys only a TI job has: detection needs one of them, or a cluster beside a name.
_SIGNATURE_KEYS = frozenset(
    {
        "masterType",
        "workerType",
        "parameterServerType",
        "workerCount",
        "parameterServerCount",
        "packageDir",
        "runtimeVersion",
    }
)

MACHINE_TYPE_RE = re.compile(r"([0-9]+)U([0-9]+)G([0-9]+)P")  # \d takes "١" too
MACHINE_TYPE_RULE = "aUbGcP (a CPU units, b GB memory, c GPUs; 0 for the default), e.g. 1U2G1P"

# (role name, machine type key, count key) in the order roles appear in the spec:
# worker first (a job always has workers), ps next, master last.
ROLES = (
    ("worker", "workerType", "workerCount"),
    ("ps", "parameterServerType", "parameterServerCount"),
    ("master", "masterType", None),
)
_TYPE_KEY = {name: type_key for name, type_key, _ in ROLES}
_COUNT_KEY = {"worker": "workerCount", "ps": "parameterServerCount", "master": "masterType"}

# --------------------------------------------------------------------------- the table


class TableError(ValueError):
    """The runtime table file is missing or malformed (an operator's mistake)."""


@dataclass(frozen=True)
class Runtime:
    name: str
    image: str | None
    kind: JobKind
    python: str
    gpu: bool
    purpose: str = "training"
    description: str = ""

    @property
    def tfplus(self) -> bool:
        return self.name.startswith("tfplus-")


@dataclass(frozen=True)
class Table:
    runtimes: dict[str, Runtime]
    default_cpu: float = 1.0
    default_memory_mb: int = 2048
    default_runtime: str | None = None


def parse_table(data: Any, source: str = "the TI runtime table") -> Table:
    if not isinstance(data, dict) or not isinstance(data.get("runtimes"), dict):
        raise TableError(f"{source}: expected a mapping with a 'runtimes' mapping")
    defaults = data.get("machine_defaults") or {}
    runtimes: dict[str, Runtime] = {}
    for name, entry in data["runtimes"].items():
        if not isinstance(entry, dict):
            raise TableError(f"{source}: runtime {name!r} must be a mapping")
        try:
            runtimes[str(name)] = Runtime(
                name=str(name),
                image=entry.get("image") or None,
                kind=JobKind(entry.get("kind", "generic")),
                python=str(entry.get("python", "")),
                gpu=bool(entry.get("gpu", False)),
                purpose=str(entry.get("purpose", "training")),
                description=str(entry.get("description", "")),
            )
        except ValueError as exc:
            raise TableError(f"{source}: runtime {name!r}: {exc}") from None
    default_runtime = data.get("default_runtime")
    if default_runtime is not None and default_runtime not in runtimes:
        raise TableError(f"{source}: default_runtime {default_runtime!r} is not in runtimes")
    try:
        cpu = float(defaults.get("cpu", 1))
        memory = int(defaults.get("memory_mb", 2048))
    except (TypeError, ValueError) as exc:
        raise TableError(f"{source}: machine_defaults: {exc}") from None
    if cpu <= 0 or memory < 100:
        raise TableError(f"{source}: machine_defaults need cpu > 0 and memory_mb >= 100")
    return Table(runtimes, cpu, memory, default_runtime)


def load_table(path: str | Path | None = None) -> Table:
    """The table in ``path``, else the one shipped beside this module."""
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TableError(f"{RUNTIMES_ENV}={path}: {exc}") from None
        source = str(path)
    else:
        text = resources.files(__package__).joinpath("ti_runtimes.yaml").read_text()
        source = "ti_runtimes.yaml"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TableError(f"{source}: not valid YAML: {exc}") from None
    return parse_table(data, source)


@cache
def configured_table() -> Table:
    return load_table(os.environ.get(RUNTIMES_ENV) or None)


# ------------------------------------------------------------------------ machine types


@dataclass(frozen=True)
class Machine:
    cpu: float
    memory_mb: int
    gpu: int
    # A 0 for CPU or memory: the default is reserved, and the task not held to it.
    uncapped: tuple[str, ...] = ()


def parse_machine_type(value: str, table: Table) -> Machine:
    """``aUbGcP`` -> a machine; "" means the defaults with no GPU. ValueError with the
    rule when the text is not a machine type."""
    if value == "":
        return Machine(table.default_cpu, table.default_memory_mb, 0)
    match = MACHINE_TYPE_RE.fullmatch(value)
    if match is None:
        raise ValueError(f"{show(value)} is not a machine type; expected {MACHINE_TYPE_RULE}")
    if any(len(part) > MAX_DIGITS for part in match.groups()):  # int() refuses 4300
        raise ValueError(f"{show(value)} asks for more than any machine has")
    cpu, memory_gb, gpu = (int(part) for part in match.groups())
    if cpu > INT_MAX or memory_gb * 1024 > INT_MAX or gpu > INT_MAX:
        raise ValueError(f"{show(value)} asks for more than any machine has")
    return Machine(
        cpu=float(cpu) if cpu else table.default_cpu,
        memory_mb=memory_gb * 1024 if memory_gb else table.default_memory_mb,
        gpu=gpu,
        # "不限制 cpu，内存" (the seed's tfplus example, 0U0G2P).
        uncapped=tuple(k for k, v in (("cpu", cpu), ("memory", memory_gb)) if not v),
    )


# -------------------------------------------------------------------------- field paths


def field_path(payload: Any, role: str | None, field: str) -> str:
    """Where a canonical field is written in a TI payload: a role's resources all come
    from its machine type (``workerType``, ``parameterServerType``, ``masterType``); in a
    Cloud API body, by its PascalCase name."""
    if is_cloud_api(payload):
        return cloud_path(field_path({}, role, field))
    if role is None:
        return {
            "name": "$.name",
            "queue": "$.cluster",
            "image": "$.runtimeVersion",
            "kind": "$.runtimeVersion",
            "data_sources": "$.packageDir",
            "labels": f"$.{REGION_KEY}",
        }.get(field, "$")
    if field == "image":
        return "$.runtimeVersion"
    if field == "command":
        return "$.command"
    if role not in _TYPE_KEY:
        return "$"
    if field == "replicas":
        return f"$.{_COUNT_KEY[role]}"
    return f"$.{_TYPE_KEY[role]}"


# -------------------------------------------------------------------------- translation


def _string_list(
    payload: dict[str, Any], key: str, issues: Issues, *, required: bool
) -> list[str] | None:
    where = f"$.{key}"
    value = payload.get(key)
    if value is None:
        if required:
            issues.error(where, f"{key} is required (a list of strings)", "required")
        return None
    if not isinstance(value, list):
        issues.error(where, f"{key} must be a list of strings, not {json_type(value)}", "type")
        return None
    items: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            issues.error(
                f"{where}[{i}]", f"{key}[{i}] must be a string, not {json_type(item)}", "type"
            )
        else:
            items.append(item)
    return items


def _machine(payload: dict[str, Any], key: str, table: Table, issues: Issues) -> Machine:
    value = payload.get(key)
    if value is None:
        return parse_machine_type("", table)
    if not isinstance(value, str):
        issues.error(
            f"$.{key}",
            f"{key} must be a string ({MACHINE_TYPE_RULE}), not {json_type(value)}",
            "type",
        )
        return parse_machine_type("", table)
    try:
        return parse_machine_type(value, table)
    except ValueError as exc:
        issues.error(f"$.{key}", f"{key}: {exc}", "machine_type")
        return parse_machine_type("", table)


def _runtime(payload: dict[str, Any], table: Table, issues: Issues) -> Runtime | None:
    value = payload.get("runtimeVersion")
    if value is None or value == "":
        return table.runtimes.get(table.default_runtime) if table.default_runtime else None
    if not isinstance(value, str):
        issues.error(
            "$.runtimeVersion", f"runtimeVersion must be a string, not {json_type(value)}", "type"
        )
        return None
    runtime = table.runtimes.get(value)
    if runtime is None:
        training = sorted(n for n, r in table.runtimes.items() if r.purpose == "training")
        issues.error(
            "$.runtimeVersion",
            f"runtimeVersion {show(value)} is unknown; training runtimes: {', '.join(training)}",
            "unknown_runtime",
        )
        return None
    if runtime.purpose != "training":
        # A Job trains; a serving image has no training entrypoint to run the command in.
        issues.error(
            "$.runtimeVersion",
            f"runtimeVersion {show(value)} is a {runtime.purpose} "
            "runtime; a job needs a training runtime (tf-*, tia-* or tfplus-*)",
            "serving_runtime",
        )
        return None
    return runtime


def _package_dirs(dirs: list[str]) -> list[DataSource]:
    # An absolute local path is available to the task where it is; anything else (a
    # cos:// URI, a relative path) is given a place of its own, by position.
    return [
        DataSource(source=d, mount_path=d if d.startswith("/") else f"/ti/packages/{i}")
        for i, d in enumerate(dirs)
    ]


# The Tencent Cloud API's own job body (``tccli tia CreateJob``, the TIA 2018-02-26 SDKs):
# the same job in PascalCase, plus ScaleTier, Debug and RuntimeConf.
CLOUD_KEYS = {
    "Name": "name",
    "Cluster": "cluster",
    "RuntimeVersion": "runtimeVersion",
    "PackageDir": "packageDir",
    "Command": "command",
    "Args": "args",
    "MasterType": "masterType",
    "WorkerType": "workerType",
    "ParameterServerType": "parameterServerType",
    "WorkerCount": "workerCount",
    "ParameterServerCount": "parameterServerCount",
}
CLOUD_ONLY = ("ScaleTier", "Debug", "RuntimeConf")
_TO_CLOUD = {camel: pascal for pascal, camel in CLOUD_KEYS.items()}
# ScaleTier: CUSTOM takes the machine types given; BASIC is one worker of the default
# machine type, BASIC_GPU one with a GPU. The tiers that stand for Tencent's own fleets
# (STANDARD_1, PREMIUM_1, BASIC_TPU) have no meaning on a cluster of other machines.
SCALE_TIERS = {"CUSTOM": None, "BASIC": "", "BASIC_GPU": "0U0G1P"}


def is_cloud_api(payload: Any) -> bool:
    """A body in the Tencent Cloud API's PascalCase (and none of tictl's fields)."""
    return (
        isinstance(payload, dict)
        and any(k in CLOUD_KEYS or k in CLOUD_ONLY for k in payload)
        and not any(k in INPUT_KEYS for k in payload)
    )


def cloud_path(path: str) -> str:
    """A camelCase field path (``$.workerType``) as the Cloud API body names it."""
    head, dot, rest = path.removeprefix("$.").partition(".")
    bracket = head.find("[")
    key, tail = (head[:bracket], head[bracket:]) if bracket >= 0 else (head, "")
    if path.startswith("$.") and key in _TO_CLOUD:
        return f"$.{_TO_CLOUD[key]}{tail}{dot}{rest}"
    return path


def _from_cloud_api(payload: dict[str, Any], issues: Issues) -> tuple[dict[str, Any], bool]:
    """The tictl-shaped job a Cloud API body stands for, and its Debug flag."""
    out = {CLOUD_KEYS.get(k, k): v for k, v in payload.items() if k not in CLOUD_ONLY}
    tier = payload.get("ScaleTier")
    if tier is not None and tier != "":
        if not isinstance(tier, str) or tier.upper() not in SCALE_TIERS:
            issues.error(
                "$.ScaleTier",
                f"ScaleTier {show(tier)} is not offered here: use CUSTOM with MasterType, "
                "WorkerType, WorkerCount (and the parameter server's), or BASIC / BASIC_GPU",
                "enum",
            )
        elif (machine := SCALE_TIERS[tier.upper()]) is not None:
            for key in ("MasterType", "WorkerType", "ParameterServerType", "WorkerCount",
                        "ParameterServerCount"):  # fmt: skip
                if _given(payload.get(key)):
                    issues.warn(
                        f"$.{key}",
                        f"{key} is ignored: ScaleTier {tier} sets the job's machines "
                        "(CUSTOM takes them)",
                        "unused_type",
                    )
            for key in ("masterType", "parameterServerType", "parameterServerCount"):
                out.pop(key, None)
            out["workerType"], out["workerCount"] = machine, 1
    debug = payload.get("Debug")
    if debug is not None and not isinstance(debug, bool):
        issues.error("$.Debug", f"Debug must be a boolean, not {json_type(debug)}", "type")
    conf = _string_list(payload, "RuntimeConf", issues, required=False)
    if conf:
        issues.warn(
            "$.RuntimeConf",
            "RuntimeConf is kept but not applied: the runtime's settings are the platform's",
            "not_applied",
        )
    return out, debug is True


def translate_ti(
    payload: Any, user: str = "", table: Table | None = None, *, cloud: bool | None = None
) -> Translation:
    """Any input to a JobSpec plus the TI errors and warnings; never raises. A Tencent
    Cloud API body (PascalCase) is read as the tictl job it stands for, its problems
    named by its own fields. ``cloud``: the body is one (the Cloud API's CreateJob, even
    an empty one), or is not; None: told by its keys."""
    if cloud is None:
        cloud = is_cloud_api(payload)
    if cloud and isinstance(payload, dict):
        said = Issues()
        job, debug = _from_cloud_api(payload, said)
        done = translate_ti(job, user, table, cloud=False)
        errors = [
            *said.errors,
            *(e.model_copy(update={"path": cloud_path(e.path)}) for e in done.errors),
        ]
        warnings = [
            *said.warnings,
            *(w.model_copy(update={"path": cloud_path(w.path)}) for w in done.warnings),
        ]
        spec = done.spec.model_copy(update={"keep_failed_for_debug": debug})
        return Translation(spec, DIALECT, errors, warnings, key=done.key)
    issues = Issues()
    if not isinstance(payload, dict):
        issues.error("$", f"a TI job must be a JSON object, not {json_type(payload)}", "type")
        return Translation(empty_spec(user=user), DIALECT, issues.errors)
    if table is None:
        try:
            table = configured_table()
        except TableError as exc:
            issues.error(
                "$.runtimeVersion", f"the TI runtime table could not be read: {exc}", "config"
            )
            return Translation(empty_spec(payload.get("name"), user), DIALECT, issues.errors)

    name = issues.string(
        payload, "name", "$", required=True, non_blank=True, pattern=JOB_NAME_RE, rule=JOB_NAME_RULE
    )
    # A slash would make "<cluster>/<name>" keys ambiguous.
    cluster = issues.string(
        payload,
        "cluster",
        "$",
        required=True,
        non_blank=True,
        pattern=JOB_NAME_RE,
        rule=JOB_NAME_RULE,
    )
    region = issues.string(payload, REGION_KEY, "$", required=False)
    command = _string_list(payload, "command", issues, required=True)
    if command is not None and not command:
        issues.error("$.command", "command must hold at least one item", "required")
    args = _string_list(payload, "args", issues, required=False) or []
    dirs = _string_list(payload, "packageDir", issues, required=False) or []
    if command and re.search(r"\s", command[0]):
        issues.warn(
            "$.command[0]",
            f"command[0] {show(command[0])} holds spaces; it is run "
            "as one program name. Split it into items (tictl splits --command)",
            "command_spaces",
        )
    runtime = _runtime(payload, table, issues)
    # 0 workers is a master alone (the Cloud API's CUSTOM tier asks for WorkerCount with
    # MasterType); without a master a job needs a worker.
    workers = issues.integer(payload, "workerCount", "$", required=False, minimum=0)
    if workers == 0 and not _given(payload.get("masterType")):
        issues.error(
            "$.workerCount",
            "workerCount must be at least 1 without a masterType (a job needs a machine)",
            "range",
        )
    ps_count = issues.integer(payload, "parameterServerCount", "$", required=False, minimum=0)
    machines = {role: _machine(payload, type_key, table, issues) for role, type_key, _ in ROLES}

    for key in OUTPUT_ONLY:
        if key in payload:
            issues.warn(
                f"$.{key}",
                f"{key} is output only (set by the platform); the value given is ignored",
                "output_only",
            )
    for key in sorted(
        k
        for k in map(str, payload)
        if k not in INPUT_KEYS and k not in OUTPUT_ONLY and k != REGION_KEY
    ):
        issues.warn(join("$", key), f"unknown field {show(key)} is ignored", "unknown_field")

    replicas = {
        "worker": 1 if workers is None else workers,
        "ps": ps_count or 0,
        "master": 1 if _given(payload.get("masterType")) else 0,
    }
    if (
        replicas["ps"] == 0
        and _given(payload.get("parameterServerType"))
        and (runtime is None or not runtime.tfplus)
    ):
        issues.warn(
            "$.parameterServerType",
            "parameterServerType is ignored: parameterServerCount is 0 or not given",
            "unused_type",
        )
    if replicas["worker"] == 0 and _given(payload.get("workerType")):
        issues.warn("$.workerType", "workerType is ignored: workerCount is 0", "unused_type")
    _runtime_rules(runtime, payload, replicas, machines, issues)

    kind = runtime.kind if runtime is not None else JobKind.TENSORFLOW
    shell = shlex.join([*(command or []), *args])
    roles = [
        _role(role, replicas[role], machines[role], shell, kind, runtime, replicas)
        for role, _, _ in ROLES
        if replicas[role] > 0
    ]
    spec = JobSpec(
        name=name or "",
        kind=kind,
        user=user,
        queue=cluster or "default",
        image=runtime.image if runtime is not None else None,
        labels=[EnvVar(name=REGION_LABEL, value=region)] if region else [],
        data_sources=_package_dirs(dirs),
        roles=roles,
    )
    dialect_key = f"{cluster}/{name}" if name and cluster else None
    return Translation(spec, DIALECT, issues.errors, issues.warnings, key=dialect_key)


def _given(value: Any) -> bool:
    # Form-built payloads send "" for a field left blank: that is "not given".
    return value is not None and value != ""


def _runtime_rules(
    runtime: Runtime | None,
    payload: dict[str, Any],
    replicas: dict[str, int],
    machines: dict[str, Machine],
    issues: Issues,
) -> None:
    if runtime is None:
        return
    used = [role for role, _, _ in ROLES if replicas[role] > 0]
    if runtime.tfplus:
        # Seed: tfplus has no CPU build, uses at least one GPU, and has no ps.
        for role in used:
            if role != "ps" and machines[role].gpu < 1:  # a ps is an error of its own
                key = _TYPE_KEY[role]
                issues.error(
                    f"$.{key}",
                    f"{runtime.name} runs on GPUs only: {key} must ask "
                    f"for at least one GPU per {role} (e.g. 0U0G1P), got "
                    f"{show(payload.get(key, ''))}",
                    "tfplus_gpu",
                )
        if ps_given := payload.get("parameterServerCount"):
            issues.error(
                "$.parameterServerCount",
                f"{runtime.name} has no parameter servers; "
                f"parameterServerCount must be 0, got {show(ps_given)}",
                "tfplus_ps",
            )
        if _given(payload.get("parameterServerType")):
            issues.error(
                "$.parameterServerType",
                f"{runtime.name} has no parameter servers; leave parameterServerType out",
                "tfplus_ps",
            )
        return
    if runtime.gpu and not any(machines[role].gpu for role in used):
        issues.warn(
            "$.runtimeVersion",
            f"{runtime.name} is a GPU build but no machine type "
            "asks for a GPU; the job runs on CPU only",
            "gpu_runtime_without_gpu",
        )
    if not runtime.gpu:
        for role in used:
            if machines[role].gpu:
                key = _TYPE_KEY[role]
                issues.warn(
                    f"$.{key}",
                    f"{runtime.name} is a CPU build; the "
                    f"{machines[role].gpu} GPU(s) {key} asks for go unused "
                    f"(use {runtime.name.replace('-py3', '')}-gpu"
                    f"{'-py3' if runtime.name.endswith('-py3') else ''})",
                    "cpu_runtime_with_gpu",
                )


def _role(
    name: str,
    replicas: int,
    machine: Machine,
    shell: str,
    kind: JobKind,
    runtime: Runtime | None,
    all_replicas: dict[str, int],
) -> RoleSpec:
    # Parameter servers serve until killed: the job succeeds when the master does, or
    # when every worker did (Kubeflow TFJob's rule), and a failed ps fails it.
    if all_replicas["master"]:
        min_succeeded = 1 if name == "master" else None
    else:
        min_succeeded = replicas if name == "worker" else None
    return RoleSpec(
        name=name,
        replicas=replicas,
        resources=Resources(
            cpu=machine.cpu,
            memory_mb=machine.memory_mb,
            gpu=float(machine.gpu),
            uncapped=list(machine.uncapped),
        ),
        image=runtime.image if runtime is not None else None,
        command=shell,
        ports=[PortSpec(label=TF_PORT_LABEL, count=1)] if kind is JobKind.TENSORFLOW else [],
        min_failed=1,
        min_succeeded=min_succeeded,
    )


def validate_ti(payload: Any, spec: JobSpec | None = None) -> list[FieldIssue]:
    return translate_ti(payload).errors


def ti_warnings(payload: Any, spec: JobSpec | None = None) -> list[FieldIssue]:
    return translate_ti(payload).warnings


def _looks_like(payload: dict[str, Any]) -> bool:
    if "apiVersion" in payload or "metadata" in payload:
        return False  # a Kubernetes-style resource (T9k, Kubeflow) that has a cluster key
    if "RuntimeVersion" in payload or "ScaleTier" in payload:
        return True  # the Tencent Cloud API's body
    if "Cluster" in payload and "Name" in payload and "JobSpecs" not in payload:
        return True
    if any(key in payload for key in _SIGNATURE_KEYS):
        return True
    return "cluster" in payload and "name" in payload and "roles" not in payload


# ------------------------------------------------------------------------------ the view

# Canonical state -> TI's four. Everything before a task runs is Created; a stopped or
# rejected job did not succeed, so it is Failed and the message says why.
STATES = {
    "SUBMITTED": "Created",
    "ACCEPTED": "Created",
    "QUEUED": "Created",
    "PLACED": "Created",
    "RUNNING": "Running",
    "SUCCEEDED": "Succeeded",
    "FAILED": "Failed",
    "STOPPED": "Failed",
    "REJECTED": "Failed",
    # TI has no pause: a paused job has not ended and runs again once resumed.
    "PAUSED": "Created",
}


# The input fields a view echoes back, in the seed's order.
INPUT_ORDER = (
    "name",
    "masterType",
    "workerType",
    "parameterServerType",
    "workerCount",
    "parameterServerCount",
    "packageDir",
    "command",
    "args",
    "cluster",
    "runtimeVersion",
    REGION_KEY,
)


def rfc3339(value: Any) -> str | None:
    """A stored time as RFC 3339 in UTC (``2024-05-01T12:00:00.123Z``); naive values are
    UTC, as MongoDB returns them."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    text = value.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _message(view: dict[str, Any]) -> str:
    state = view.get("state")
    reason = view.get("reason") or ""
    if state == "STOPPED":
        return f"stopped: {reason}" if reason else "stopped"
    if state == "REJECTED":
        errors = view.get("errors") or []
        text = "; ".join(
            f"{e.get('path')}: {e.get('message')}" for e in errors if isinstance(e, dict)
        )
        return f"rejected: {text or reason or 'invalid job'}"
    return reason


def render(view: dict[str, Any]) -> dict[str, Any]:
    """TI's view of a job from the canonical job view (status's ``job_view``), plus
    ``original`` (the payload as submitted) and ``started_at`` when known."""
    original = mapping(view.get("original"))
    if is_cloud_api(original):
        original = {CLOUD_KEYS.get(k, k): v for k, v in original.items()}
    spec = mapping(view.get("spec"))
    out: dict[str, Any] = {key: original[key] for key in INPUT_ORDER if key in original}
    out["name"] = view.get("name") if view.get("name") is not None else original.get("name")
    out["cluster"] = original.get("cluster", view.get("queue") or spec.get("queue"))
    out["createTime"] = rfc3339(view.get("submitted_at"))
    out["startTime"] = rfc3339(view.get("started_at"))
    out["endTime"] = rfc3339(view.get("finished_at"))
    out["state"] = STATES.get(str(view.get("state")), "Created")
    out["message"] = _message(view)
    out["id"] = view.get("id")
    return out


REGISTRATION = Dialect(
    name=DIALECT,
    signature="ti (an object with runtimeVersion, workerType, workerCount, packageDir, ... "
    "or with cluster and name)",
    looks_like=_looks_like,
    translate=lambda payload, user: translate_ti(payload, user),
    field_path=field_path,
    validate=validate_ti,
    warnings=ti_warnings,
)


def go_time(value: Any) -> str | None:
    """A time as the Cloud API writes it (Go's default format, UTC):
    ``2006-01-02 15:04:05.999999999 -0700 MST``."""
    text = rfc3339(value)
    if text is None:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + " +0000 UTC"


def render_cloud(view: dict[str, Any]) -> dict[str, Any]:
    """The Cloud API's ``Job`` (DescribeJob, ListJobs, CreateJob): TI's view in
    PascalCase, its times in Go's format, with the Cloud API's own fields."""
    plain = render(view)
    original = mapping(view.get("original"))
    job: dict[str, Any] = {
        _TO_CLOUD[k]: v for k, v in plain.items() if k in _TO_CLOUD and v is not None
    }
    job["CreateTime"] = go_time(view.get("submitted_at"))
    job["StartTime"] = go_time(view.get("started_at"))
    job["EndTime"] = go_time(view.get("finished_at"))
    job["State"] = plain["state"]
    job["Message"] = plain["message"]
    job["Id"] = plain["id"]
    # A rejected job's body is on record as sent: only what has the SDK's types is shown.
    tier, conf = original.get("ScaleTier"), original.get("RuntimeConf")
    job["ScaleTier"] = tier if isinstance(tier, str) and tier else "CUSTOM"
    job["Debug"] = original.get("Debug") is True
    job["RuntimeConf"] = (
        conf if isinstance(conf, list) and all(isinstance(c, str) for c in conf) else []
    )
    job["Uin"] = view.get("user")
    return {k: v for k, v in job.items() if v is not None}
