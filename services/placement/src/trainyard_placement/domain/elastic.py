"""Elastic roles: checking a requested size against a role's bounds, and the spec at
that size. A role is elastic when its spec gives both ``min_replicas`` and
``max_replicas`` (T9k ``elastic``/``runMode.elastic``, native roles)."""

from __future__ import annotations

from dataclasses import dataclass

from trainyard_common.jobspec import JobSpec


@dataclass(frozen=True)
class ScaleProblem:
    """Why a scale request is refused; ``field`` names the request's field at fault."""

    field: str
    message: str


def scale_problem(spec: JobSpec, role: str, replicas: int) -> ScaleProblem | None:
    try:
        found = spec.role(role)
    except KeyError:
        names = ", ".join(r.name for r in spec.roles)
        return ScaleProblem("role", f"role: job has no role {role!r} (its roles: {names})")
    low, high = found.min_replicas, found.max_replicas
    if low is None or high is None:
        return ScaleProblem(
            "role", f"role: role {role!r} is not elastic: it has no min_replicas/max_replicas"
        )
    if not low <= replicas <= high:
        return ScaleProblem(
            "replicas", f"replicas: {replicas} is outside role {role!r}'s bounds [{low}, {high}]"
        )
    return None


def scaled(spec: JobSpec, role: str, replicas: int) -> JobSpec:
    """The spec with ``role`` at ``replicas`` (checked with :func:`scale_problem` first)."""
    roles = [
        r.model_copy(update={"replicas": replicas}) if r.name == role else r for r in spec.roles
    ]
    return spec.model_copy(update={"roles": roles})
