"""Alibaba Cloud signature checks against signatures the official SDK's own code made
(alibabacloud_tea_openapi.utils.Utils), for both schemes it sends."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest
from alibabacloud_tea_openapi.utils import Utils
from darabonba.core import DaraCore
from darabonba.request import DaraRequest

from trainyard_common.aliyun_auth import (
    SignatureError,
    SignedRequest,
    access_key_id,
    acs3_signature,
    headers_of,
    nonce_key,
    verify,
)
from trainyard_common.auth import MemoryNonces, parse_access_keys

AK, SECRET = "LTAI5tTestKeyId00000001", "TestSecretValue0123456789abcde"
WHEN = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)


def sdk_request(
    method: str,
    path: str,
    query: dict[str, str] | None = None,
    body: dict | None = None,
    *,
    v2: bool = False,
    content_md5: bool = False,
) -> DaraRequest:
    """A request built and signed the way Client.do_request / do_roarequest do."""
    req = DaraRequest()
    req.protocol, req.method, req.pathname = "http", method, path
    req.query = dict(query or {})
    req.headers = {
        "host": "127.0.0.1:8080",
        "x-acs-version": "2020-12-03",
        "x-acs-action": "GetJob",
        "user-agent": "AlibabaCloud (Linux) Python/3.11 TeaDSL/2",
        "accept": "application/json",
        "x-acs-signature-nonce": "5f6a1c2e9d3b4a7f8e0d1c2b3a4f5e6d",
    }
    payload = b""
    if body is not None:
        req.body = DaraCore.to_json_string(body)
        payload = req.body.encode()
        req.headers["content-type"] = "application/json; charset=utf-8"
    if content_md5 and payload:
        req.headers["content-md5"] = base64.b64encode(hashlib.md5(payload).digest()).decode()
    if v2:
        req.headers.update(
            {
                "date": "Mon, 06 May 2024 07:08:09 GMT",
                "x-acs-signature-method": "HMAC-SHA1",
                "x-acs-signature-version": "1.0",
            }
        )
        signature = Utils.get_roasignature(Utils.get_string_to_sign(req), SECRET)
        req.headers["authorization"] = f"acs {AK}:{signature}"
    else:
        req.headers["x-acs-date"] = "2024-05-06T07:08:09Z"
        digest = hashlib.sha256(payload).hexdigest()
        req.headers["x-acs-content-sha256"] = digest
        req.headers["Authorization"] = Utils.get_authorization(
            req, "ACS3-HMAC-SHA256", digest, AK, SECRET
        )
    return req


def received(req: DaraRequest, *, body: bytes | None = None) -> SignedRequest:
    """What the server sees: the URL as DaraCore.compose_url writes it, parsed back."""
    url = urlsplit(DaraCore.compose_url(req))
    sent = body if body is not None else (req.body.encode() if req.body else b"")
    return SignedRequest(
        req.method,
        url.path,
        parse_qsl(url.query, keep_blank_values=True),
        headers_of(req.headers.items()),
        sent,
    )


LIST_QUERY = {
    "PageNumber": "1",
    "PageSize": "10",
    "DisplayName": "tf mnist/测试~+&",
    "Status": "Running",
    "Empty": "",
}


@pytest.mark.parametrize("v2", [False, True], ids=["acs3", "roa-v2"])
@pytest.mark.parametrize(
    "method,path,query,body",
    [
        ("GET", "/api/v1/jobs/dlc123", None, None),
        ("GET", "/api/v1/jobs", LIST_QUERY, None),
        (
            "POST",
            "/api/v1/jobs",
            None,
            {"DisplayName": "x", "JobType": "TFJob", "Envs": {"A": "é"}},
        ),
        ("POST", "/api/v1/jobs/dlc123/stop", None, None),
        ("DELETE", "/api/v1/datasources/d-1", None, None),
    ],
)
def test_sdk_signatures_verify(
    v2: bool, method: str, path: str, query: dict | None, body: dict | None
) -> None:
    req = sdk_request(method, path, query, body, v2=v2)
    request = received(req)
    assert access_key_id(request.header("authorization")) == AK
    if v2 and body is not None:
        # The SDK's ROA v2 sends no Content-MD5, so its signature does not bind the body:
        # accepted, as Alibaba accepts it (older pai-dlc clients sign only so); with
        # Content-MD5 the body is bound.
        verify(request, SECRET, now=WHEN + timedelta(minutes=3))
        bound_request = sdk_request(method, path, query, body, v2=True, content_md5=True)
        verify(received(bound_request), SECRET, now=WHEN + timedelta(minutes=3))
        swapped = received(bound_request, body=b'{"DisplayName": "swapped"}')
        with pytest.raises(SignatureError) as exc:
            verify(swapped, SECRET, now=WHEN)
        assert exc.value.code == "ContentMD5Mismatch"
        return
    verify(request, SECRET, now=WHEN + timedelta(minutes=3))


@pytest.mark.parametrize("v2", [False, True], ids=["acs3", "roa-v2"])
def test_wrong_secret_is_refused(v2: bool) -> None:
    request = received(sdk_request("GET", "/api/v1/jobs", LIST_QUERY, v2=v2))
    with pytest.raises(SignatureError) as exc:
        verify(request, SECRET + "x", now=WHEN)
    assert exc.value.code == "SignatureDoesNotMatch"


@pytest.mark.parametrize("v2", [False, True], ids=["acs3", "roa-v2"])
def test_changed_query_is_refused(v2: bool) -> None:
    request = received(sdk_request("GET", "/api/v1/jobs", LIST_QUERY, v2=v2))
    tampered = SignedRequest(
        request.method,
        request.path,
        [(k, "99" if k == "PageSize" else v) for k, v in request.query],
        request.headers,
        request.body,
    )
    with pytest.raises(SignatureError):
        verify(tampered, SECRET, now=WHEN)


def test_changed_path_is_refused() -> None:
    request = received(sdk_request("GET", "/api/v1/jobs/dlc123", None))
    other = SignedRequest("GET", "/api/v1/jobs/dlc124", request.query, request.headers)
    with pytest.raises(SignatureError):
        verify(other, SECRET, now=WHEN)


def test_changed_body_is_refused() -> None:
    req = sdk_request("POST", "/api/v1/jobs", None, {"Priority": 1})
    with pytest.raises(SignatureError) as exc:
        verify(received(req, body=json.dumps({"Priority": 9}).encode()), SECRET, now=WHEN)
    assert exc.value.code == "ContentSHA256Mismatch"


def test_changed_signed_header_is_refused() -> None:
    request = received(sdk_request("GET", "/api/v1/jobs/dlc123", None))
    headers = {**request.headers, "host": ["evil.example:80"]}
    with pytest.raises(SignatureError):
        verify(SignedRequest("GET", request.path, request.query, headers), SECRET, now=WHEN)


@pytest.mark.parametrize("left_out", ["x-acs-date", "x-acs-signature-nonce", "x-acs-action"])
def test_an_acs3_signature_must_cover_the_date_nonce_and_action(left_out: str) -> None:
    # Signed over the rest only (correctly), the request's date and nonce could be
    # changed to send it again, its action to another: refused, as the SDK signs them.
    request = received(sdk_request("GET", "/api/v1/jobs/dlc123", None))
    signed = ["host", "x-acs-content-sha256"] + [
        h for h in ("x-acs-date", "x-acs-signature-nonce", "x-acs-action") if h != left_out
    ]
    body_hash = hashlib.sha256(b"").hexdigest()
    signature = acs3_signature(request, signed, body_hash, SECRET)
    headers = {
        **request.headers,
        "authorization": [
            f"ACS3-HMAC-SHA256 Credential={AK},SignedHeaders={';'.join(signed)},"
            f"Signature={signature}"
        ],
    }
    forged = SignedRequest("GET", request.path, request.query, headers)
    with pytest.raises(SignatureError) as exc:
        verify(forged, SECRET, now=WHEN)
    assert exc.value.code == "IncompleteSignature" and left_out in str(exc.value)


@pytest.mark.parametrize("v2", [False, True], ids=["acs3", "roa-v2"])
def test_old_request_is_refused(v2: bool) -> None:
    request = received(sdk_request("GET", "/api/v1/jobs/dlc123", None, v2=v2))
    with pytest.raises(SignatureError) as exc:
        verify(request, SECRET, now=WHEN + timedelta(minutes=16))
    assert exc.value.code == "InvalidTimeStamp.Expired"
    verify(request, SECRET, now=WHEN + timedelta(minutes=14))
    # Dated in the future: only a minute of clock drift, as Alibaba Cloud wants the
    # date to be within the 15 minutes *before* the request.
    verify(request, SECRET, now=WHEN - timedelta(seconds=50))
    with pytest.raises(SignatureError) as exc:
        verify(request, SECRET, now=WHEN - timedelta(minutes=2))
    assert exc.value.code.startswith("InvalidTimeStamp")


async def test_a_nonce_is_taken_once_and_forgotten_after_the_window() -> None:
    request = received(sdk_request("GET", "/api/v1/jobs/dlc123", None))
    key = nonce_key(request, AK)
    assert key != nonce_key(request, "LTAIanotherkey") and len(key) == 64
    now = [1000.0]
    nonces = MemoryNonces(ttl_s=960, clock=lambda: now[0])
    assert await nonces.first_use(key) and not await nonces.first_use(key)
    now[0] += 959
    assert not await nonces.first_use(key)  # still within the window
    now[0] += 2
    assert await nonces.first_use(key)  # too old to be accepted anyway by then
    without = SignedRequest("GET", "/x", headers={"authorization": ["acs a:b"]})
    with pytest.raises(SignatureError) as exc:
        nonce_key(without, AK)
    assert exc.value.code == "MissingSignatureNonce"


def test_pinned_vector() -> None:
    """A fixed vector the SDK produced, so a change on either side shows."""
    req = sdk_request("GET", "/api/v1/jobs", {"PageNumber": "2", "PageSize": "5"})
    header = req.headers["Authorization"]
    assert header.startswith(
        f"ACS3-HMAC-SHA256 Credential={AK},SignedHeaders=accept;host;"
        "user-agent;x-acs-action;x-acs-content-sha256;x-acs-date;"
        "x-acs-signature-nonce;x-acs-version,Signature="
    )
    assert header.endswith(PINNED_ACS3)
    verify(received(req), SECRET)


PINNED_ACS3 = "2e8e16d2a66848f412951296490dc5a3d6558a3c3c28c6530302bff2cd97ea5f"


def test_unsigned_and_foreign_schemes() -> None:
    assert access_key_id(None) is None
    assert access_key_id("Bearer abc") is None
    assert access_key_id("acs AK1:c2ln") == "AK1"
    with pytest.raises(SignatureError) as exc:
        verify(SignedRequest("GET", "/api/v1/jobs", headers={"authorization": ["Basic x"]}), SECRET)
    assert exc.value.code == "IncompleteSignature"


def test_access_keys_from_environment() -> None:
    keys = parse_access_keys(" AK1:s1:alice , AK2:s2:bob,")
    assert keys["AK1"].secret == "s1" and keys["AK1"].user == "alice"
    assert keys["AK2"].user == "bob"
    assert parse_access_keys(None) == {}
    with pytest.raises(ValueError, match="entry 1"):
        parse_access_keys("AK1:s1")
    with pytest.raises(ValueError, match="user name"):
        parse_access_keys("AK1:s1:bad user")
