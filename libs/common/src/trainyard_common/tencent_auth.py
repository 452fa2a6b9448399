"""Tencent Cloud API requests (``tccli tia ...``, the TIA SDKs): one ``POST /`` per action,
named by ``X-TC-Action``, signed with TC3-HMAC-SHA256 by a SecretId/SecretKey pair, and
answered ``{"Response": {..., "RequestId"}}`` with errors as ``{"Response": {"Error":
{"Code", "Message"}, "RequestId"}}`` (HTTP 200, as Tencent Cloud answers them).

A SecretId/SecretKey pair is one of the platform's access keys (the same ones PAI-DLC's
SDK signs with: ``POST /v1/access-keys``). The signature is checked as the SDK computes
it (canonical request over the method, ``/``, the query, ``content-type`` and ``host``,
and the body's SHA-256); a request more than five minutes from now is refused. TC3 has
no nonce, and a client polling DescribeJob sends the same signed request within a
second, so a repeat is not refused: the writes are idempotent by name (a second
CreateJob of a name is ``FailedOperation.AlreadyExists``, a DeleteJob stops a stopped job again)."""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from .auth import AccessKeyStore, Identity, TokenStore
from .limits import digits
from .parsing import BodyError, parse_json

ALGORITHM = "TC3-HMAC-SHA256"
SKEW_S = 300
_AUTH = re.compile(
    r"^TC3-HMAC-SHA256 Credential=(?P<id>[^/,\s]+)/(?P<date>\d{4}-\d{2}-\d{2})/"
    r"(?P<service>[a-z0-9]+)/tc3_request, SignedHeaders=(?P<headers>[a-z0-9;-]+), "
    r"Signature=(?P<sig>[0-9a-f]{64})$"
)


class TencentError(Exception):
    """An error in the Cloud API's shape: ``code`` as Tencent names them."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def answer(body: dict[str, Any], request_id: str) -> JSONResponse:
    return JSONResponse({"Response": {**body, "RequestId": request_id}})


def error_answer(error: TencentError, request_id: str) -> JSONResponse:
    return answer({"Error": {"Code": error.code, "Message": error.message}}, request_id)


def read_body(raw: bytes, limit: int = 1024 * 1024) -> dict[str, Any]:
    """An action's JSON body (an object), bounded; TencentError says what is wrong."""
    try:
        body = parse_json(raw or b"{}", limit)
    except BodyError as exc:
        raise TencentError("InvalidParameter", f"the body cannot be read: {exc}") from exc
    if not isinstance(body, dict):
        raise TencentError("InvalidParameter", "the body must be a JSON object")
    return body


def new_request_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Signed:
    """What a TC3 signature covers, as the server received it."""

    method: str
    query: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes


def signature(secret_key: str, date: str, service: str, string_to_sign: str) -> str:
    def mac(key: bytes, text: str) -> bytes:
        return hmac.new(key, text.encode(), hashlib.sha256).digest()

    signing = mac(mac(mac(("TC3" + secret_key).encode(), date), service), "tc3_request")
    return hmac.new(signing, string_to_sign.encode(), hashlib.sha256).hexdigest()


def string_to_sign(
    signed: Signed, signed_headers: list[str], date: str, service: str, lower: bool = True
) -> str:
    # "头部 key 和 value 统一转成小写，并去掉首尾空格": Tencent's own example signs
    # x-tc-action:describeinstances. Its SDKs lower-case only x-tc-action and sign host
    # and content-type as sent: ``lower=False`` is their form.
    def value(name: str) -> str:
        text = signed.headers.get(name, "").strip()
        return text.lower() if lower or name == "x-tc-action" else text

    canonical_headers = "".join(f"{name}:{value(name)}\n" for name in signed_headers)
    payload = (
        "UNSIGNED-PAYLOAD"
        if signed.headers.get("x-tc-content-sha256") == "UNSIGNED-PAYLOAD"
        else hashlib.sha256(signed.body).hexdigest()
    )
    canonical = "\n".join(
        [signed.method, "/", signed.query, canonical_headers, ";".join(signed_headers), payload]
    )
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    timestamp = signed.headers.get("x-tc-timestamp", "")
    return f"{ALGORITHM}\n{timestamp}\n{date}/{service}/tc3_request\n{digest}"


def verify(signed: Signed, secret_key: str, now: datetime) -> str:
    """Check the request's signature; returns it. TencentError names what is wrong, as
    Tencent Cloud does."""
    found = _AUTH.match(signed.headers.get("authorization", ""))
    if found is None:
        raise TencentError("AuthFailure.SignatureFailure", "the Authorization header is malformed")
    names = found["headers"].split(";")
    if "host" not in names or "content-type" not in names:
        raise TencentError(
            "AuthFailure.SignatureFailure", "SignedHeaders must include content-type and host"
        )
    text = signed.headers.get("x-tc-timestamp", "")
    if not digits(text):  # int() takes 4,300 digits, past what a float comparison holds
        raise TencentError("MissingParameter", "X-TC-Timestamp is missing or not a number")
    timestamp = int(text)
    if abs(int(now.timestamp()) - timestamp) > SKEW_S:
        raise TencentError(
            "AuthFailure.SignatureExpire",
            "the request's X-TC-Timestamp is more than 5 minutes away",
        )
    if datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d") != found["date"]:
        raise TencentError(
            "AuthFailure.SignatureFailure", "the Credential's date is not the timestamp's"
        )
    # Either form: the guide's (every value lower-cased) or the SDKs' (an upper-case
    # letter in the endpoint or the content type signed as sent).
    matched = [
        hmac.compare_digest(
            signature(
                secret_key,
                found["date"],
                found["service"],
                string_to_sign(signed, names, found["date"], found["service"], lower),
            ).encode(),
            found["sig"].encode(),
        )
        for lower in (True, False)
    ]
    if not any(matched):
        raise TencentError("AuthFailure.SignatureFailure", "the request signature does not match")
    return found["sig"]


def secret_id(authorization: str) -> str | None:
    found = _AUTH.match(authorization)
    return found["id"] if found else None


def tencent_identity(
    keys: AccessKeyStore, tokens: TokenStore
) -> Callable[[Request], Awaitable[Identity]]:
    """The caller of a Cloud API request: its SecretId's user, once the signature holds
    (a bearer token is accepted too, for curl and tests)."""

    async def identity(request: Request) -> Identity:
        authorization = request.headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            found = await tokens.resolve(authorization[7:].strip())
            if found is None:
                raise TencentError("AuthFailure.TokenFailure", "unknown bearer token")
            return found
        key_id = secret_id(authorization)
        if key_id is None:
            raise TencentError(
                "AuthFailure.SignatureFailure", "the request is not signed (TC3-HMAC-SHA256)"
            )
        key = await keys.lookup(key_id)
        if key is None:
            raise TencentError("AuthFailure.SecretIdNotFound", f"SecretId {key_id} does not exist")
        headers = {k.lower(): v for k, v in request.headers.items()}
        # The Host the client signed: the gateway passes it on.
        headers["host"] = request.headers.get("x-forwarded-host") or headers.get("host", "")
        signed = Signed(request.method, request.url.query, headers, await request.body())
        verify(signed, key.secret, datetime.now(UTC))
        return Identity(key.user, admin=False)

    return identity
