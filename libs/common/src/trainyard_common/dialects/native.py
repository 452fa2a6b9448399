"""The native dialect: the payload is a JobSpec as JSON. Parsed strictly (as JSON: no
"3" for 3, no true for 1) and then held to the same rules OpenPAI jobs are."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from ..events import FieldIssue
from ..jobspec import REDACTED, JobSpec, RoleSpec
from .fields import text
from .registry import Dialect
from .translation import (
    INT_MAX,
    JOB_NAME_RE,
    JOB_NAME_RULE,
    PORT_MAX,
    ROLE_NAME_RE,
    ROLE_NAME_RULE,
    Translation,
    empty_spec,
    env_problem,
    join,
    json_type,
    show,
    too_many_tasks,
)

DIALECT = "native"

_RESOURCE_FIELDS = frozenset(
    {"cpu", "memory_mb", "shm_mb", "gpu", "gpu_type", "gpu_types", "storage_gb", "uncapped"}
)


def field_path(payload: Any, role: str | None, field: str) -> str:
    if role is None:
        return f"$.{field}"
    raw = payload.get("roles") if isinstance(payload, dict) else None
    index = (
        next((i for i, r in enumerate(raw) if isinstance(r, dict) and r.get("name") == role), None)
        if isinstance(raw, list)
        else None
    )
    if index is None:
        return "$.roles"
    path = f"$.roles[{index}]"
    if field == "role":
        return path
    return f"{path}.resources.{field}" if field in _RESOURCE_FIELDS else f"{path}.{field}"


def _loc_path(loc: tuple[Any, ...]) -> str:
    path = "$"
    for part in loc:
        path = join(path, part if isinstance(part, int) else str(part))
    return path


def _issues_from(exc: ValidationError) -> list[FieldIssue]:
    issues = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = tuple(err.get("loc", ()))
        field = str(loc[-1]) if loc else "job"
        if err.get("type") == "extra_forbidden":
            message = f"{field} is not a field of a native job"
        else:
            message = f"{field}: {err.get('msg', 'invalid')}"
        issues.append(
            FieldIssue(path=_loc_path(loc), message=message, code=str(err.get("type", "invalid")))
        )
    return issues


def _strict(model: type[JobSpec] | type[RoleSpec], text: str) -> Any:
    return model.model_validate_json(text, strict=True)


def _salvage(payload: dict[str, Any], bad: set[str], user: str) -> JobSpec:
    """The valid part of an invalid native job, so the rejection can still show it."""
    roles: list[RoleSpec] = []
    raw_roles = payload.get("roles")
    for raw in raw_roles if isinstance(raw_roles, list) else []:
        try:
            roles.append(_strict(RoleSpec, json.dumps(raw, allow_nan=False)))
        except (ValidationError, ValueError, TypeError, RecursionError):
            pass
    kept = {k: v for k, v in payload.items() if k not in bad and k not in ("roles", "user")}
    kept["roles"] = [r.model_dump(mode="json") for r in roles]
    kept["name"] = text(payload.get("name"))
    try:
        spec = _strict(JobSpec, json.dumps(kept, allow_nan=False))
    except (ValidationError, ValueError, TypeError, RecursionError):
        spec = JobSpec(name=kept["name"], roles=roles)
    return spec.model_copy(update={"user": user})


def translate_native(payload: Any, user: str = "") -> Translation:
    if not isinstance(payload, dict):
        issue = FieldIssue(
            path="$", message=f"a job must be a JSON object, not {json_type(payload)}", code="type"
        )
        return Translation(empty_spec(user=user), DIALECT, [issue])
    try:
        text = json.dumps(payload, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        issue = FieldIssue(
            path="$",
            message="the job is not valid JSON (NaN, Infinity or nesting too deep)",
            code="type",
        )
        return Translation(empty_spec(payload.get("name"), user), DIALECT, [issue])
    try:
        spec = _strict(JobSpec, text)
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
        return Translation(_salvage(payload, bad, user), DIALECT, _issues_from(exc))
    spec = spec.model_copy(update={"user": user})
    return Translation(spec, DIALECT, validate_native(spec), key=spec.name or None)


def _finite(value: float) -> bool:
    # An int is finite however large (math.isfinite raises OverflowError past a float's).
    return isinstance(value, int) or math.isfinite(value)


def _out_of(key: str, value: float, low: float, *, above: bool = False) -> str:
    """Why ``value`` is not in [low, INT_MAX] (``above``: (low, INT_MAX]): the side it
    fell off, not always the lower one."""
    if _finite(value) and value > low:
        return f"{key} must be at most {INT_MAX}, got {show(value)}"
    return f"{key} must be {'more than' if above else 'at least'} {show(low)}, got {show(value)}"


def validate_native(spec: JobSpec) -> list[FieldIssue]:
    """The canonical rules every job must meet, whatever dialect it came in."""
    errors: list[FieldIssue] = []

    def err(path: str, message: str, code: str = "invalid") -> None:
        errors.append(FieldIssue(path=path, message=message, code=code))

    if not spec.name:
        err("$.name", "name is required", "required")
    elif not JOB_NAME_RE.fullmatch(spec.name):
        err("$.name", f"name {show(spec.name)} must match {JOB_NAME_RULE}", "pattern")
    if not 1 <= spec.priority <= 9:
        err("$.priority", f"priority must be between 1 and 9, got {show(spec.priority)}", "range")
    if not 0 <= spec.retry_limit <= INT_MAX:
        err(
            "$.retry_limit",
            f"retry_limit must be between 0 and {INT_MAX}, got {show(spec.retry_limit)}",
            "range",
        )
    if spec.max_running_minutes is not None and not 1 <= spec.max_running_minutes <= INT_MAX:
        said = _out_of("max_running_minutes", spec.max_running_minutes, 1)
        err("$.max_running_minutes", said, "range")
    if not spec.roles:
        err("$.roles", "roles must hold at least one role", "required")
    for j, var in enumerate(spec.env):
        if problem := env_problem(var.name, var.value):
            err(f"$.env[{j}]", problem)

    first_use: dict[str, int] = {}
    for i, role in enumerate(spec.roles):
        path = f"$.roles[{i}]"
        res = f"{path}.resources"
        if not ROLE_NAME_RE.fullmatch(role.name):
            err(
                f"{path}.name",
                f"role name {show(role.name)} must match {ROLE_NAME_RULE}",
                "pattern",
            )
        elif role.name in first_use:
            err(
                f"{path}.name",
                f"role name {show(role.name)} is already used by "
                f"roles[{first_use[role.name]}]; names must be unique in a job",
                "duplicate",
            )
        else:
            first_use[role.name] = i
        if not 1 <= role.replicas <= INT_MAX:
            err(f"{path}.replicas", _out_of("replicas", role.replicas, 1), "range")
        for key in ("min_replicas", "max_replicas"):
            value = getattr(role, key)
            if value is not None and not 1 <= value <= INT_MAX:
                said = _out_of(key, value, 1).replace(" must be ", " must be null or ", 1)
                err(f"{path}.{key}", said, "range")
        low, high = role.min_replicas, role.max_replicas
        if low is not None and high is not None and 1 <= high < low <= INT_MAX:
            err(
                f"{path}.max_replicas",
                f"max_replicas ({high}) must not be less than min_replicas ({low})",
                "range",
            )
        r = role.resources
        if not (_finite(r.cpu) and 0 < r.cpu <= INT_MAX):
            err(f"{res}.cpu", _out_of("cpu", r.cpu, 0, above=True), "range")
        if not 100 <= r.memory_mb <= INT_MAX:
            err(f"{res}.memory_mb", _out_of("memory_mb", r.memory_mb, 100), "range")
        if not 0 <= r.shm_mb <= INT_MAX:
            err(f"{res}.shm_mb", _out_of("shm_mb", r.shm_mb, 0), "range")
        if not (_finite(r.gpu) and 0 <= r.gpu <= INT_MAX):
            err(f"{res}.gpu", _out_of("gpu", r.gpu, 0), "range")
        if r.storage_gb is not None and not 0 <= r.storage_gb <= INT_MAX:
            err(f"{res}.storage_gb", _out_of("storage_gb", r.storage_gb, 0), "range")
        if r.uncapped:
            # It lifted the task's memory.max, RLIMIT_DATA and cpu.max (a pod's limits):
            # one user's task could take the machine's memory from every other and the
            # platform's. Only a dialect that means it (TI's 0U / 0G machine types)
            # sets it; a native job, or a bare spec on the bus, may not.
            err(
                f"{res}.uncapped",
                "uncapped is not for a job to set: a task is held to its cpu and "
                "memory_mb (only TI's machine types of 0U or 0G leave them uncapped)",
                "forbidden",
            )
        for j, model in enumerate(r.gpu_types):
            if not model.strip():
                err(
                    f"{res}.gpu_types[{j}]",
                    "a GPU model must not be empty (an empty list means any model)",
                    "required",
                )
        for j, label in enumerate(role.node_selector):
            if not label.name.strip():
                err(
                    f"{path}.node_selector[{j}].name",
                    "a node label name must not be empty",
                    "required",
                )
        if not role.command.strip():
            err(f"{path}.command", "command must not be empty", "required")
        for j, var in enumerate(role.env):
            if problem := env_problem(var.name, var.value):
                err(f"{path}.env[{j}]", problem)
        for key in ("min_failed", "min_succeeded"):
            value = getattr(role, key)
            if value is not None and not 1 <= value <= INT_MAX:
                said = _out_of(key, value, 1).replace(" must be ", " must be null or ", 1)
                err(f"{path}.{key}", said, "range")
        labels: dict[str, int] = {}
        for j, port in enumerate(role.ports):
            pp = f"{path}.ports[{j}]"
            if not ROLE_NAME_RE.fullmatch(port.label):
                err(
                    f"{pp}.label",
                    f"port label {show(port.label)} must match {ROLE_NAME_RULE}",
                    "pattern",
                )
            elif port.label in labels:
                err(
                    f"{pp}.label",
                    f"port label {show(port.label)} is already used by "
                    f"ports[{labels[port.label]}]; labels must be unique in a role",
                    "duplicate",
                )
            else:
                labels[port.label] = j
            if not 0 <= port.begin_at <= PORT_MAX:
                err(
                    f"{pp}.begin_at",
                    f"begin_at must be between 0 and {PORT_MAX}, got {show(port.begin_at)}",
                    "range",
                )
            elif not 1 <= port.count <= PORT_MAX:
                err(f"{pp}.count", f"count must be at least 1, got {show(port.count)}", "range")
            elif port.begin_at and port.begin_at + port.count - 1 > PORT_MAX:
                err(
                    f"{pp}.count",
                    f"ports {port.begin_at}..{port.begin_at + port.count - 1} "
                    "do not fit below 65536",
                    "range",
                )
    if not any(e.path.endswith(".replicas") for e in errors):
        index = {role.name: i for i, role in enumerate(spec.roles)}
        errors += too_many_tasks(
            spec, lambda role, key: f"$.roles[{index.get(role or '', 0)}].{key}"
        )
    return errors


def redact_native(payload: Any) -> Any:
    """The payload as it may be shown back: each secret's value hidden."""
    if not isinstance(payload, dict) or not isinstance(payload.get("secrets"), list):
        return payload
    hidden = [
        {**item, "value": REDACTED} if isinstance(item, dict) and "value" in item else item
        for item in payload["secrets"]
    ]
    return {**payload, "secrets": hidden}


REGISTRATION = Dialect(
    name=DIALECT,
    signature="native (an object with name and roles)",
    looks_like=lambda payload: "name" in payload and "roles" in payload,
    translate=translate_native,
    field_path=field_path,
    validate=lambda payload, spec: validate_native(spec),
    redact=redact_native,
)
