"""Which service answers which request: the one table behind the single base URL."""

from __future__ import annotations

import re

# (method or "*", path pattern, service) — first match wins.
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/v1/jobs$"), "intake"),
    ("POST", re.compile(r"^/v1/jobs/[^/]+/stop$"), "intake"),
    ("POST", re.compile(r"^/v1/tokens$"), "intake"),
    ("GET", re.compile(r"^/v1/jobs/[^/]+/logs$"), "launcher"),
    ("GET", re.compile(r"^/v1/placement(/.*)?$"), "placement"),
    ("GET", re.compile(r"^/v1/jobs(/[^/]+(/events)?)?$"), "status"),
]

BACKENDS = ("intake", "validation", "placement", "launcher", "status")


def route(method: str, path: str) -> str | None:
    for want, pattern, service in ROUTES:
        if (want == "*" or want == method) and pattern.match(path):
            return service
    return None
