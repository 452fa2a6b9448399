"""Placement's settings: every ``YARD_PLACEMENT_*`` variable, parsed in one place at
start. An unknown name or a bad number stops the service, naming the variable, before
it takes any job."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainyard_common.config import number_setting

from .domain.plugins import Rules
from .domain.policies import DEFAULT_POLICY, POLICIES, UnknownPolicy

DEFAULT_LEASE_TTL_S = 5.0
DEFAULT_GROWTH_AFTER_S = 30.0


@dataclass(frozen=True)
class PlacementSettings:
    # YARD_PLACEMENT_POLICY: how a task's node is scored (domain/policies.py).
    policy: str = DEFAULT_POLICY
    # YARD_PLACEMENT_QUEUE_ORDER, _PREEMPTION, _BACKFILL, _MAX_PREEMPTIONS.
    rules: Rules = field(default_factory=Rules)
    # YARD_PLACEMENT_LEASE_TTL_S: a leader that has not renewed its lease this long is
    # replaced.
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    # YARD_PLACEMENT_GROWTH_AFTER_S: an elastic job grows only after running this long.
    growth_after_s: float = DEFAULT_GROWTH_AFTER_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PlacementSettings:
        env = os.environ if env is None else env
        policy = (env.get("YARD_PLACEMENT_POLICY") or DEFAULT_POLICY).strip().lower()
        if policy not in POLICIES:
            raise UnknownPolicy(policy)
        return cls(
            policy=policy,
            rules=Rules.from_env(env),
            lease_ttl_s=number_setting(
                env, "YARD_PLACEMENT_LEASE_TTL_S", DEFAULT_LEASE_TTL_S, above=True
            ),
            growth_after_s=number_setting(
                env, "YARD_PLACEMENT_GROWTH_AFTER_S", DEFAULT_GROWTH_AFTER_S
            ),
        )
