"""Alibaba Cloud PAI-DLC (API version 2020-12-03): the CreateJob body to the canonical
job, and the canonical job back to DLC's GetJob / ListJobs shapes.

Pure, except ``catalog_from_env``, which reads the instance-type catalog a deployment
may name in ``YARD_DLC_ECS_CATALOG`` (once; the pure functions take a catalog).

DLC names jobs by id only (display names need not be unique), so ``Translation.key``
is None. Data-source and code-source ids are resolved by intake against its registry
and passed in as ``Sources``; unresolved, the id itself stands for the source.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..events import FieldIssue
from ..jobspec import (
    ALL_TASKS,
    TF_PORT_LABEL,
    CodeSource,
    DataSource,
    EnvVar,
    JobKind,
    JobSpec,
    PortSpec,
    Resources,
    RoleSpec,
    TaskRef,
    env_list,
)
from ..limits import digits, in_utc
from ..parsing import BodyError, parse_json
from .fields import mapping, sequence, text
from .registry import Dialect
from .translation import (
    INT_MAX,
    ROLE_NAME_RE,
    Issues,
    Translation,
    empty_spec,
    env_problem,
    join,
    json_type,
    show,
)

DIALECT = "dlc"
CATALOG_ENV = "YARD_DLC_ECS_CATALOG"

# JobType (case-sensitive, as DLC checks it) -> kind; the list is CreateJobRequest's
# in alibabacloud_pai_dlc20201203 1.11.6.
JOB_TYPES: dict[str, JobKind] = {
    "TFJob": JobKind.TENSORFLOW,
    "PyTorchJob": JobKind.PYTORCH,
    "XGBoostJob": JobKind.XGBOOST,
    "MPIJob": JobKind.MPI,
    "OneFlowJob": JobKind.GENERIC,
    "ElasticBatchJob": JobKind.GENERIC,
    "SlurmJob": JobKind.GENERIC,
    "RayJob": JobKind.GENERIC,
    "DataJuicerJob": JobKind.GENERIC,
}
KIND_TO_TYPE = {
    JobKind.TENSORFLOW: "TFJob",
    JobKind.PYTORCH: "PyTorchJob",
    JobKind.XGBOOST: "XGBoostJob",
    JobKind.MPI: "MPIJob",
}

# The node types each job type has (the SDK's JobSpec.Type documentation). Another
# type is run as asked, with a warning: DLC itself would refuse it.
ROLE_TYPES: dict[str, tuple[str, ...]] = {
    "TFJob": ("Chief", "PS", "Worker", "Evaluator", "GraphLearn"),
    "PyTorchJob": ("Worker", "Master"),
    "XGBoostJob": ("Worker", "Master"),
    "OneFlowJob": ("Worker", "Master"),
    "ElasticBatchJob": ("Worker", "Master"),
    "MPIJob": ("Launcher", "Worker"),
    "RayJob": ("Head", "Worker"),
}
# The role whose success is the job's success, when the job has it (Kubeflow's
# operators: a TFJob with a Chief ends with the Chief; without one, with its Workers).
LEADER_ROLES = ("Chief", "Master", "Launcher", "Head")

JOB_KEYS = frozenset(
    {
        "DisplayName",
        "JobType",
        "JobSpecs",
        "UserCommand",
        "DataSources",
        "CodeSource",
        "ThirdpartyLibs",
        "ThirdpartyLibDir",
        "Envs",
        "JobMaxRunningTimeMinutes",
        "WorkspaceId",
        "ResourceId",
        "Priority",
        # Who may see the job in its workspace: kept for ListJobs' Accessibility filter.
        "Accessibility",
        "SuccessPolicy",
        # Its PipelineId, for ListJobs' filter; its other fields are warned.
        "Settings",
    }
)
SETTINGS_KEYS = frozenset({"PipelineId"})
# CreateJob's SuccessPolicy (TensorFlow jobs only): AllWorkers, its default, ends the
# job when every Worker (and the Chief, if any) succeeded; ChiefWorker when the Chief
# did (Worker 0 without a Chief).
SUCCESS_POLICIES = ("AllWorkers", "ChiefWorker")
SPEC_KEYS = frozenset({"Type", "Image", "PodCount", "EcsSpec", "ResourceConfig"})
RESOURCE_KEYS = frozenset({"CPU", "GPU", "Memory", "SharedMemory", "GPUType"})
DATA_SOURCE_KEYS = frozenset({"DataSourceId", "MountPath", "Uri"})
CODE_SOURCE_KEYS = frozenset({"CodeSourceId", "Branch", "Commit", "MountPath"})

DEFAULT_PRIORITY = 1
# CreateJobRequest.display_name (the SDK): at most 256 characters of digits, letters,
# underscores, periods and hyphens.
DISPLAY_NAME_RE = re.compile(r"[0-9A-Za-z_.-]+")
DISPLAY_NAME_RULE = "DLC's job name rule: digits, letters, '_', '.' and '-' only"
DISPLAY_NAME_MAX = 256
DEFAULT_CODE_MOUNT = "/root/code/"
DEFAULT_SHM_MB = 64


# ------------------------------------------------------------------ instance types


@dataclass(frozen=True)
class EcsType:
    cpu: float
    memory_gib: float
    gpu: float = 0
    gpu_type: str | None = None
    gpu_memory_gib: float | None = None  # per GPU


def parse_catalog(document: Any, base: Mapping[str, EcsType] | None = None) -> dict[str, EcsType]:
    """A catalog file's entries over ``base`` (the built-in table by default). The file
    maps instance types to ``{cpu, memory_gib, gpu, gpu_type, gpu_memory_gib}``;
    ValueError names a bad entry."""
    catalog = dict(BUILTIN_CATALOG if base is None else base)
    if document is None:
        return catalog
    if not isinstance(document, dict):
        raise ValueError(f"{CATALOG_ENV}: the catalog must map instance types to entries")
    for name, entry in document.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{CATALOG_ENV}: {name!r} must be a mapping")
        try:
            catalog[str(name)] = EcsType(
                cpu=float(entry["cpu"]),
                memory_gib=float(entry["memory_gib"]),
                gpu=float(entry.get("gpu", 0) or 0),
                gpu_type=entry.get("gpu_type"),
                gpu_memory_gib=None
                if entry.get("gpu_memory_gib") is None
                else float(entry["gpu_memory_gib"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{CATALOG_ENV}: {name!r} needs numeric cpu and memory_gib ({exc!r})"
            ) from None
    return catalog


# The instance types of Alibaba Cloud's public spec tables (dlc_ecs_types.yaml says
# which, and from where).
BUILTIN_CATALOG: dict[str, EcsType] = parse_catalog(
    yaml.safe_load(resources.files(__package__).joinpath("dlc_ecs_types.yaml").read_text()),
    {},
)


@lru_cache(maxsize=4)
def _catalog_file(path: str) -> dict[str, EcsType]:
    return parse_catalog(yaml.safe_load(Path(path).read_text()))


def catalog_from_env() -> dict[str, EcsType]:
    path = os.environ.get(CATALOG_ENV)
    return _catalog_file(path) if path else BUILTIN_CATALOG


# ---------------------------------------------------------------------- quantities

_QUANTITY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")
_MEMORY_UNITS_MB = {
    "": 1 / 2**20,
    "b": 1 / 2**20,
    "k": 1000 / 2**20,
    "ki": 1 / 1024,
    "m": 10**6 / 2**20,
    "mi": 1,
    "g": 10**9 / 2**20,
    "gi": 1024,
    "t": 10**12 / 2**20,
    "ti": 1024**2,
}


def _quantity(value: Any) -> tuple[float, str] | None:
    """A quantity's number and unit; None for anything else, and for a number no float
    holds (an integer of 310 digits overflowed float(); a string of them read as inf)."""
    if isinstance(value, bool):
        return None
    number: float | str
    if isinstance(value, int | float):
        number, unit = value, ""
    elif isinstance(value, str) and (match := _QUANTITY.fullmatch(value)):
        number, unit = match.group(1), match.group(2)
    else:
        return None
    try:
        parsed = float(number)
    except OverflowError:
        return None
    return (parsed, unit) if math.isfinite(parsed) and parsed >= 0 else None


def parse_cpu(value: Any) -> float | None:
    """ "4", 4, "0.5", "500m" -> cores."""
    parsed = _quantity(value)
    if parsed is None or parsed[1] not in ("", "m"):
        return None
    number, unit = parsed
    return number / 1000 if unit == "m" else number


def parse_memory_mb(value: Any) -> int | None:
    """Kubernetes-style memory ("16Gi", "512Mi", "1G"; a bare number is bytes) -> MiB."""
    parsed = _quantity(value)
    if parsed is None:
        return None
    number, unit = parsed
    factor = _MEMORY_UNITS_MB.get(unit.lower())
    if factor is None:
        return None
    mb = number * factor
    return math.ceil(mb) if mb <= INT_MAX else None


def parse_gpu(value: Any) -> float | None:
    parsed = _quantity(value)
    return parsed[0] if parsed is not None and parsed[1] == "" else None


def format_memory(mb: int) -> str:
    return f"{mb // 1024}Gi" if mb % 1024 == 0 else f"{mb}Mi"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# ---------------------------------------------------------------- source registry


@dataclass(frozen=True)
class ResolvedData:
    uri: str
    mount_path: str | None = None


@dataclass(frozen=True)
class ResolvedCode:
    repo: str
    branch: str | None = None
    commit: str | None = None
    mount_path: str | None = None


@dataclass
class Sources:
    """Registered data and code sources, by id, as intake resolved them."""

    data: dict[str, ResolvedData] = field(default_factory=dict)
    code: dict[str, ResolvedCode] = field(default_factory=dict)


def data_source_uri(item: Mapping[str, Any]) -> str:
    """Where a registered data source's files are: its ``Uri`` if given; a ``Path`` that
    is a URI (``file://…``, ``oss://…``) or, with no file system named, a local ``/…``
    path (the local backend); else ``<type>://<FileSystemId or Endpoint><Path>``."""
    uri = item.get("Uri")
    if isinstance(uri, str) and uri:
        return uri
    path = text(item.get("Path"))
    host = item.get("FileSystemId") or item.get("Endpoint") or ""
    # A Path on a NAS file system starts with "/" too: only without one is it local.
    if "://" in path or (path.startswith("/") and not host):
        return path
    kind = str(item.get("DataSourceType") or "nas").lower()
    return f"{kind}://{host}{'/' if path and not path.startswith('/') else ''}{path}"


# ---------------------------------------------------------------------- translation


_JOB_FIELDS = {
    "name": "DisplayName",
    "queue": "ResourceId",
    "priority": "Priority",
    "kind": "JobType",
    "env": "Envs",
    "roles": "JobSpecs",
    "max_running_minutes": "JobMaxRunningTimeMinutes",
    "pip_packages": "ThirdpartyLibs",
    "pip_requirements_dir": "ThirdpartyLibDir",
    "data_sources": "DataSources",
    "code_source": "CodeSource",
    "command": "UserCommand",
}
_ROLE_FIELDS = {"name": "Type", "replicas": "PodCount", "image": "Image"}
# Canonical resource -> its ResourceConfig key; without that key the JobSpec's EcsSpec
# (an instance type) is where the figure came from.
_RESOURCE_FIELDS = {
    "cpu": "CPU",
    "memory_mb": "Memory",
    "gpu": "GPU",
    "gpu_type": "GPUType",
    "shm_mb": "SharedMemory",
}


def _given(obj: Any, key: str) -> bool:
    return isinstance(obj, dict) and obj.get(key) not in (None, "")


def field_path(payload: Any, role: str | None, field_name: str) -> str:
    """Where a canonical field is written in a CreateJob body: a role is the JobSpec of
    its Type; a resource is ResourceConfig's figure if given, else the EcsSpec's."""
    payload = payload if isinstance(payload, dict) else {}
    if role is None or field_name == "command":
        key = _JOB_FIELDS.get(field_name)
        return f"$.{key}" if key else "$"
    specs = payload.get("JobSpecs")
    index = (
        next(
            (
                i
                for i, s in enumerate(specs)
                if isinstance(s, dict)
                and isinstance(s.get("Type"), str)
                and s["Type"].replace("-", "_") == role
            ),
            None,
        )
        if isinstance(specs, list)
        else None
    )
    if index is None:
        return "$.JobSpecs"
    path = f"$.JobSpecs[{index}]"
    spec = specs[index]
    if field_name in _ROLE_FIELDS:
        return f"{path}.{_ROLE_FIELDS[field_name]}"
    key = _RESOURCE_FIELDS.get(field_name)
    if key is None:
        return path
    if not _given(spec.get("ResourceConfig"), key) and _given(spec, "EcsSpec"):
        return f"{path}.EcsSpec"
    return f"{path}.ResourceConfig.{key}"


def _unsupported(
    obj: dict[str, Any], known: frozenset[str], path: str, issues: Issues, what: str
) -> None:
    # The SDK's to_map() sends every list field, empty ones as []: nothing to warn of.
    for key in sorted((k for k in obj if k not in known and obj[k] not in (None, [], {})), key=str):
        issues.warn(
            join(path, str(key)),
            f"{what} field {show(key)} is not supported by Trainyard; it is kept "
            "with the job but has no effect",
            "unsupported_field",
        )


def _resources(
    raw: dict[str, Any], path: str, catalog: Mapping[str, EcsType], issues: Issues
) -> Resources:
    ecs_name = issues.string(raw, "EcsSpec", path, required=False)
    config = raw.get("ResourceConfig")
    config_path = f"{path}.ResourceConfig"
    if config is not None and not isinstance(config, dict):
        issues.error(
            config_path, f"ResourceConfig must be an object, not {json_type(config)}", "type"
        )
        config = None
    config = config or {}
    if config:
        _unsupported(config, RESOURCE_KEYS, config_path, issues, "ResourceConfig")

    def given(key: str, parse: Any, rule: str) -> Any:
        if config.get(key) in (None, ""):
            return None
        value = parse(config[key])
        if value is None:
            issues.error(
                f"{config_path}.{key}", f"{key} {show(config[key])} must be {rule}", "invalid"
            )
        return value

    cpu = given("CPU", parse_cpu, 'a CPU count such as "4" or "500m"')
    memory = given("Memory", parse_memory_mb, 'a memory size such as "16Gi" or "512Mi"')
    gpu = given("GPU", parse_gpu, 'a GPU count such as "1"')
    shm = given("SharedMemory", parse_memory_mb, 'a memory size such as "8Gi"')
    gpu_type = config.get("GPUType") if isinstance(config.get("GPUType"), str) else None
    if config.get("GPUType") is not None and gpu_type is None:
        issues.error(f"{config_path}.GPUType", "GPUType must be a string", "type")

    base = catalog.get(ecs_name) if ecs_name else None
    if ecs_name and base is None:
        known = ", ".join(sorted(catalog)[:12])
        message = (
            f"EcsSpec {show(ecs_name)} is not in the instance-type catalog "
            f"({CATALOG_ENV} adds types); known: {known}, ..."
        )
        if cpu is not None and memory is not None:
            issues.warn(f"{path}.EcsSpec", message + "; ResourceConfig decides", "unknown_ecs")
        else:
            issues.error(f"{path}.EcsSpec", message, "unknown_ecs")
    if (
        base is None
        and not ecs_name
        and (cpu is None or memory is None)
        and not any(e.path.startswith(config_path) for e in issues.errors)
    ):
        issues.error(
            path,
            "each JobSpec needs an EcsSpec or a ResourceConfig with CPU and Memory",
            "required",
        )
    if cpu is not None and cpu <= 0:
        issues.error(f"{config_path}.CPU", "CPU must be more than 0", "range")
    if memory is not None and memory < 100:
        issues.error(f"{config_path}.Memory", "Memory must be at least 100Mi", "range")
    return Resources(
        cpu=cpu if cpu and cpu > 0 else (base.cpu if base else 1.0),
        memory_mb=memory
        if memory and memory >= 100
        else (math.ceil(base.memory_gib * 1024) if base else 1024),
        gpu=gpu if gpu is not None else (base.gpu if base else 0),
        gpu_type=gpu_type or (base.gpu_type if base else None),
        shm_mb=shm if shm is not None else DEFAULT_SHM_MB,
    )


def _roles(
    payload: dict[str, Any],
    job_type: str | None,
    command: str,
    catalog: Mapping[str, EcsType],
    issues: Issues,
) -> tuple[list[RoleSpec], list[list[TaskRef]]]:
    """The job's roles, and the success rules of a job whose success needs more than one
    role's count (a TFJob by its SuccessPolicy, a PyTorchJob with Master and Workers)."""
    raw_specs = payload.get("JobSpecs")
    if raw_specs is None:
        issues.error(
            "$.JobSpecs", "JobSpecs is required (a list with at least one JobSpec)", "required"
        )
        return [], []
    if not isinstance(raw_specs, list):
        issues.error("$.JobSpecs", f"JobSpecs must be a list, not {json_type(raw_specs)}", "type")
        return [], []
    if not raw_specs:
        issues.error("$.JobSpecs", "JobSpecs must hold at least one JobSpec", "required")
    roles: list[RoleSpec] = []
    first_use: dict[str, int] = {}
    allowed = ROLE_TYPES.get(job_type or "")
    # DLC gives every node of a TFJob TF_CONFIG, so each needs a port of its own.
    tf = JOB_TYPES.get(job_type or "") is JobKind.TENSORFLOW
    for i, raw in enumerate(raw_specs):
        path = f"$.JobSpecs[{i}]"
        if not isinstance(raw, dict):
            issues.error(path, f"a JobSpec must be an object, not {json_type(raw)}", "type")
            continue
        _unsupported(raw, SPEC_KEYS, path, issues, "JobSpec")
        kind = issues.string(raw, "Type", path, required=True, non_blank=True)
        # RayJob's "Worker-<group>" types: a role name holds no "-" (task ids join on it).
        name = kind.replace("-", "_") if kind else ""
        if kind and not ROLE_NAME_RE.fullmatch(name):
            issues.error(
                f"{path}.Type",
                f"Type {show(kind)} must be a node type such as Worker, PS, Chief or Master",
                "pattern",
            )
            name = ""
        elif name in first_use:
            issues.error(
                f"{path}.Type",
                f"Type {show(kind)} is already used by "
                f"JobSpecs[{first_use[name]}]; one JobSpec per node type",
                "duplicate",
            )
        elif name:
            first_use[name] = i
            base_type = kind.split("-")[0] if kind else ""
            if allowed is not None and base_type not in allowed:
                issues.warn(
                    f"{path}.Type",
                    f"{job_type} has no {show(kind)} nodes (it has "
                    f"{', '.join(allowed)}); the role runs as written",
                    "role_type",
                )
        image = issues.string(raw, "Image", path, required=True, non_blank=True)
        replicas = issues.integer(raw, "PodCount", path, required=False, minimum=1)
        roles.append(
            RoleSpec(
                name=name,
                replicas=replicas or 1,
                image=image,
                resources=_resources(raw, path, catalog, issues),
                command=command,
                ports=[PortSpec(label=TF_PORT_LABEL)] if tf else [],
            )
        )
    leaders = [r for r in roles if r.name in LEADER_ROLES]
    workers = [r for r in roles if r.name == "Worker"]
    succeeding = leaders[:1] or workers

    def ruled(*refs: TaskRef) -> tuple[list[RoleSpec], list[list[TaskRef]]]:
        # One success rule decides; no role's count does.
        return [r.model_copy(update={"min_succeeded": None}) for r in roles], [list(refs)]

    policy = _success_policy(payload, tf, issues)
    if policy and workers:
        # KubeDL's TFJob rules (controllers/tensorflow/status.go), which DLC runs:
        # AllWorkers waits for every Chief and every Worker; ChiefWorker (its default
        # rule) ends with the Chief, or without one with Worker 0.
        if policy == "AllWorkers" and leaders:
            return ruled(
                TaskRef(role=leaders[0].name, index=ALL_TASKS),
                TaskRef(role="Worker", index=ALL_TASKS),
            )
        if policy == "ChiefWorker" and not leaders:
            return ruled(TaskRef(role="Worker", index=0))
    masters = [r for r in leaders if r.name == "Master"]
    if JOB_TYPES.get(job_type or "") is JobKind.PYTORCH and masters and workers:
        # KubeDL's PyTorchJob (controllers/pytorch/status.go): the Master's success ends
        # the job once every Worker has succeeded too (Kubeflow's ends it with the Master
        # alone, stopping Workers that may still be writing).
        return ruled(
            TaskRef(role="Master", index=ALL_TASKS), TaskRef(role="Worker", index=ALL_TASKS)
        )
    if job_type in ROLE_TYPES and succeeding:
        # Kubeflow's rule: the leader's (or else the Workers') success is the job's;
        # parameter servers and evaluators never end by themselves.
        roles = [
            r.model_copy(update={"min_succeeded": r.replicas if r in succeeding else None})
            for r in roles
        ]
    return roles, []


def _success_policy(payload: dict[str, Any], tf: bool, issues: Issues) -> str | None:
    """The TFJob's SuccessPolicy (AllWorkers when left out); None for other jobs."""
    raw = payload.get("SuccessPolicy")
    if not tf:
        if raw not in (None, ""):
            issues.warn(
                "$.SuccessPolicy",
                "SuccessPolicy applies to TFJob only (as in DLC); it is kept but not used",
                "not_applied",
            )
        return None
    if raw in (None, ""):
        return "AllWorkers"
    if raw not in SUCCESS_POLICIES:
        issues.error(
            "$.SuccessPolicy",
            f"SuccessPolicy {show(raw)} must be one of {', '.join(SUCCESS_POLICIES)}",
            "enum",
        )
        return None
    return str(raw)


def _envs(payload: dict[str, Any], issues: Issues) -> dict[str, str]:
    envs = payload.get("Envs")
    if envs is None:
        return {}
    if not isinstance(envs, dict):
        issues.error(
            "$.Envs", f"Envs must be an object of names to values, not {json_type(envs)}", "type"
        )
        return {}
    out: dict[str, str] = {}
    for key, value in envs.items():
        if isinstance(value, dict | list):
            issues.error(
                join("$.Envs", str(key)),
                f"Envs value {show(key)} must be a string, not {json_type(value)}",
                "type",
            )
            continue
        if isinstance(value, float) and not math.isfinite(value):
            issues.error(join("$.Envs", str(key)), "Envs values must be finite", "type")
            continue
        if problem := env_problem(str(key), value if isinstance(value, str) else ""):
            issues.error(join("$.Envs", str(key)), problem)
            continue
        out[str(key)] = value
    return out


def _pipeline_id(payload: dict[str, Any], issues: Issues) -> str | None:
    """``Settings.PipelineId``: the pipeline a job belongs to (ListJobs' PipelineId)."""
    settings = payload.get("Settings")
    if settings is None:
        return None
    if not isinstance(settings, dict):
        issues.error("$.Settings", f"Settings must be an object, not {json_type(settings)}",
                     "type")  # fmt: skip
        return None
    _unsupported(settings, SETTINGS_KEYS, "$.Settings", issues, "Settings")
    return issues.string(settings, "PipelineId", "$.Settings", required=False) or None


def _data_sources(
    payload: dict[str, Any], sources: Sources | None, issues: Issues
) -> list[DataSource]:
    raw = payload.get("DataSources")
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.error("$.DataSources", f"DataSources must be a list, not {json_type(raw)}", "type")
        return []
    out = []
    for i, entry in enumerate(raw):
        path = f"$.DataSources[{i}]"
        if not isinstance(entry, dict):
            issues.error(path, f"a data source must be an object, not {json_type(entry)}", "type")
            continue
        _unsupported(entry, DATA_SOURCE_KEYS, path, issues, "DataSources")
        ds_id = issues.string(
            entry, "DataSourceId", path, required="Uri" not in entry, non_blank=True
        )
        uri = issues.string(entry, "Uri", path, required=False, non_blank=True)
        mount = issues.string(entry, "MountPath", path, required=False, non_blank=True)
        resolved = sources.data.get(ds_id) if sources and ds_id else None
        source = resolved.uri if resolved else (uri or ds_id)
        if not source:
            continue
        default_mount = (resolved.mount_path if resolved else None) or f"/root/data/{ds_id or i}"
        out.append(DataSource(source=source, mount_path=mount or default_mount))
    return out


def _code_source(
    payload: dict[str, Any], sources: Sources | None, issues: Issues
) -> CodeSource | None:
    raw = payload.get("CodeSource")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        issues.error("$.CodeSource", f"CodeSource must be an object, not {json_type(raw)}", "type")
        return None
    _unsupported(raw, CODE_SOURCE_KEYS, "$.CodeSource", issues, "CodeSource")
    code_id = issues.string(raw, "CodeSourceId", "$.CodeSource", required=True, non_blank=True)
    branch = issues.string(raw, "Branch", "$.CodeSource", required=False)
    commit = issues.string(raw, "Commit", "$.CodeSource", required=False)
    mount = issues.string(raw, "MountPath", "$.CodeSource", required=False, non_blank=True)
    if not code_id:
        return None
    resolved = sources.code.get(code_id) if sources else None
    return CodeSource(
        repo=resolved.repo if resolved else code_id,
        branch=branch or (resolved.branch if resolved else None),
        commit=commit or (resolved.commit if resolved else None),
        mount_path=mount or (resolved.mount_path if resolved else None) or DEFAULT_CODE_MOUNT,
    )


def _string_list(payload: dict[str, Any], key: str, issues: Issues) -> list[str]:
    raw = payload.get(key)
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.error(f"$.{key}", f"{key} must be a list of strings, not {json_type(raw)}", "type")
        return []
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or not item.strip():
            issues.error(f"$.{key}[{i}]", f"{key} entries must be non-empty strings", "type")
        else:
            out.append(item)
    return out


def translate_dlc(
    payload: Any,
    user: str = "",
    sources: Sources | None = None,
    catalog: Mapping[str, EcsType] | None = None,
) -> Translation:
    """Any input to a JobSpec plus errors and warnings at CreateJob paths; never raises
    on any JSON-like input."""
    issues = Issues()
    if not isinstance(payload, dict):
        issues.error(
            "$", f"a CreateJob body must be a JSON object, not {json_type(payload)}", "type"
        )
        return Translation(empty_spec(user=user), DIALECT, issues.errors, issues.warnings)
    catalog = catalog_from_env() if catalog is None else catalog

    name = issues.string(
        payload, "DisplayName", "$", required=True, non_blank=True,
        pattern=DISPLAY_NAME_RE, rule=DISPLAY_NAME_RULE,
    )  # fmt: skip
    if name is not None and len(name) > DISPLAY_NAME_MAX:
        issues.error(
            "$.DisplayName", f"DisplayName must be at most {DISPLAY_NAME_MAX} characters", "range"
        )
    job_type = issues.string(payload, "JobType", "$", required=True, non_blank=True)
    if job_type is not None and job_type not in JOB_TYPES:
        hint = next((t for t in JOB_TYPES if t.lower() == job_type.lower()), None)
        issues.error(
            "$.JobType",
            f"JobType {show(job_type)} is not one of "
            f"{', '.join(JOB_TYPES)}" + (f" (JobType is case-sensitive: {hint})" if hint else ""),
            "enum",
        )
        job_type = None
    command = issues.string(payload, "UserCommand", "$", required=True, non_blank=True)
    priority = issues.integer(payload, "Priority", "$", required=False, minimum=1, maximum=9)
    max_minutes = issues.integer(
        payload, "JobMaxRunningTimeMinutes", "$", required=False, minimum=0
    )
    resource_id = issues.string(payload, "ResourceId", "$", required=False)
    access = issues.string(payload, "Accessibility", "$", required=False)
    if access is not None and access not in ("PUBLIC", "PRIVATE"):
        issues.error("$.Accessibility", "Accessibility must be PUBLIC or PRIVATE", "enum")
    workspace_id = issues.string(payload, "WorkspaceId", "$", required=False)
    lib_dir = issues.string(payload, "ThirdpartyLibDir", "$", required=False)
    envs = _envs(payload, issues)
    libs = _string_list(payload, "ThirdpartyLibs", issues)
    roles, success_rules = _roles(payload, job_type, command or "", catalog, issues)
    data_sources = _data_sources(payload, sources, issues)
    code_source = _code_source(payload, sources, issues)
    _unsupported(payload, JOB_KEYS, "$", issues, "CreateJob")
    pipeline_id = _pipeline_id(payload, issues)

    spec = JobSpec(
        name=name or "",
        kind=JOB_TYPES.get(job_type or "", JobKind.GENERIC),
        user=user,
        # A dedicated quota (ResourceId: a queue, or a quota id an administrator maps to
        # one); without one DLC runs the job on public resources: the default queue.
        # The workspace is where the job is listed, not what it runs on.
        queue=resource_id or "default",
        priority=priority or DEFAULT_PRIORITY,
        env=env_list(envs),
        code_source=code_source,
        data_sources=data_sources,
        pip_packages=libs,
        pip_requirements_dir=lib_dir or None,
        max_running_minutes=max_minutes or None,
        roles=roles,
        success_rules=success_rules,
        # What ListJobs filters by (WorkspaceId, JobType, ResourceId, Accessibility,
        # TemplateId, Settings.PipelineId), kept as labels.
        labels=[
            EnvVar(name=name, value=value)
            for name, value in (
                (WORKSPACE_LABEL, workspace_id),
                (JOB_TYPE_LABEL, job_type),
                (RESOURCE_LABEL, resource_id),
                (ACCESS_LABEL, text(payload.get("Accessibility"))),
                (TEMPLATE_LABEL, text(payload.get("TemplateId"))),
                (PIPELINE_LABEL, pipeline_id),
            )
            if value
        ],
    )
    return Translation(spec, DIALECT, issues.errors, issues.warnings, key=None)


WORKSPACE_LABEL = "dlc_workspace_id"
JOB_TYPE_LABEL = "dlc_job_type"
RESOURCE_LABEL = "dlc_resource_id"
ACCESS_LABEL = "dlc_accessibility"
PIPELINE_LABEL = "dlc_pipeline_id"
TEMPLATE_LABEL = "dlc_template_id"


def validate_dlc(payload: Any) -> list[FieldIssue]:
    return translate_dlc(payload).errors


def dlc_warnings(payload: Any) -> list[FieldIssue]:
    return translate_dlc(payload).warnings


def _looks_like(payload: dict[str, Any]) -> bool:
    return "JobSpecs" in payload or "JobType" in payload


REGISTRATION = Dialect(
    name=DIALECT,
    signature="dlc (a PAI-DLC CreateJob body with JobType or JobSpecs)",
    looks_like=_looks_like,
    translate=lambda payload, user: translate_dlc(payload, user),
    field_path=field_path,
    validate=lambda payload, spec: validate_dlc(payload),
    warnings=lambda payload, spec: dlc_warnings(payload),
)


# ------------------------------------------------------------------------- pod ids


def pod_id(job_id: str, role: str, index: int) -> str:
    """A task's DLC PodId: ``<job id>-<role>-<index>`` (role names hold no "-")."""
    return f"{job_id}-{role}-{index}"


def parse_pod_id(job_id: str, pod: str) -> tuple[str, int] | None:
    """(role, index) of a PodId of ``job_id``; None if it is not one."""
    prefix = f"{job_id}-"
    if not pod.startswith(prefix):
        return None
    role, sep, index = pod[len(prefix) :].rpartition("-")
    if not sep or not role or not digits(index) or len(index) > 9:
        return None
    return role, int(index)


# -------------------------------------------------------------------------- views

# Canonical job state -> DLC job Status (GetJob's values).
STATUS = {
    "SUBMITTED": "Creating",
    "ACCEPTED": "Creating",
    "QUEUED": "Queuing",
    "PLACED": "EnvPreparing",
    "RUNNING": "Running",
    "SUCCEEDED": "Succeeded",
    "FAILED": "Failed",
    "STOPPED": "Stopped",
    "REJECTED": "Failed",
    # DLC has no pause: a paused job holds nothing and waits for a person, as a stopped
    # one does; its ReasonCode tells the two apart.
    "PAUSED": "Stopped",
}
# Every Status ListJobs takes (ListJobsRequest.status): those Trainyard never shows
# (Bidding, SanityChecking, Restarting, Stopping, *Reserving) match no job.
LIST_STATUSES = frozenset(
    {
        "Creating", "Queuing", "Bidding", "EnvPreparing", "SanityChecking", "Running",
        "Restarting", "Stopping", "SucceededReserving", "FailedReserving", "Succeeded",
        "Failed", "Stopped",
    }
)  # fmt: skip
REASON_CODE = {
    "REJECTED": "JobRejected",
    "FAILED": "JobFailed",
    # A stop is a user's (StopJob, DeleteJob, another dialect's stop): the code DLC
    # documents ("Job is stopped by user."). A run past its time is FAILED.
    "STOPPED": "JobStoppedByUser",
    "QUEUED": "JobEnqueued",
    "SUCCEEDED": "JobSucceeded",
    "PAUSED": "JobPaused",
}
POD_STATUS = {
    None: "Pending",
    "PENDING": "Pending",
    "STARTING": "Pending",
    "RUNNING": "Running",
    "SUCCEEDED": "Succeeded",
    "FAILED": "Failed",
    "STOPPED": "Stopped",
}


# --------------------------------------------------------------------------- ListJobs


class ListJobsError(ValueError):
    """A ListJobs parameter this platform cannot take: ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


# SortBy (DLC's documented values, and the two older ones) -> the job view's field.
LIST_SORT_FIELDS = {
    "DisplayName": "name",
    "JobType": f"labels.{JOB_TYPE_LABEL}",
    "Status": "state",
    "GmtCreateTime": "submitted_at",
    "GmtSubmittedTime": "submitted_at",
    "GmtFinishTime": "finished_at",
    "GmtModifiedTime": "updated_at",
}
# TimeRangeField -> the job view's time field (StartTime / EndTime bound it).
TIME_RANGE_FIELDS = {
    "GmtCreateTime": "submitted_at",
    "GmtSubmittedTime": "submitted_at",
    "GmtFinishTime": "finished_at",
    "GmtModifiedTime": "updated_at",
}
# Without StartTime or EndTime DLC lists the jobs of the last 7 days.
DEFAULT_LIST_WINDOW_DAYS = 7
# ListJobs filters about what no job here has: a value is refused, naming it.
LIST_NOT_APPLICABLE = {
    "NumericRangeField": "numeric range filters are not supported here",
    "OversoldInfo": "jobs here do not run on oversold (idle) quota resources",
    "Caller": "jobs here record no caller apart from their user (UserIdForFilter)",
}


@dataclass(frozen=True)
class ListQuery:
    """What a ListJobs request asks of the job views: a filter (MongoDB's query
    language, over the status service's job documents), the field to sort by and the
    direction, or ``empty`` when nothing can match."""

    where: dict[str, Any]
    sort: str = "submitted_at"
    ascending: bool = False
    empty: bool = False


# A Tags filter key, as a job's label name can be here (no dots: a key is a field).
_TAG_KEY = re.compile(r"[A-Za-z0-9_\-/:]{1,128}")


def _contains(text_value: str) -> dict[str, Any]:
    """A case-insensitive substring match (DLC's fuzzy searches)."""
    return {"$regex": re.escape(text_value), "$options": "i"}


def _csv(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def list_query(params: Mapping[str, Any], *, user: str, admin: bool, now: datetime) -> ListQuery:
    """ListJobs' query parameters (DLC's names) as a filter on the job views, as DLC
    documents each: DisplayName (fuzzy, case-insensitive; DisplayNameSearchMode exact),
    JobId (before JobIds), JobType, Status, ResourceId(s), ResourceQuotaName (fuzzy),
    WorkspaceId (FromAllWorkspaces drops it), ShowOwn, Username, UserIdForFilter and
    BusinessUserId, StartTime / EndTime over TimeRangeField (the last 7 days by default),
    Tags (a JSON object of labels), PaymentType, Accessibility, PipelineId, TemplateId,
    EnableAssignNode, ImageSearch, UserCommandSearch, ReasonSearch, SortBy and Order.
    ``user``: the caller, who sees only their own jobs unless ``admin``."""

    def get(name: str) -> str | None:
        value = params.get(name)
        return str(value) if value not in (None, "") else None

    for param, why in LIST_NOT_APPLICABLE.items():
        if get(param) is not None:
            raise ListJobsError(param, why)
    where: dict[str, Any] = {"dialect": DIALECT}
    empty = False
    if (display := get("DisplayName")) is not None:
        mode = (get("DisplayNameSearchMode") or "fuzzy").lower()
        if mode not in ("exact", "fuzzy", "wildcard"):
            raise ListJobsError("DisplayNameSearchMode", "must be exact or fuzzy")
        where["name"] = display if mode == "exact" else _contains(display)
    if (job_id := get("JobId")) is not None:
        where["_id"] = job_id.lower()
    elif ids := _csv(get("JobIds")):
        where["_id"] = {"$in": [i.lower() for i in ids][:1000]}
    if (job_type := get("JobType")) is not None:
        where[f"labels.{JOB_TYPE_LABEL}"] = job_type
    if (status := get("Status")) is not None:
        known = {s.lower() for s in LIST_STATUSES}
        if unknown := [part for part in _csv(status) if part.strip().lower() not in known]:
            raise ListJobsError(
                "Status", f"{unknown[0]!r} is not one of {', '.join(sorted(LIST_STATUSES))}"
            )
        where["state"] = {"$in": sorted({s for part in _csv(status) for s in states_for(part)})}
    quotas = _csv(get("ResourceId")) or _csv(get("ResourceIds"))
    if quotas:
        where[f"labels.{RESOURCE_LABEL}"] = {"$in": quotas}
    if (quota_name := get("ResourceQuotaName")) is not None:
        where["queue"] = _contains(quota_name)
    workspace = get("WorkspaceId")
    if workspace is not None and str(params.get("FromAllWorkspaces")).lower() != "true":
        where[f"labels.{WORKSPACE_LABEL}"] = workspace
    show_own = str(params.get("ShowOwn")).lower() == "true"
    # A job's user is its Username, UserId and BusinessUserId here: the ids exactly, the
    # name as DLC searches it ("Supports fuzzy match": a part of it, in any case).
    user_ids = {v for v in (get("UserIdForFilter"), get("BusinessUserId")) if v}
    named = get("Username")
    if len(user_ids) > 1:
        empty = True  # two users at once: no job is both's
    exact = min(user_ids) if user_ids else None
    if named is not None and exact is not None and named.lower() not in exact.lower():
        empty = True  # the name searched is not the id's
    if not admin or show_own:
        if (exact is not None and exact != user) or (
            named is not None and named.lower() not in user.lower()
        ):
            empty = True  # another user's jobs are not this caller's to list
        where["user"] = user
    elif exact is not None:
        where["user"] = exact
    elif named is not None:
        where["user"] = _contains(named)
    field_name = get("TimeRangeField") or "GmtCreateTime"
    if field_name not in TIME_RANGE_FIELDS:
        raise ListJobsError(
            "TimeRangeField", f"must be one of {', '.join(sorted(TIME_RANGE_FIELDS))}"
        )
    start, end = get("StartTime"), get("EndTime")
    window: dict[str, datetime] = {}
    # StartTime defaults to 7 days ago (the SDK's ListJobsRequest), EndTime or not.
    if start is None:
        window["$gte"] = now - timedelta(days=DEFAULT_LIST_WINDOW_DAYS)
    else:
        window["$gte"] = _list_time(start, "StartTime")
    if end is not None:
        window["$lte"] = _list_time(end, "EndTime")
    where[TIME_RANGE_FIELDS[field_name]] = window
    if (tags := get("Tags")) is not None:
        try:
            # Bounded in depth, and refusing a lone surrogate ("\ud800", which no
            # store can hold: a 500 from the query).
            wanted = parse_json(tags)
        except BodyError:
            wanted = None
        if not isinstance(wanted, dict) or not all(isinstance(v, str) for v in wanted.values()):
            raise ListJobsError("Tags", 'must be a JSON object of strings ({"key": "value"})')
        for key in wanted:
            if not _TAG_KEY.fullmatch(key):
                raise ListJobsError("Tags", f"tag key {key!r} must match {_TAG_KEY.pattern}")
        for key, value in wanted.items():
            where[f"labels.{key}"] = value
    if (payment := get("PaymentType")) is not None:
        if payment not in ("PrePaid", "PostPaid", "Spot"):
            raise ListJobsError("PaymentType", "must be PrePaid, PostPaid or Spot")
        if payment == "Spot":
            empty = True  # no preemptible (spot) resources here
        elif payment == "PrePaid":
            where.setdefault(f"labels.{RESOURCE_LABEL}", {"$ne": None})
        elif f"labels.{RESOURCE_LABEL}" in where:
            empty = True  # a quota's jobs are PrePaid
        else:
            where[f"labels.{RESOURCE_LABEL}"] = None
    if (access := get("Accessibility")) is not None:
        if access not in ("PUBLIC", "PRIVATE"):
            raise ListJobsError("Accessibility", "must be PUBLIC or PRIVATE")
        # A job that did not say is PRIVATE (DLC's default).
        where[f"labels.{ACCESS_LABEL}"] = "PUBLIC" if access == "PUBLIC" else {"$ne": "PUBLIC"}
    for param, label in (("PipelineId", PIPELINE_LABEL), ("TemplateId", TEMPLATE_LABEL)):
        if (value := get(param)) is not None:
            where[f"labels.{label}"] = value
    if (assign := get("EnableAssignNode")) is not None and assign.lower() == "true":
        empty = True  # no job here runs with DLC's assigned-node execution
    for param, stored in (
        ("ImageSearch", "search.images"),
        ("UserCommandSearch", "search.commands"),
        ("ReasonSearch", "reason"),
    ):
        if (value := get(param)) is not None:
            where[stored] = _contains(value)
    sort_by = get("SortBy") or "GmtCreateTime"
    if sort_by not in LIST_SORT_FIELDS:
        raise ListJobsError("SortBy", f"must be one of {', '.join(LIST_SORT_FIELDS)}")
    order = (get("Order") or "desc").lower()
    if order not in ("asc", "desc"):
        raise ListJobsError("Order", "must be asc or desc")
    return ListQuery(where, LIST_SORT_FIELDS[sort_by], order == "asc", empty)


def _list_time(value: str, name: str) -> datetime:
    """A DLC time filter (``2020-11-08T16:00:00Z``)."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ListJobsError(name, f"{value!r} is not a time (2020-11-08T16:00:00Z)") from None
    try:
        return in_utc(moment)
    except ValueError as exc:
        raise ListJobsError(name, str(exc)) from None


def states_for(status: str) -> list[str]:
    """Canonical states a DLC Status filter stands for (case-insensitive)."""
    wanted = status.strip().lower()
    return sorted(state for state, shown in STATUS.items() if shown.lower() == wanted)


def gmt(value: Any) -> str | None:
    """DLC's timestamp format, from a datetime or an ISO string."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _seconds_between(start: Any, end: Any) -> int | None:
    a, b = gmt(start), gmt(end)
    if not a or not b:
        return None
    try:
        t0 = datetime.strptime(a, "%Y-%m-%dT%H:%M:%SZ")
        t1 = datetime.strptime(b, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return max(0, int((t1 - t0).total_seconds()))


def _job_specs(spec: dict[str, Any], original: dict[str, Any] | None) -> list[dict[str, Any]]:
    raw_specs = original.get("JobSpecs") if isinstance(original, dict) else None
    by_type = {}
    for raw in raw_specs if isinstance(raw_specs, list) else []:
        if isinstance(raw, dict) and isinstance(raw.get("Type"), str):
            by_type[raw["Type"].replace("-", "_")] = raw
    out = []
    for role in spec.get("roles", []):
        res = role.get("resources", {})
        raw = by_type.get(role.get("name"), {})
        item: dict[str, Any] = {
            "Type": raw.get("Type", role.get("name")),
            "Image": role.get("image"),
            "PodCount": role.get("replicas"),
            "ResourceConfig": {
                "CPU": _num(res.get("cpu", 1)),
                "Memory": format_memory(res.get("memory_mb", 1024)),
                "GPU": _num(res.get("gpu", 0)),
                "SharedMemory": format_memory(res.get("shm_mb", DEFAULT_SHM_MB)),
                **({"GPUType": res["gpu_type"]} if res.get("gpu_type") else {}),
            },
        }
        if isinstance(raw.get("EcsSpec"), str):
            item["EcsSpec"] = raw["EcsSpec"]
        out.append(item)
    return out


def render_job(
    view: Mapping[str, Any], original: Mapping[str, Any] | None = None, running_at: Any = None
) -> dict[str, Any]:
    """GetJob's response body (the SDK's GetJobResponseBody, less RequestId) for a
    canonical job view (status's ``job_view``); ``original`` is the CreateJob body, for
    the fields the canonical job does not keep (EcsSpec, source ids)."""
    original = dict(original) if isinstance(original, Mapping) else {}
    spec = view.get("spec") or {}
    state = view.get("state") or "SUBMITTED"
    job_id = view.get("id", "")
    tasks = [t for t in view.get("tasks", []) if t.get("attempt") in (None, view.get("attempt", 1))]
    pods = []
    for task in tasks:
        pid = pod_id(job_id, task.get("role", ""), task.get("index", 0))
        status = POD_STATUS.get(task.get("state"), "Pending")
        ended = status in ("Succeeded", "Failed", "Stopped")
        pods.append(
            {
                "PodId": pid,
                "PodUid": f"{pid}-{task.get('attempt') or 1}",
                "Type": task.get("role"),
                "Status": status,
                "Ip": task.get("host_ip") or "",
                "NodeName": task.get("node") or "",
                "PodIps": [{"InterfaceName": "eth0", "Ip": task["host_ip"]}]
                if task.get("host_ip")
                else [],
                "GmtCreateTime": gmt(view.get("submitted_at")),
                "GmtStartTime": gmt(running_at) if running_at else None,
                "GmtFinishTime": gmt(task.get("updated_at")) if ended else None,
            }
        )
    finished = gmt(view.get("finished_at"))
    created = gmt(view.get("submitted_at"))
    roles = spec.get("roles", [])
    env = {e["name"]: e["value"] for e in spec.get("env", []) if isinstance(e, dict)}
    data_sources = []
    raw_ds = sequence(original.get("DataSources"))
    for i, ds in enumerate(spec.get("data_sources", [])):
        raw = raw_ds[i] if i < len(raw_ds) and isinstance(raw_ds[i], dict) else {}
        data_sources.append(
            {
                "DataSourceId": raw.get("DataSourceId"),
                "MountPath": ds.get("mount_path"),
                "Uri": ds.get("source"),
            }
        )
    code = spec.get("code_source")
    raw_code = mapping(original.get("CodeSource"))
    kind: Any = spec.get("kind")  # the view is JSON: a kind's value, or None
    job_type = (
        original.get("JobType")
        if isinstance(original.get("JobType"), str)
        else KIND_TO_TYPE.get(kind, kind)
    )
    body: dict[str, Any] = {
        "JobId": job_id,
        "DisplayName": view.get("name") or spec.get("name"),
        "JobType": job_type,
        "Status": STATUS.get(state, state),
        "ReasonCode": REASON_CODE.get(state, ""),
        "ReasonMessage": view.get("reason") or "",
        "UserId": view.get("user"),
        "GmtCreateTime": created,
        "GmtSubmittedTime": created,
        "GmtRunningTime": gmt(running_at) if running_at else None,
        "GmtFinishTime": finished,
        "GmtSuccessedTime": finished if state == "SUCCEEDED" else None,
        "GmtFailedTime": finished if state in ("FAILED", "REJECTED") else None,
        "GmtStoppedTime": finished if state == "STOPPED" else None,
        "Duration": _seconds_between(
            running_at or view.get("submitted_at"),
            view.get("finished_at") or view.get("updated_at"),
        ),
        "Pods": pods,
        "JobSpecs": _job_specs(spec, original),
        "UserCommand": roles[0].get("command") if roles else original.get("UserCommand"),
        "Envs": env,
        "Priority": view.get("priority")
        if view.get("priority") is not None
        else spec.get("priority"),
        # The quota the job named; none: public resources (DLC shows an empty id).
        "ResourceId": original.get("ResourceId") or "",
        "WorkspaceId": original.get("WorkspaceId"),
        "DataSources": data_sources,
        "ThirdpartyLibs": spec.get("pip_packages", []),
        "ThirdpartyLibDir": spec.get("pip_requirements_dir"),
        "RequestCPU": int(
            sum(r.get("resources", {}).get("cpu", 0) * r.get("replicas", 1) for r in roles)
        ),
        "RequestGPU": float(
            sum(r.get("resources", {}).get("gpu", 0) * r.get("replicas", 1) for r in roles)
        ),
        "RequestMemory": format_memory(
            sum(r.get("resources", {}).get("memory_mb", 0) * r.get("replicas", 1) for r in roles)
        ),
        # "The number of retries used by the job and the maximum number of retries" (the
        # SDK's example: "0/10").
        "RestartTimes": _restart_times(view, spec),
    }
    if code:
        body["CodeSource"] = {
            "CodeSourceId": raw_code.get("CodeSourceId") or code.get("repo"),
            "Branch": code.get("branch"),
            "Commit": code.get("commit"),
            "MountPath": code.get("mount_path"),
        }
    return {k: v for k, v in body.items() if v is not None}


def render_list(
    items: Iterable[tuple[Mapping[str, Any], Mapping[str, Any] | None]], total: int
) -> dict[str, Any]:
    """ListJobs' body (less RequestId): each job as a JobItem."""
    jobs = []
    for view, original in items:
        job = render_job(view, original)
        spec = view.get("spec") or {}
        if spec.get("max_running_minutes"):
            job["JobMaxRunningTimeMinutes"] = spec["max_running_minutes"]
        job["Username"] = view.get("user")
        job["GmtModifiedTime"] = gmt(view.get("updated_at"))
        # A JobItem's RequestGPU is text (the SDKs: str, Go's *string, "1"), GetJob's a
        # number: Go's client decodes a number here into nothing.
        job["RequestGPU"] = f"{job['RequestGPU']:g}"
        jobs.append({k: v for k, v in job.items() if v is not None})
    return {"Jobs": jobs, "TotalCount": total}


def render_events(
    history: Iterable[Mapping[str, Any]],
    limit: int | None = None,
    task: tuple[str, int] | None = None,
) -> list[str]:
    """GetJobEvents' Events: one line per history row, oldest first; ``task`` (a pod's
    role and index: GetPodEvents): only the rows about that task and the job-wide ones
    before it started (queued, placed)."""
    lines = []
    for row in history:
        event = row.get("event") or {}
        if task is not None and (
            (
                row.get("type") == "TaskStateChanged"
                and (event.get("role"), event.get("index")) != task
            )
            or row.get("type") not in ("TaskStateChanged", "JobQueued", "JobPlaced", "JobFinished")
        ):
            continue
        detail = ""
        if row.get("type") == "TaskStateChanged":
            detail = f" {event.get('role')}[{event.get('index')}] {event.get('state')}" + (
                f" (exit {event['exit_code']})" if event.get("exit_code") is not None else ""
            )
        elif event.get("reason"):
            detail = f" {event['reason']}"
        elif event.get("errors"):
            detail = " " + "; ".join(
                f"{e.get('path')}: {e.get('message')}" for e in event["errors"]
            )
        elif row.get("type") == "JobQueued" and event.get("reasons"):
            detail = " " + "; ".join(event["reasons"])
        lines.append(f"{gmt(row.get('occurred_at'))} {row.get('type')}{detail}")
    return lines[-limit:] if limit else lines


DATA_SOURCE_FIELDS = (
    "DataSourceType",
    "DisplayName",
    "Description",
    "FileSystemId",
    "Path",
    "Endpoint",
    "MountPath",
    "Options",
    "Uri",
)
CODE_SOURCE_FIELDS = (
    "DisplayName",
    "Description",
    "CodeRepo",
    "CodeBranch",
    "CodeCommit",
    "CodeRepoUserName",
    "CodeRepoAccessToken",
    "MountPath",
)


def render_data_source(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A registered data source as the SDK's DataSourceItem."""
    item = {
        "DataSourceId": doc.get("_id"),
        "UserId": doc.get("user"),
        **{k: doc.get(k) for k in DATA_SOURCE_FIELDS},
        "GmtCreateTime": gmt(doc.get("created_at")),
        "GmtModifyTime": gmt(doc.get("modified_at")),
    }
    return {k: v for k, v in item.items() if v is not None}


def render_code_source(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A registered code source as the SDK's CodeSourceItem; the access token hidden."""
    item = {
        "CodeSourceId": doc.get("_id"),
        "UserId": doc.get("user"),
        **{k: doc.get(k) for k in CODE_SOURCE_FIELDS},
        "GmtCreateTime": gmt(doc.get("created_at")),
        "GmtModifyTime": gmt(doc.get("modified_at")),
    }
    if item.get("CodeRepoAccessToken"):
        item["CodeRepoAccessToken"] = "******"
    return {k: v for k, v in item.items() if v is not None}


def resolved_data(doc: Mapping[str, Any]) -> ResolvedData:
    return ResolvedData(uri=data_source_uri(doc), mount_path=doc.get("MountPath") or None)


def resolved_code(doc: Mapping[str, Any]) -> ResolvedCode:
    return ResolvedCode(
        repo=str(doc.get("CodeRepo") or ""),
        branch=doc.get("CodeBranch") or None,
        commit=doc.get("CodeCommit") or None,
        mount_path=doc.get("MountPath") or None,
    )


# ----------------------------------------------------------------------- ListEcsSpecs


def _restart_times(view: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    used = max(0, (view.get("attempt") or 1) - 1)
    limit = spec.get("retry_limit")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        return f"{used}/{limit}"
    return str(used)  # retried without limit: no maximum to show


def render_ecs_specs(
    catalog: Mapping[str, EcsType],
    accelerator: str | None,
    instance_types: list[str],
    sort_by: str,
    ascending: bool,
    page: int,
    size: int,
    resource_type: str | None = None,
) -> dict[str, Any]:
    """ListEcsSpecs' body (less RequestId): the instance types this platform knows (the
    built-in table and YARD_DLC_ECS_CATALOG), filtered by AcceleratorType (CPU / GPU),
    InstanceTypes and ResourceType (all ECS here: Lingjun lists none), sorted by the
    SDK's CPU, GPU, Memory or GmtCreateTime (the table's order) in any case, or by
    InstanceType, one page."""
    specs = []
    if resource_type is not None and resource_type.upper() != "ECS":
        catalog = {}
    for name, ecs in catalog.items():
        kind = "GPU" if ecs.gpu else "CPU"
        if accelerator and accelerator.upper() != kind:
            continue
        if instance_types and name not in instance_types:
            continue
        specs.append(
            {
                "InstanceType": name,
                "AcceleratorType": kind,
                "Cpu": _whole(ecs.cpu),
                "Memory": _whole(ecs.memory_gib),
                "Gpu": _whole(ecs.gpu),
                "GpuType": ecs.gpu_type or "",
                "GpuMemory": _whole(ecs.gpu_memory_gib) if ecs.gpu_memory_gib else 0,
                "IsAvailable": True,
                "ResourceType": "ECS",
                "PaymentTypes": ["PostPaid"],
            }
        )
    key = {"cpu": "Cpu", "gpu": "Gpu", "memory": "Memory", "gmtcreatetime": "Position"}.get(
        sort_by.lower(), "InstanceType"
    )
    position = {name: i for i, name in enumerate(catalog)}
    specs.sort(
        key=lambda item: (
            position[str(item["InstanceType"])] if key == "Position" else item[key],
            item["InstanceType"],
        ),
        reverse=not ascending,
    )
    start = (page - 1) * size
    return {"EcsSpecs": specs[start : start + size], "TotalCount": len(specs)}


def _whole(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value
