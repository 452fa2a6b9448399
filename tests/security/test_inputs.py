"""Bad input never stops the platform and never answers 500: against the real platform,
through the gateway, each attack of docs/security.md ("Input bounds", "PAI-DLC
signatures", "Gateway") is refused with a 4xx that says why, in time, and the next
user's good request still works."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from alibabacloud_tea_openapi.utils import Utils
from darabonba.request import DaraRequest

from trainyard_stack.platform import Platform

from ..e2e.conftest import Api, start_platform

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
)  # fmt: skip
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(tmp_path_factory.mktemp("inputs"))
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def admin(platform: Platform) -> Api:
    return Api(platform.url, platform.token)


def small_job(name: str) -> dict:
    return {"name": name, "roles": [{"name": "w", "command": "true"}]}


YAML_WRITES = [
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs:validate"),
    ("POST", "/api/v2/jobs"),
    ("POST", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs"),
    ("POST", "/apis/batch.tensorstack.dev/v1beta1/namespaces/default/genericjobs"),
]
JSON_WRITES = [
    *YAML_WRITES,
    ("POST", "/v1/tokens"),
    ("POST", "/v1/access-keys"),
    ("POST", "/api/v1/jobs"),
    ("POST", "/ti/v1/jobs"),
    ("POST", "/api/v1/user/admin/jobs"),
    ("POST", "/v1/placement/nodes"),
]


@pytest.mark.parametrize(("method", "path"), YAML_WRITES)
def test_a_yaml_bomb_is_a_400_in_milliseconds(admin: Api, method: str, path: str) -> None:
    started = time.monotonic()
    answer = admin.http.request(
        method, path, content=BOMB, headers={"Content-Type": "application/yaml"}
    )
    assert answer.status_code == 400, answer.text
    assert "alias" in answer.text
    assert time.monotonic() - started < 2.0
    # And the door is open to the next request.
    assert admin.http.post("/v1/jobs:validate", json=small_job("after-bomb")).status_code == 200


BAD_JSON = {
    "deep": DEEP,
    "nan": '{"name": "x", "roles": [{"name": "w", "command": "true", "resources": {"cpu": NaN}}]}',
    "overflow": '{"name": "x", "priority": 1e999999, "roles": []}',
    "surrogate": '{"name": "\\ud800", "roles": [{"name": "w", "command": "true"}]}',
    "not-utf8": b'{"name": "\xff\xfe"}',
}


@pytest.mark.parametrize("kind", sorted(BAD_JSON))
@pytest.mark.parametrize(("method", "path"), JSON_WRITES)
def test_bad_json_is_a_4xx_naming_the_problem_everywhere(
    admin: Api, kind: str, method: str, path: str
) -> None:
    body = BAD_JSON[kind]
    answer = admin.http.request(
        method, path, content=body, headers={"Content-Type": "application/json"}
    )
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:300])


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs?offset=1000000000000000000000000000000",
        "/v1/jobs/abc/logs?offset=1000000000000000000000000000000",
        "/api/v2/jobs?offset=1000000000000000000000000000000",
        "/api/v1/jobs?PageNumber=100000000000000000000000",
        "/v1/jobs/%00",
        "/v1/jobs/abc%00def/events",
        "/api/v2/jobs/admin~x%00",
        "/v1/jobs?state=%00",
        "/v1/jobs/%ff%fe",
        "/apis/batch.tensorstack.dev/v1beta1/namespaces/default/genericjobs?watch=1&resourceVersion="
        + "9" * 5000,
    ],
)
def test_bad_paths_and_parameters_are_4xx(admin: Api, path: str) -> None:
    answer = admin.http.get(path)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:300])


@pytest.mark.parametrize(("method", "path"), YAML_WRITES)
def test_a_yaml_value_json_has_not_is_a_400_saying_where(
    admin: Api, method: str, path: str
) -> None:
    for body, said in [
        ("name: !!binary aGVsbG8=\n", "$.name: a !!binary value"),
        ("metadata: {name: !!set {a}}\n", "$.metadata.name: a !!set"),
        # Integers int() will not make or write out (more than 4300 digits).
        ("spec: {replicas: " + "9" * 5000 + "}\n", "out of range"),
        ("spec: {replicas: 0b" + "1" * 14_001 + "}\n", "$.spec.replicas: a number out of range"),
        ("spec: {replicas: 0b" + "1" * 20000 + "}\n", "line 1, column 18: an integer of 20002"),
    ]:
        answer = admin.http.request(
            method, path, content=body, headers={"Content-Type": "application/yaml"}
        )
        assert answer.status_code == 400 and said in answer.text, (answer.status_code, answer.text)
    assert admin.http.post("/v1/jobs:validate", json=small_job("after-binary")).status_code == 200


def test_yaml_dates_and_number_keys_read_as_the_json_they_stand_for(admin: Api) -> None:
    v1 = (
        "jobName: dated\nimage: x\njobEnvs: {WHEN: 2020-01-01, 7: seven}\n"
        "taskRoles: [{name: w, taskNumber: 1, cpuNumber: 1, memoryMB: 128, gpuNumber: 0,"
        " command: 'true'}]\n"
    )
    answer = admin.http.post(
        "/v1/jobs:validate", content=v1, headers={"Content-Type": "application/yaml"}
    )
    assert answer.status_code == 200, answer.text
    env = {e["name"]: e["value"] for e in answer.json()["spec"]["env"]}
    assert (env["WHEN"], env["7"]) == ("2020-01-01", "seven")
    # A date where a name belongs is a field error, not the server's.
    answer = admin.http.post(
        "/api/v2/jobs",
        content="protocolVersion: 2\nname: {2020-01-01: 1}\ntype: job\n",
        headers={"Content-Type": "application/yaml"},
    )
    assert answer.status_code == 400 and "name" in answer.text, answer.text


T9K_JOBS = "/apis/batch.tensorstack.dev/v1beta1/namespaces/default/genericjobs"


@pytest.mark.parametrize("image", ["a\u001bb\u0000c", "名" * 70_000])
def test_a_warning_quoting_the_users_text_is_a_valid_bounded_header(admin: Api, image: str) -> None:
    name = f"warned-{uuid.uuid4().hex[:6]}"
    job = {
        "apiVersion": "batch.tensorstack.dev/v1beta1",
        "kind": "GenericJob",
        "metadata": {"name": name},
        "spec": {
            "replicaSpecs": [
                {
                    "type": "worker",
                    "replicas": 1,
                    "template": {
                        "spec": {"containers": [{"name": "w", "image": image, "command": ["true"]}]}
                    },
                }
            ]
        },
    }
    answer = admin.http.post(T9K_JOBS, json=job)
    assert answer.status_code == 201, answer.text
    warnings = answer.headers.get_list("warning")
    assert any(w.startswith('299 - "$.spec: image ') for w in warnings), warnings
    assert sum(len(w) for w in warnings) < 8192
    assert all(w.isascii() and w.isprintable() for w in warnings), warnings
    # The connection it came on still serves, as does the next request.
    assert admin.http.get(f"{T9K_JOBS}/{name}").status_code == 200


@pytest.mark.parametrize("user", ["%E5%90%8D", "a%20b", "u" * 9000])
def test_openpai_v1_refuses_a_path_user_that_is_no_user_name(admin: Api, user: str) -> None:
    job = {"jobName": "pathuser", "image": "x", "taskRoles": [
        {"name": "w", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
         "command": "true"}]}  # fmt: skip
    answer = admin.http.post(f"/api/v1/user/{user}/jobs", json=job)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "InvalidParametersError" and "user:" in answer.text


def owners_count(platform: Platform) -> int:
    async def count() -> int:
        client = platform.store_client()
        try:
            owners = client[f"{platform.config.db_prefix}_intake"]["owners"]
            return await owners.count_documents({})
        finally:
            await client.close()

    return asyncio.run(count())


def test_a_job_too_large_for_the_bus_is_a_413_before_anything_is_written(
    platform: Platform, admin: Api
) -> None:
    before = owners_count(platform)
    big = small_job("too-big")
    big["roles"][0]["command"] = "echo " + "x" * 1_100_000
    answer = admin.http.post("/v1/jobs", json=big)
    assert answer.status_code == 413 and "bus" in answer.text, answer.text[:300]
    v2 = yaml.safe_load((EXAMPLES / "openpai" / "v2" / "hello-world-job.yaml").read_text())
    v2["taskRoles"]["taskrole"]["commands"] = ["echo " + "y" * 1_100_000]
    answer = admin.http.post(
        "/api/v2/jobs", content=yaml.safe_dump(v2), headers={"Content-Type": "text/yaml"}
    )
    assert answer.status_code == 413, answer.text[:300]
    assert owners_count(platform) == before


def test_one_users_bad_requests_never_fail_anothers_good_ones(admin: Api) -> None:
    token = admin.http.post("/v1/tokens", json={"user": "innocent"}).json()["token"]
    innocent = admin.as_token(token)

    def bad(i: int) -> int:
        body = DEEP if i % 2 else BOMB
        kind = "application/json" if i % 2 else "application/yaml"
        return admin.http.post("/v1/jobs", content=body, headers={"Content-Type": kind}).status_code

    def good(i: int) -> int:
        return innocent.http.post("/v1/jobs:validate", json=small_job(f"fine-{i}")).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        bads = list(pool.map(bad, range(40)))
        goods = list(pool.map(good, range(40)))
    assert set(bads) == {400} and set(goods) == {200}


# ------------------------------------------------------------------- PAI-DLC signatures


def signed(
    platform: Platform, key: dict, method: str, path: str, body: dict | None, *, nonce: str,
    roa: bool = False, content_md5: bool = False,
) -> tuple[dict[str, str], bytes]:  # fmt: skip
    """A request signed as the official SDK signs it, with the nonce given."""
    req = DaraRequest()
    req.protocol, req.method, req.pathname, req.query = "http", method, path, {}
    host = platform.url.split("://", 1)[1]
    req.headers = {
        "host": host,
        "x-acs-version": "2020-12-03",
        "x-acs-action": "CreateJob",
        "accept": "application/json",
        "x-acs-signature-nonce": nonce,
    }
    payload = json.dumps(body).encode() if body is not None else b""
    if body is not None:
        req.body = payload.decode()
        req.headers["content-type"] = "application/json; charset=utf-8"
    now = datetime.now(UTC)
    if content_md5:
        req.headers["content-md5"] = base64.b64encode(hashlib.md5(payload).digest()).decode()
    if roa:
        req.headers.update(
            {
                "date": now.strftime("%a, %d %b %Y %H:%M:%S GMT"),
                "x-acs-signature-method": "HMAC-SHA1",
                "x-acs-signature-version": "1.0",
            }
        )
        sig = Utils.get_roasignature(Utils.get_string_to_sign(req), key["AccessKeySecret"])
        req.headers["authorization"] = f"acs {key['AccessKeyId']}:{sig}"
    else:
        req.headers["x-acs-date"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        digest = hashlib.sha256(payload).hexdigest()
        req.headers["x-acs-content-sha256"] = digest
        req.headers["Authorization"] = Utils.get_authorization(
            req, "ACS3-HMAC-SHA256", digest, key["AccessKeyId"], key["AccessKeySecret"]
        )
    return dict(req.headers), payload


def dlc_job(name: str) -> dict:
    return {
        "DisplayName": name,
        "JobType": "TFJob",
        "JobSpecs": [{"Type": "Worker", "Image": "tf:1", "PodCount": 1, "EcsSpec": "ecs.c6.large"}],
        "UserCommand": "true",
    }


def test_a_dlc_signature_is_accepted_once(platform: Platform, admin: Api) -> None:
    key = admin.http.post("/v1/access-keys", json={"user": "dlc-replay"}).json()
    headers, body = signed(
        platform, key, "POST", "/api/v1/jobs", dlc_job("once"), nonce=uuid.uuid4().hex
    )
    with httpx.Client(base_url=platform.url, timeout=30) as http:
        first = http.post("/api/v1/jobs", content=body, headers=headers)
        assert first.status_code == 200, first.text
        for _ in range(2):
            again = http.post("/api/v1/jobs", content=body, headers=headers)
            assert again.status_code == 400 and again.json()["Code"] == "SignatureNonceUsed"


def test_a_roa_request_bound_to_its_body_cannot_carry_another_and_none_is_replayed(
    platform: Platform, admin: Api
) -> None:
    """ROA v2 signs Content-MD5, not the body: with Content-MD5 another body is refused.
    The SDKs send none (accepted, as at Alibaba): such a request cannot be sent twice."""
    key = admin.http.post("/v1/access-keys", json={"user": "dlc-roa"}).json()
    headers, _ = signed(
        platform, key, "POST", "/api/v1/jobs", dlc_job("roa"), nonce=uuid.uuid4().hex,
        roa=True, content_md5=True,
    )  # fmt: skip
    unbound, body = signed(
        platform, key, "POST", "/api/v1/jobs", dlc_job("roa-sdk"), nonce=uuid.uuid4().hex,
        roa=True,
    )  # fmt: skip
    with httpx.Client(base_url=platform.url, timeout=30) as http:
        swapped = json.dumps(dlc_job("swapped")).encode()
        answer = http.post("/api/v1/jobs", content=swapped, headers=headers)
        assert answer.status_code == 403, answer.text
        assert answer.json()["Code"] == "ContentMD5Mismatch", answer.text
        first = http.post("/api/v1/jobs", content=body, headers=unbound)
        assert first.status_code == 200 and first.json()["JobId"], first.text
        again = http.post("/api/v1/jobs", content=swapped, headers=unbound)
        assert again.status_code == 400, again.text
        assert again.json()["Code"] == "SignatureNonceUsed", again.text
