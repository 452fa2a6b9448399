"""Alibaba Cloud API request signatures, checked on the server side. Pure: no I/O.

The official SDKs (``alibabacloud_tea_openapi``) sign a request in one of two ways, and
a PAI-DLC client may use either, so both are verified:

- ``ACS3-HMAC-SHA256`` (the default of tea-openapi 0.4, what ``pai-dlc20201203`` 1.11
  sends): ``Authorization: ACS3-HMAC-SHA256 Credential=<AK>,SignedHeaders=a;b,
  Signature=<hex>``. The canonical request is ``METHOD\\nPATH\\nQUERY\\nHEADERS\\n
  SIGNED\\nSHA256(body)`` (``Utils.get_authorization``); the string to sign is
  ``ACS3-HMAC-SHA256\\n`` + hex SHA-256 of it; the signature is hex HMAC-SHA256.
- ROA "v2" (``Config(signature_algorithm="v2")``, older SDKs):
  ``Authorization: acs <AK>:<base64 HMAC-SHA1>`` over ``METHOD\\naccept\\ncontent-md5\\n
  content-type\\ndate\\n`` + sorted ``x-acs-*`` headers + path?sorted-query
  (``Utils.get_string_to_sign``).

Each function mirrors the SDK function named in its docstring, character for character:
the tests check them against signatures the SDK itself computed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote

ACS3 = "ACS3-HMAC-SHA256"
# As Alibaba Cloud has it: x-acs-date is "a time within the 15 minutes before the request
# is sent". A request signed longer ago is refused; one dated in the future only within
# a minute of clock drift. Within that window each nonce is taken once (the caller keeps
# them: ``nonce_key``), so a captured request cannot be sent again.
MAX_AGE_S = 15 * 60
MAX_AHEAD_S = 60
NONCE_HEADER = "x-acs-signature-nonce"
# How long a nonce is remembered: as long as a request carrying it can be accepted.
NONCE_TTL_S = MAX_AGE_S + MAX_AHEAD_S

_ACS3_RE = re.compile(
    r"ACS3-HMAC-SHA256\s+Credential=(?P<ak>[^,\s]+)\s*,\s*SignedHeaders=(?P<signed>[^,\s]*)"
    r"\s*,\s*Signature=(?P<sig>[0-9a-fA-F]+)\s*$"
)
_ROA_RE = re.compile(r"acs\s+(?P<ak>[^:\s]+):(?P<sig>\S+)\s*$")


class SignatureError(ValueError):
    """The request's signature does not hold; ``code`` is Alibaba Cloud's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SignedRequest:
    """A request as the server received it.

    ``path`` is the path as sent (still percent-encoded, as the SDK signed it);
    ``query`` the decoded name/value pairs; ``headers`` lower-cased names, each with its
    values in the order received."""

    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None


