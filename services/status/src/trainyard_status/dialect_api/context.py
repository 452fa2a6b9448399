"""What a dialect's read API gets to work with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from trainyard_common.auth import Identity, TokenStore

from ..adapters.views import JobViews, job_view


@dataclass(frozen=True)
class StatusContext:
    views: JobViews
    tokens: TokenStore
    # FastAPI dependency resolving the request's bearer token to an Identity.
    current: Callable[..., Awaitable[Identity]]

    async def full_view(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The canonical view of a stored job (what GET /v1/jobs/{id} answers), which
        the dialect views are rendered from."""
        return job_view(doc, await self.views.job_tasks(doc["_id"]))
