"""The Tencent Cloud API side of the TI dialect: TC3-HMAC-SHA256 verification as the
SDK signs (its own signer computes the expected value), and the PascalCase job body read
as the tictl job it stands for, its problems named by its own fields."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest
from tencentcloud.common.sign import Sign

from trainyard_common.dialects import detect, translate
from trainyard_common.dialects.ti import cloud_path, render_cloud, translate_ti
from trainyard_common.tencent_auth import Signed, TencentError, verify

NOW = datetime(2026, 11, 26, 8, 30, tzinfo=UTC)
BODY = json.dumps({"Name": "mnist", "Cluster": "default"}).encode()


def signed(secret: str = "s3cret", at: datetime = NOW, body: bytes = BODY) -> Signed:
    """A request signed exactly as tencentcloud-sdk-python's abstract client does."""
    timestamp = str(int(at.timestamp()))
    date = at.strftime("%Y-%m-%d")
    canonical = "\n".join([
        "POST", "/", "", "content-type:application/json\nhost:yard.example:8080\n",
        "content-type;host", hashlib.sha256(body).hexdigest(),
    ])  # fmt: skip
    to_sign = "\n".join([
        "TC3-HMAC-SHA256", timestamp, f"{date}/tia/tc3_request",
        hashlib.sha256(canonical.encode()).hexdigest(),
    ])  # fmt: skip
    signature = Sign.sign_tc3(secret, date, "tia", to_sign)
    headers = {
        "content-type": "application/json",
        "host": "yard.example:8080",
        "x-tc-timestamp": timestamp,
        "authorization": f"TC3-HMAC-SHA256 Credential=AKID/{date}/tia/tc3_request, "
        f"SignedHeaders=content-type;host, Signature={signature}",
    }
    return Signed("POST", "", headers, body)


def test_a_request_signed_as_the_sdk_signs_it_verifies() -> None:
    assert len(verify(signed(), "s3cret", NOW + timedelta(seconds=30))) == 64


def _signed_as(sent: dict[str, str], canonical_headers: str) -> Signed:
    """A request with headers ``sent`` whose signature covers ``canonical_headers``
    (the canonical lines, in order: what the signer wrote for each signed header)."""
    timestamp, date = str(int(NOW.timestamp())), NOW.strftime("%Y-%m-%d")
    names = ";".join(line.partition(":")[0] for line in canonical_headers.splitlines())
    canonical = "\n".join(
        ["POST", "/", "", canonical_headers, names, hashlib.sha256(BODY).hexdigest()]
    )
    to_sign = "\n".join([
        "TC3-HMAC-SHA256", timestamp, f"{date}/tia/tc3_request",
        hashlib.sha256(canonical.encode()).hexdigest(),
    ])  # fmt: skip
    signature = Sign.sign_tc3("s3cret", date, "tia", to_sign)
    headers = {
        **sent,
        "x-tc-timestamp": timestamp,
        "authorization": f"TC3-HMAC-SHA256 Credential=AKID/{date}/tia/tc3_request, "
        f"SignedHeaders={names}, Signature={signature}",
    }
    return Signed("POST", "", headers, BODY)


def test_signed_header_values_are_lower_cased_as_tencent_documents() -> None:
    """Tencent's signing guide lower-cases every signed header's value: its own example
    signs ``x-tc-action:describeinstances`` for the header ``DescribeInstances``."""
    request = _signed_as(
        {
            "content-type": "application/json; charset=UTF-8",
            "host": "Yard.Example:8080",
            "x-tc-action": "DescribeInstances",
        },
        "content-type:application/json; charset=utf-8\nhost:yard.example:8080\n"
        "x-tc-action:describeinstances\n",
    )
    assert len(verify(request, "s3cret", NOW)) == 64


def test_an_upper_case_endpoint_signed_as_the_sdk_signs_it_verifies() -> None:
    """The SDKs sign host and content-type as sent (only x-tc-action lower-cased): a
    client whose endpoint has an upper-case letter was refused."""
    request = _signed_as(
        {"content-type": "application/json", "host": "Yard.Example:8080"},
        "content-type:application/json\nhost:Yard.Example:8080\n",
    )
    assert len(verify(request, "s3cret", NOW)) == 64
    # Still the host it was signed for: another one is refused in either form.
    other = Signed("POST", "", {**request.headers, "host": "Yard.Example:8081"}, BODY)
    with pytest.raises(TencentError):
        verify(other, "s3cret", NOW)


