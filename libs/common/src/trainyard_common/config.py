"""Settings shared by every service, read from the environment in one place.

``YARD_*`` variables win; the plain ``NATS_URL`` / ``MONGO_URL`` are honoured too, as
DESIGN §7 promises. No client is built here: bootstrap code builds them from these.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PORTS = {
    "gateway": 8080,
    "intake": 8081,
    "status": 8082,
    "launcher": 8083,
    "validation": 8084,
    "placement": 8085,
}

PLACEHOLDER_SECRETS = {"changeme", "changethis", "secret", "token", "admin"}


class SettingError(ValueError):
    """A setting the service cannot start with; the message names the variable."""


def number_setting(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float = 0,
    above: bool = False,
    whole: bool = False,
) -> float:
    """``env[name]`` as a number (``default`` when unset or empty), at least ``minimum``
    (above it with ``above``), and whole with ``whole``."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise SettingError(f"{name}={raw!r}: not {kind}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SettingError(f"{name}={raw!r}: not a finite number")
    if value < minimum or (above and value == minimum):
        raise SettingError(f"{name}={raw!r}: must be {'above' if above else 'at least'} {minimum}")
    return value


def choice_setting(env: Mapping[str, str], name: str, default: str, choices: Iterable[str]) -> str:
    """``env[name]`` (``default`` when unset or empty), one of ``choices``."""
    known = tuple(choices)
    value = (env.get(name) or default).strip().lower()
    if value not in known:
        raise SettingError(f"{name}={value!r}: must be one of {', '.join(known)}")
    return value


def default_data_dir() -> Path:
    return Path(os.environ.get("YARD_DATA_DIR") or Path.cwd() / ".data").resolve()


def admin_token_path(data_dir: Path) -> Path:
    return data_dir / "admin-token"


@dataclass(frozen=True)
class Settings:
    service: str
    nats_url: str = "nats://127.0.0.1:4222"
    # MongoDB when set; else the embedded SQLite store under ``store_dir``.
    mongo_url: str | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    db_prefix: str = "trainyard"
    host: str = "127.0.0.1"
    port: int = 0
    admin_token: str | None = None

    @classmethod
    def from_env(cls, service: str) -> Settings:
        env = os.environ
        data_dir = default_data_dir()
        token = env.get("YARD_TOKEN") or _read_token(data_dir)
        if token and token.lower() in PLACEHOLDER_SECRETS:
            raise ValueError("YARD_TOKEN is a placeholder; set a real secret")
        port_var = f"YARD_{service.upper()}_PORT"
        return cls(
            service=service,
            nats_url=env.get("YARD_NATS_URL") or env.get("NATS_URL") or cls.nats_url,
            mongo_url=env.get("YARD_MONGO_URL") or env.get("MONGO_URL") or None,
            data_dir=data_dir,
            db_prefix=env.get("YARD_DB_PREFIX", cls.db_prefix),
            host=env.get("YARD_HOST", cls.host),
            port=int(env.get(port_var) or DEFAULT_PORTS.get(service, 0)),
            admin_token=token,
        )

    @property
    def store_dir(self) -> Path:
        """Where the embedded store keeps its files (one per service's database)."""
        return self.data_dir / "store"

    def db_name(self, owner: str | None = None) -> str:
        """Each service keeps its own database; no service reads another's."""
        return f"{self.db_prefix}_{owner or self.service}"


def _read_token(data_dir: Path) -> str | None:
    path = admin_token_path(data_dir)
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
