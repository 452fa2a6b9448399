"""Secrets sealed for the few that may read them: a job's secret values on the bus and
the AccessKey secrets at rest.

AES-256-GCM with the platform's key (``YARD_SECRETS_KEY``, 32 bytes in URL-safe
base64), which the stack makes once under the data directory and hands only to the
services that must open what it seals: intake (which seals a job's secrets before
they are published), the launcher (which opens them at launch, the only moment a
secret is in clear outside the submitting request) and, for the AccessKey secrets that
verify PAI-DLC signatures, status and the launcher too. Validation and placement never
hold it: the job they pass on carries ``enc:v1:<nonce and ciphertext>`` where a value
was. Each seal is bound to what it is for (``context``: the job id, or the key id), so
a sealed value cannot be moved to another job and opened there.
"""

from __future__ import annotations

import base64
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SECRETS_KEY_ENV = "YARD_SECRETS_KEY"
PREFIX = "enc:v1:"
_NONCE = 12


class SecretsUnavailable(Exception):
    """A sealed value that cannot be opened here (no key, another key, tampered)."""


def new_key() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


class SecretBox:
    def __init__(self, key: str) -> None:
        raw = base64.urlsafe_b64decode(key.encode())
        if len(raw) != 32:
            raise ValueError(f"{SECRETS_KEY_ENV} must be 32 bytes in URL-safe base64")
        self._aead = AESGCM(raw)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> SecretBox | None:
        key = (environ if environ is not None else os.environ).get(SECRETS_KEY_ENV)
        return cls(key) if key else None

    def seal(self, value: str, context: str) -> str:
        if is_sealed(value):
            return value  # sealed already (a redelivery, a replay)
        nonce = secrets.token_bytes(_NONCE)
        sealed = self._aead.encrypt(nonce, value.encode(), context.encode())
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, value: str, context: str) -> str:
        if not is_sealed(value):
            return value
        try:
            raw = base64.urlsafe_b64decode(value[len(PREFIX) :].encode())
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], context.encode()).decode()
        except (InvalidTag, ValueError) as exc:
            raise SecretsUnavailable(
                "a sealed secret cannot be opened with this platform's key"
            ) from exc


def open_value(box: SecretBox | None, value: str, context: str) -> str:
    """``value`` in clear; a sealed one needs the box."""
    if not is_sealed(value):
        return value
    if box is None:
        raise SecretsUnavailable(f"a sealed secret, and {SECRETS_KEY_ENV} is not set here")
    return box.open(value, context)
