"""What a dialect's intake API gets to work with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from trainyard_common.auth import Identity, TokenStore

from ..handlers import Deps


@dataclass(frozen=True)
class IntakeContext:
    deps: Deps  # submit_job / request_stop take these
    tokens: TokenStore
    # FastAPI dependency resolving the request's bearer token to an Identity.
    current: Callable[..., Awaitable[Identity]]
    # The same, asked of the token store itself: for the routes that make credentials.
    fresh: Callable[..., Awaitable[Identity]]
    # The intake service's own database, for a dialect's registries (DLC data sources).
    db: Any = None
