"""Job dialects: the formats users submit jobs in, each translated to the canonical
JobSpec. Pure functions, no I/O.

``translate`` is total: whatever JSON-like value it is given, it returns a Translation
(a spec, possibly the empty stand-in, and the problems located by JSON path in the
payload as the user wrote it); it never raises.
"""

from __future__ import annotations

from typing import Any

from ..events import FieldIssue
from . import native, openpai
from .native import translate_native, validate_native
from .openpai import openpai_warnings, translate_openpai, validate_openpai
from .translation import Translation, UnknownDialect, dedupe, empty_spec

DIALECTS = ("openpai", "native")

__all__ = [
    "DIALECTS",
    "Translation",
    "UnknownDialect",
    "dedupe",
    "detect",
    "field_path",
    "openpai_warnings",
    "translate",
    "validate_native",
    "validate_openpai",
]


def detect(payload: Any) -> str:
    """Which dialect a payload is written in; UnknownDialect when none fits."""
    tried = ("tried openpai (an object with jobName or taskRoles) and native "
             "(an object with name and roles)")
    if not isinstance(payload, dict):
        kind = type(payload).__name__ if payload is not None else "null"
        raise UnknownDialect(f"the job is a {kind}, not a JSON object; {tried}")
    if "jobName" in payload or "taskRoles" in payload:
        return "openpai"
    if "name" in payload and "roles" in payload:
        return "native"
    keys = ", ".join(sorted(map(str, payload))[:10]) or "none"
    raise UnknownDialect(f"no known dialect has these top-level keys ({keys}); {tried}")


def translate(payload: Any, dialect: str | None = None, user: str = "") -> Translation:
    try:
        name = (dialect or detect(payload)).lower()
    except UnknownDialect as exc:
        issue = FieldIssue(path="$", message=str(exc), code="unknown_dialect")
        return Translation(empty_spec(user=user), "unknown", [issue])
    try:
        if name == "openpai":
            return translate_openpai(payload, user)
        if name == "native":
            return translate_native(payload, user)
    except Exception as exc:  # noqa: BLE001 - promised total; a bug must not drop the job
        issue = FieldIssue(path="$", message=f"the job could not be translated: {exc!r}",
                           code="internal")
        return Translation(empty_spec(user=user), name, [issue])
    issue = FieldIssue(path="$", message=f"unknown dialect {dialect!r}; known: "
                       f"{', '.join(DIALECTS)}", code="unknown_dialect")
    return Translation(empty_spec(user=user), name, [issue])


def field_path(dialect: str, role_index: int | None, field: str) -> str:
    """The payload path of a canonical field, for problems found after translation:
    ("openpai", 0, "gpu") -> "$.taskRoles[0].gpuNumber"."""
    if dialect == "openpai":
        return openpai.field_path(role_index, field)
    return native.field_path(role_index, field)
