"""Validation's HTTP app: its health, and the dry run (``POST /v1/jobs:validate``)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from trainyard_common.auth import TokenStore, identity_dependency
from trainyard_common.cluster import ClusterSpec
from trainyard_common.runtime import health_app

from . import dry_run
from .adapters.names import NameRegistry

SERVICE = "validation"


def create_app(
    cluster: Callable[[], ClusterSpec], names: NameRegistry, tokens: TokenStore
) -> FastAPI:
    """``cluster()`` is the cluster as it is at each request (nodes come and go)."""
    app = health_app(SERVICE)
    app.include_router(dry_run.router(cluster, names, identity_dependency(tokens)))
    return app