@pytest.mark.parametrize(
    ("request_", "now", "code"),
    [
        (signed(secret="other"), NOW, "AuthFailure.SignatureFailure"),
        (signed(), NOW + timedelta(minutes=6), "AuthFailure.SignatureExpire"),
        (Signed("POST", "", {**signed().headers, "host": "elsewhere"}, BODY), NOW,
         "AuthFailure.SignatureFailure"),
        (Signed("POST", "", signed().headers, BODY + b" "), NOW, "AuthFailure.SignatureFailure"),
        (Signed("POST", "", {**signed().headers, "authorization": "Bearer x"}, BODY), NOW,
         "AuthFailure.SignatureFailure"),
        # Past what a float holds (a 500 before the signature was checked), signed or not.
        (Signed("POST", "", {**signed().headers, "x-tc-timestamp": "1" + "0" * 400}, BODY),
         NOW, "MissingParameter"),
        (Signed("POST", "", {**signed().headers, "x-tc-timestamp": "-" + "9" * 400}, BODY),
         NOW, "MissingParameter"),
        (Signed("POST", "", {**signed().headers, "x-tc-timestamp": "+1"}, BODY), NOW,
         "MissingParameter"),
    ],
)  # fmt: skip
def test_what_does_not_verify_is_named(request_: Signed, now: datetime, code: str) -> None:
    with pytest.raises(TencentError) as refused:
        verify(request_, "s3cret", now)
    assert refused.value.code == code


def test_a_cloud_api_body_is_the_tictl_job_it_stands_for() -> None:
    body = {
        "Name": "mnist",
        "Cluster": "default",
        "RuntimeVersion": "tf-1.7.0-py3",
        "Command": ["python3", "train.py"],
        "ScaleTier": "BASIC_GPU",
        "WorkerType": "4U8G0P",
        "Debug": True,
        "RuntimeConf": ["x=1"],
    }
    assert detect(body) == "ti"
    done = translate(body, user="carol")
    assert done.errors == [] and done.key == "default/mnist"
    [worker] = done.spec.roles
    assert (worker.name, worker.replicas, worker.resources.gpu) == ("worker", 1, 1)
    assert done.spec.keep_failed_for_debug is True
    assert {w.path for w in done.warnings} >= {"$.WorkerType", "$.RuntimeConf"}
    bad = translate({**body, "ScaleTier": "STANDARD_1", "RuntimeVersion": "nope"}, user="c")
    assert {e.path for e in bad.errors} == {"$.ScaleTier", "$.RuntimeVersion"}
    # RuntimeConf is the SDK's list of str: another shape is refused at the field, and a
    # refused body on record (kept as sent) still renders with the SDK's types.
    for conf, path in ((5, "$.RuntimeConf"), ("a=b", "$.RuntimeConf"), ([1], "$.RuntimeConf[0]")):
        odd = {**body, "RuntimeConf": conf, "ScaleTier": 7, "Debug": "yes"}
        assert path in {e.path for e in translate(odd, user="c").errors}
        view = {"id": "j2", "name": "mnist", "state": "REJECTED", "user": "c", "original": odd}
        shown = render_cloud(view)
        assert (shown["RuntimeConf"], shown["ScaleTier"], shown["Debug"]) == ([], "CUSTOM", False)
    assert cloud_path("$.parameterServerCount") == "$.ParameterServerCount"
    assert cloud_path("$.command[0]") == "$.Command[0]"
    shown = render_cloud({"id": "j1", "name": "mnist", "state": "SUCCEEDED", "user": "carol",
                          "submitted_at": "2026-11-26T08:00:00.5+00:00", "original": body})  # fmt: skip
    assert shown["CreateTime"] == "2026-11-26 08:00:00.5 +0000 UTC"
    assert (shown["Name"], shown["State"], shown["ScaleTier"], shown["Uin"]) == (
        "mnist",
        "Succeeded",
        "BASIC_GPU",
        "carol",
    )


def test_an_empty_cloud_api_body_is_named_by_the_cloud_apis_fields() -> None:
    """CreateJob {} holds no key to tell its shape by: the Cloud API's handler says it
    is one, so what is missing is named $.Name, not tictl's $.name."""
    errors = translate_ti({}, cloud=True).errors
    assert [(e.path, e.code) for e in errors] == [
        ("$.Name", "required"), ("$.Cluster", "required"), ("$.Command", "required"),
    ]  # fmt: skip
    assert [e.path for e in translate_ti({}).errors][:1] == ["$.name"]