def headers_of(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in pairs:
        out.setdefault(name.lower(), []).append(value)
    return out


def access_key_id(authorization: str | None) -> str | None:
    """The AccessKey id an Authorization header names, in either scheme; None if it is
    not an Alibaba Cloud signature."""
    if not authorization:
        return None
    match = _ACS3_RE.match(authorization.strip()) or _ROA_RE.match(authorization.strip())
    return match.group("ak") if match else None


# ----------------------------------------------------------------- ACS3-HMAC-SHA256


def canonical_query(query: list[tuple[str, str]]) -> str:
    """``get_canonical_query_string``: keys sorted and as they are, values quoted with
    only ``~`` safe. The SDK sends a dict, so a repeated key keeps its last value."""
    merged = dict(query)
    return "&".join(f"{key}={quote(merged[key], safe='~')}" for key in sorted(merged))


def canonical_headers(headers: dict[str, list[str]], signed: list[str]) -> str:
    """``get_canonicalized_headers`` over the headers the client said it signed."""
    lines = []
    for name in signed:
        values = sorted(v.strip() for v in headers.get(name, []))
        lines.append(f"{name}:{','.join(values)}\n")
    return "".join(lines)


def acs3_signature(
    request: SignedRequest, signed: list[str], payload_hash: str, secret: str
) -> str:
    """``Utils.get_authorization``'s signature for ``request``."""
    canonical = (
        f"{request.method.upper()}\n{request.path or '/'}\n"
        f"{canonical_query(request.query)}\n"
        f"{canonical_headers(request.headers, signed)}\n"
        f"{';'.join(signed)}\n{payload_hash}"
    )
    to_sign = f"{ACS3}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    return hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------- ROA v2


def roa_string_to_sign(request: SignedRequest) -> str:
    """``Utils.get_string_to_sign``."""

    def one(name: str) -> str:
        return request.header(name) or ""

    head = (
        f"{request.method.upper()}\n{one('accept')}\n{one('content-md5')}\n"
        f"{one('content-type')}\n{one('date')}\n"
    )
    acs = "".join(
        f"{name}:{request.header(name)}\n"
        for name in sorted(n for n in request.headers if n.startswith("x-acs-"))
    )
    merged = dict(request.query)
    resource = request.path
    if merged:
        resource += "?" + "&".join(
            key if merged[key] == "" else f"{key}={merged[key]}" for key in sorted(merged)
        )
    return head + acs + resource


def roa_signature(request: SignedRequest, secret: str) -> str:
    """``Utils.get_roasignature``."""
    digest = hmac.new(secret.encode(), roa_string_to_sign(request).encode(), hashlib.sha1)
    return base64.b64encode(digest.digest()).decode()


# ------------------------------------------------------------------------- checking


def _request_time(request: SignedRequest) -> datetime | None:
    stamp = request.header("x-acs-date")
    if stamp:
        try:
            return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return None
    date = request.header("date")
    if date:
        try:
            return parsedate_to_datetime(date)
        except (TypeError, ValueError, IndexError):
            return None
    return None


def _check_time(request: SignedRequest, now: datetime | None, max_age_s: float) -> None:
    if now is None:
        return
    at = _request_time(request)
    if at is None:
        raise SignatureError(
            "MissingTimestamp", "the request carries no valid x-acs-date or Date header"
        )
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    age = (now - at).total_seconds()
    if age > max_age_s:
        raise SignatureError(
            "InvalidTimeStamp.Expired",
            f"the request was signed at {at.isoformat()}, more than {int(max_age_s)} s "
            "before the server's time",
        )
    if -age > MAX_AHEAD_S:
        raise SignatureError(
            "InvalidTimeStamp.Format",
            f"the request is dated {at.isoformat()}, later than the server's time "
            f"(by more than {MAX_AHEAD_S} s of clock drift)",
        )


def nonce_key(request: SignedRequest, access_key: str) -> str:
    """What a request's nonce is remembered under (its AccessKey's and its own); a
    request without one is refused, as a replay could not be told from it."""
    nonce = request.header(NONCE_HEADER)
    if not nonce:
        raise SignatureError(
            "MissingSignatureNonce", "the request carries no x-acs-signature-nonce header"
        )
    return hashlib.sha256(f"{access_key}\n{nonce}".encode()).hexdigest()


def verify(
    request: SignedRequest,
    secret: str,
    *,
    now: datetime | None = None,
    max_age_s: float = MAX_AGE_S,
) -> None:
    """Raise SignatureError unless ``request`` was signed with ``secret``. ``now``
    (when given) also bounds how old the request may be."""
    authorization = (request.header("authorization") or "").strip()
    acs3 = _ACS3_RE.match(authorization)
    if acs3:
        _check_time(request, now, max_age_s)
        body_hash = hashlib.sha256(request.body).hexdigest()
        claimed = request.header("x-acs-content-sha256")
        if claimed is not None and claimed.lower() != body_hash:
            raise SignatureError(
                "ContentSHA256Mismatch", "x-acs-content-sha256 is not the SHA-256 of the body"
            )
        signed = [name for name in acs3.group("signed").lower().split(";") if name]
        if "x-acs-content-sha256" not in signed and request.body:
            raise SignatureError(
                "IncompleteSignature", "a request with a body must sign x-acs-content-sha256"
            )
        # The official SDKs sign every x-acs-* header. Unsigned, the date and nonce of a
        # captured request could be changed to send it again, its action to another.
        for name in ("x-acs-date", NONCE_HEADER, "x-acs-action"):
            if name not in signed and request.header(name) is not None:
                raise SignatureError("IncompleteSignature", f"the request must sign {name}")
        expected = acs3_signature(request, signed, body_hash, secret)
        if not hmac.compare_digest(expected.encode(), acs3.group("sig").lower().encode()):
            raise SignatureError(
                "SignatureDoesNotMatch", "the request signature does not match (ACS3-HMAC-SHA256)"
            )
        return
    roa = _ROA_RE.match(authorization)
    if roa:
        _check_time(request, now, max_age_s)
        # ROA v2 does not sign the body; Content-MD5, which it signs, binds the body
        # where the client sends it. The SDKs never do (and pai-dlc's older clients
        # sign only v2), so, as at Alibaba, a body without it is accepted: its single-
        # use nonce stops a replay, and only a man in the middle of plain HTTP could
        # swap it (docs/security.md).
        md5 = request.header("content-md5")
        if md5 is not None and md5 != base64.b64encode(hashlib.md5(request.body).digest()).decode():  # noqa: S324
            raise SignatureError("ContentMD5Mismatch", "Content-MD5 is not the body's")
        if not hmac.compare_digest(
            roa_signature(request, secret).encode(), roa.group("sig").encode()
        ):
            raise SignatureError(
                "SignatureDoesNotMatch", "the request signature does not match (ROA HMAC-SHA1)"
            )
        return
    raise SignatureError(
        "IncompleteSignature",
        "Authorization must be 'ACS3-HMAC-SHA256 Credential=...' or "
        "'acs <AccessKeyId>:<signature>'",
    )
