"""What every dialect shares: the translation result, and the small, total checks the
dialect validators are built from (each records a FieldIssue instead of raising)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..events import FieldIssue
from ..jobspec import REDACTED, JobSpec

# Python's '$' also matches before a trailing newline, so patterns are applied with
# fullmatch; the strings shown in messages are OpenPAI's own spelling of the rule.
JOB_NAME_RE = re.compile(r"[A-Za-z0-9\-._~]+")
JOB_NAME_RULE = r"^[A-Za-z0-9\-._~]+$"
ROLE_NAME_RE = re.compile(r"[A-Za-z0-9._~]+")
ROLE_NAME_RULE = r"^[A-Za-z0-9._~]+$"

# Counts and sizes above this cannot be stored as the int32/int64 fields the state
# stores and schedulers use, and no real cluster offers them; refuse them early.
INT_MAX = 2**31 - 1
PORT_MAX = 65535
# The most tasks a job may hold, its roles together (an elastic role at its largest):
# Kubernetes' bound on an Indexed Job (maxParallelismForIndexedJob), for its reason too.
# Every view of a job lists its tasks: 2**31 of them were lists no service could hold.
MAX_JOB_TASKS = 100_000

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnknownDialect(ValueError):
    """The payload is in no dialect we know."""


@dataclass
class Translation:
    spec: JobSpec
    dialect: str
    errors: list[FieldIssue] = field(default_factory=list)
    warnings: list[FieldIssue] = field(default_factory=list)
    # The job's name as its dialect's API finds it again, unique per user (OpenPAI's
    # jobName, a T9k "namespace/plural/name"); None where the dialect names jobs by id
    # only (DLC). Validation claims it; status looks jobs up by it.
    key: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def empty_spec(name: Any = "", user: str = "") -> JobSpec:
    """The stand-in spec for input that could not be translated."""
    return JobSpec(name=name if isinstance(name, str) else "", user=user, roles=[])


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.fullmatch(key):
        return f"{path}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{path}['{escaped}']"


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def show(value: Any, limit: int = 60) -> str:
    """A value for a message, cut short: payloads may hold megabytes or 10**4000."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
        return "a very large number"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_int(value: Any) -> int | None:
    """The integer a JSON value stands for, or None. Booleans are not integers; 2.0 is 2."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def bounded_int(value: Any, default: int | None, minimum: int) -> int | None:
    """``value`` as an integer in [minimum, INT_MAX], else ``default``: translation keeps
    going past a bad number (the validator has already reported it)."""
    number = as_int(value)
    return number if number is not None and minimum <= number <= INT_MAX else default


def env_problem(name: str, value: str) -> str | None:
    """Why a variable ``name=value`` cannot reach a process, or None: execve takes
    ``name=value`` strings, so a name holding ``=`` (or empty) would read as another
    variable, and a NUL ends the string. Accepted, such a job failed only at its start,
    with a message naming no field."""
    if not name:
        return "a variable name must not be empty"
    if "=" in name:
        return f"variable name {show(name)} must not hold '='"
    if "\0" in name:
        return f"variable name {show(name)} must not hold a NUL character"
    if "\0" in value:
        return f"the value of {show(name)} must not hold a NUL character"
    return None


class Issues:
    """Collects errors and warnings while a validator walks a payload."""

    def __init__(self) -> None:
        self.errors: list[FieldIssue] = []
        self.warnings: list[FieldIssue] = []

    def error(self, path: str, message: str, code: str = "invalid") -> None:
        self.errors.append(FieldIssue(path=path, message=message, code=code))

    def warn(self, path: str, message: str, code: str = "warning") -> None:
        self.warnings.append(FieldIssue(path=path, message=message, code=code))

    def integer(
        self,
        obj: dict[str, Any],
        key: str,
        path: str,
        *,
        required: bool,
        minimum: int,
        maximum: int = INT_MAX,
        nullable: bool = False,
    ) -> int | None:
        """Check ``obj[key]`` is an integer in [minimum, maximum]; return it, or None."""
        where = join(path, key)
        if key not in obj or (obj[key] is None and not nullable):
            if required:
                self.error(
                    where, f"{key} is required (an integer of at least {minimum})", "required"
                )
            return None
        value = obj[key]
        if value is None:
            return None
        number = as_int(value)
        if number is None:
            got = show(value) if isinstance(value, float) else json_type(value)
            self.error(where, f"{key} must be an integer, not {got}", "type")
            return None
        if number < minimum:
            self.error(where, f"{key} must be at least {minimum}, got {show(number)}", "range")
            return None
        if number > maximum:
            self.error(where, f"{key} must be at most {maximum}, got {show(number)}", "range")
            return None
        return number

    def string(
        self,
        obj: dict[str, Any],
        key: str,
        path: str,
        *,
        required: bool,
        non_blank: bool = False,
        pattern: re.Pattern[str] | None = None,
        rule: str = "",
    ) -> str | None:
        """Check ``obj[key]`` is a string (non-blank / matching ``pattern``); return it."""
        where = join(path, key)
        if key not in obj or obj[key] is None:
            if required:
                self.error(where, f"{key} is required (a string)", "required")
            return None
        value = obj[key]
        if not isinstance(value, str):
            self.error(where, f"{key} must be a string, not {json_type(value)}", "type")
            return None
        if non_blank and not value.strip():
            self.error(where, f"{key} must not be empty", "required")
            return None
        if pattern is not None and not pattern.fullmatch(value):
            self.error(where, f"{key} {show(value)} must match {rule}", "pattern")
            return None
        return value


def dedupe(issues: list[FieldIssue]) -> list[FieldIssue]:
    """Drop repeats (the same rule found by translation and again by validation)."""
    seen: set[tuple[str, str]] = set()
    out: list[FieldIssue] = []
    for issue in issues:
        key = (issue.path, issue.message)
        if key not in seen:
            seen.add(key)
            out.append(issue)
    return out


def too_many_tasks(spec: JobSpec, locate: Callable[[str | None, str], str]) -> list[FieldIssue]:
    """A job that would hold more than MAX_JOB_TASKS tasks, at the replicas (an elastic
    role's maximum, where that is more) of the role that holds most (``locate``: where a
    role's field is written); else nothing."""
    sizes = {role.name: max(role.replicas, role.max_replicas or 0) for role in spec.roles}
    total = sum(sizes.values())
    if total <= MAX_JOB_TASKS:
        return []
    largest = max(sizes, key=lambda name: sizes[name])
    role = next(r for r in spec.roles if r.name == largest)
    field = "max_replicas" if (role.max_replicas or 0) > role.replicas else "replicas"
    return [
        FieldIssue(
            path=locate(largest, field),
            code="too_many_tasks",
            message=f"the job asks for {total} tasks in all ({largest}: {sizes[largest]}); "
            f"a job holds at most {MAX_JOB_TASKS}, as a Kubernetes Indexed Job does",
        )
    ]


def masked_secrets(spec: JobSpec, locate: Callable[[str | None, str], str]) -> list[FieldIssue]:
    """A secret whose value is the mask a job's view shows in its place (a job copied
    from its own view: the console's Clone, a GET's answer): run so, it would use
    '******' as a credential and fail later, less clearly. Any dialect's."""
    return [
        FieldIssue(
            path=locate(None, "secrets"),
            code="hidden",
            message=f"secret {secret.name!r} holds {REDACTED!r}, the mask a job's view shows "
            "in place of its value: write the value again",
        )
        for secret in spec.secrets
        if secret.value == REDACTED
    ]


def shown_tasks(roles: list[Any], default: int = 0) -> list[int]:
    """How many of each stored role's tasks (``roles``: the spec's, as dicts) a view
    lists: their replicas, but never more than a job may hold, all roles together (a
    job refused for holding more is still on record, spec and all)."""
    left = MAX_JOB_TASKS
    counts = []
    for role in roles:
        replicas = role.get("replicas") if isinstance(role, dict) else None
        count = (
            replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else default
        )
        count = max(0, min(count, left))
        left -= count
        counts.append(count)
    return counts
