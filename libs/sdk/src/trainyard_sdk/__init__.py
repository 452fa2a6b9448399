"""trainyard_sdk: the Python client for Trainyard's HTTP API, and the ``yard`` CLI."""

from .client import (
    DEFAULT_URL,
    ApiError,
    Client,
    TrainyardError,
    UnreachableError,
    WaitTimeout,
    discover_token,
    load_payload,
)

__all__ = [
    "DEFAULT_URL",
    "ApiError",
    "Client",
    "TrainyardError",
    "UnreachableError",
    "WaitTimeout",
    "discover_token",
    "load_payload",
]
