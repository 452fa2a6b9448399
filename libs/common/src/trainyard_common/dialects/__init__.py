"""Job dialects: the formats users submit jobs in, each translated to the canonical
JobSpec. Pure functions, no I/O.

``translate`` is total: whatever JSON-like value it is given, it returns a Translation
(a spec, possibly the empty stand-in, and the problems located by JSON path in the
payload as the user wrote it); it never raises.
"""

from __future__ import annotations

from typing import Any

from ..events import FieldIssue
from ..parsing import MAX_BODY, BodyError, parse_json, parse_yaml
from . import dlc, kubeflow, native, openpai, openpai_v2, t9k, ti
from .native import translate_native, validate_native
from .openpai import openpai_warnings, translate_openpai, validate_openpai
from .registry import Dialect
from .translation import Translation, UnknownDialect, dedupe, empty_spec

# Detection tries these in order; the first whose signature fits wins. A new dialect
# adds its module's REGISTRATION here (native last: its keys are the most generic).
REGISTERED: tuple[Dialect, ...] = (
    openpai_v2.REGISTRATION,  # before openpai: a v2 job has taskRoles too
    openpai.REGISTRATION,
    ti.REGISTRATION,
    dlc.REGISTRATION,
    t9k.REGISTRATION,
    kubeflow.REGISTRATION,
    native.REGISTRATION,
)
BY_NAME: dict[str, Dialect] = {d.name: d for d in REGISTERED}
DIALECTS = tuple(BY_NAME)

__all__ = [
    "BY_NAME",
    "DIALECTS",
    "Dialect",
    "Translation",
    "UnknownDialect",
    "dedupe",
    "detect",
    "dialect",
    "field_path",
    "forced_dialect",
    "openpai_warnings",
    "translate",
    "translate_native",
    "translate_openpai",
    "validate_native",
    "validate_openpai",
]


def forced_dialect(name: str | None) -> str | None:
    """The dialect a request forces (``?dialect=``), checked before anything is read;
    None (left out or empty) detects it; UnknownDialect names the parameter."""
    return dialect(name).name if name else None


def dialect(name: str) -> Dialect:
    try:
        return BY_NAME[name.lower()]
    except KeyError:
        raise UnknownDialect(
            f"dialect: unknown dialect {name[:64]!r}; known: {', '.join(DIALECTS)}"
        ) from None


def detect(payload: Any) -> str:
    """Which dialect a payload is written in; UnknownDialect (listing what was tried)
    when none fits."""
    tried = "tried " + "; ".join(d.signature for d in REGISTERED)
    if not isinstance(payload, dict):
        kind = type(payload).__name__ if payload is not None else "null"
        raise UnknownDialect(f"the job is a {kind}, not a JSON object; {tried}")
    for candidate in REGISTERED:
        if candidate.looks_like(payload):
            return candidate.name
    keys = ", ".join(sorted(map(str, payload))[:10]) or "none"
    raise UnknownDialect(f"no known dialect has these top-level keys ({keys}); {tried}")


# The dialects whose own platform reads a job's YAML with js-yaml 3 (OpenPAI's
# rest-server, yaml.safeLoad): yes, no, on and off are words there, 1e-4 a number.
JS_YAML_DIALECTS = frozenset({openpai.DIALECT, openpai_v2.DIALECT})


def parse_job_yaml(raw: bytes | str, max_bytes: int = MAX_BODY, dialect: str | None = None) -> Any:
    """A job written in YAML, its scalars read as its own platform reads them: as YAML
    1.1 (Kubernetes' YAML, and so Kubeflow's and T9k's), or, for OpenPAI's job, as
    js-yaml 3 (BodyError for a body that is not one YAML document). ``dialect``: the
    job's, where the caller names it; else detected."""
    if dialect is not None:
        return parse_yaml(raw, max_bytes, js_yaml=dialect.lower() in JS_YAML_DIALECTS)
    value = parse_yaml(raw, max_bytes)
    try:
        dialect = detect(value)
    except UnknownDialect:
        return value
    return parse_yaml(raw, max_bytes, js_yaml=True) if dialect in JS_YAML_DIALECTS else value


def parse_job(
    raw: bytes | str,
    content_type: str | None,
    max_bytes: int = MAX_BODY,
    dialect: str | None = None,
) -> Any:
    """A job body: YAML when ``content_type`` says so, JSON otherwise, and with no
    content type at all (a file, a bus message) JSON, else YAML; its YAML read as
    ``parse_job_yaml`` reads it."""
    if content_type is None:
        try:
            return parse_json(raw, max_bytes)
        except BodyError as exc:
            if exc.status == 413:
                raise
    elif "yaml" not in content_type.lower():
        return parse_json(raw, max_bytes)
    return parse_job_yaml(raw, max_bytes, dialect)


def translate(payload: Any, dialect: str | None = None, user: str = "") -> Translation:
    try:
        chosen = BY_NAME.get((dialect or detect(payload)).lower())
    except UnknownDialect as exc:
        issue = FieldIssue(path="$", message=str(exc), code="unknown_dialect")
        return Translation(empty_spec(user=user), "unknown", [issue])
    if chosen is None:
        issue = FieldIssue(
            path="$",
            message=f"unknown dialect {dialect!r}; known: {', '.join(DIALECTS)}",
            code="unknown_dialect",
        )
        return Translation(empty_spec(user=user), str(dialect), [issue])
    try:
        return chosen.translate(payload, user)
    except Exception as exc:  # noqa: BLE001 - promised total; a bug must not drop the job
        issue = FieldIssue(
            path="$", message=f"the job could not be translated: {exc!r}", code="internal"
        )
        return Translation(empty_spec(user=user), chosen.name, [issue])


def field_path(dialect_name: str, payload: Any, role: str | None, field: str) -> str:
    """Where a canonical field is written in ``payload`` (the job as the user sent it),
    for problems found after translation: ("openpai_v2", job, "worker", "memory_mb") ->
    "$.taskRoles.worker.resourcePerInstance.memoryMB". ``role`` is the role's name in
    the spec (None: a job-wide field)."""
    chosen = BY_NAME.get(dialect_name, native.REGISTRATION)
    try:
        return chosen.field_path(payload, role, field)
    except Exception:  # noqa: BLE001 - a path is advice; a bug must not lose the rejection
        return "$"
