"""The dialects Trainyard speaks, in the order detection tries them.

A dialect is a handful of pure functions; adding one is writing its module and listing
its ``DIALECT`` in ``dialects/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..events import FieldIssue
from ..jobspec import JobSpec
from .translation import Translation


def _no_issues(payload: Any, spec: JobSpec) -> list[FieldIssue]:
    return []


def _as_is(payload: Any) -> Any:
    return payload


@dataclass(frozen=True)
class Dialect:
    name: str
    # How a payload of this dialect is recognised, for the message when none fits.
    signature: str
    looks_like: Callable[[dict[str, Any]], bool]
    # Total: never raises; problems become Translation.errors with payload paths.
    translate: Callable[[Any, str], Translation]
    # Where a canonical field is written in the payload as the user wrote it, for
    # problems found after translation (e.g. against the cluster): (payload, role name or
    # None for the job, canonical field; "role" for the role itself) -> "$.…". Total,
    # like translate: a payload it cannot follow gets the nearest enclosing path.
    field_path: Callable[[Any, str | None, str], str]
    # The dialect's rules again, run by the validation service on the original payload
    # (so a producer that publishes JobSubmitted itself cannot skip them).
    validate: Callable[[Any, JobSpec], list[FieldIssue]] = _no_issues
    warnings: Callable[[Any, JobSpec], list[FieldIssue]] = _no_issues
    # The payload as it may be stored and shown back (secret values hidden).
    redact: Callable[[Any], Any] = _as_is
