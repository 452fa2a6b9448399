"""The API server's errors as the launcher reads them: a failed exec tells the user the
status, never the request the launcher made (its headers carry the launcher's own
token); a pod too large for etcd is the job's own, not the platform's, failure."""

from __future__ import annotations

import json

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from trainyard_launcher.adapters.kubernetes import _not_now, _too_large, exec_failure

TOKEN = "Bearer 7neX-the-launchers-own"


def test_a_failed_handshake_shows_its_status_not_its_headers() -> None:
    url = URL("wss://127.0.0.1:6443/api/v1/namespaces/t/pods/p/exec")
    request = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict(authorization=TOKEN)))
    failed = aiohttp.WSServerHandshakeError(request, (), status=400, message="Invalid response")
    assert TOKEN in repr(failed)  # what the answer once quoted
    said = exec_failure(failed)
    assert said == "the API server answered 400 Invalid response" and "Bearer" not in said


def test_other_failures_say_what_they_were_and_no_more() -> None:
    assert exec_failure(ApiException(status=403, reason="Forbidden")) == (
        "the API server answered 403 Forbidden"
    )
    assert exec_failure(OSError(f"connect failed, sent {TOKEN}")) == (
        "the API server could not be reached (OSError)"
    )


def test_a_pod_too_large_for_etcd_is_told_apart_from_other_server_errors() -> None:
    def failed(status: int, message: str) -> ApiException:
        exc = ApiException(status=status, reason="Internal Server Error")
        exc.body = json.dumps({"kind": "Status", "message": message})
        return exc

    assert _too_large(failed(500, "etcdserver: request is too large"))
    assert not _too_large(failed(500, "etcdserver: leader changed"))
    assert not _too_large(failed(503, "etcdserver: request is too large"))


def test_an_answer_that_says_not_now_is_told_from_one_that_says_never() -> None:
    # Throttled or the server's trouble failed the task at once (a job without retries
    # failed for it), and a 504's create may have been made: the message comes again.
    def failed(status: int, message: str) -> ApiException:
        exc = ApiException(status=status, reason="x")
        exc.body = json.dumps({"kind": "Status", "message": message})
        return exc

    for status, message in [
        (429, "too many requests"),
        (503, "etcdserver: leader changed"),
        (504, "the request did not complete within the requested timeout"),
        (403, 'pods "p" is forbidden: exceeded quota: compute, requested: cpu=2'),
        (403, "unable to create new content in namespace ml because it is being terminated"),
    ]:
        assert _not_now(failed(status, message)), (status, message)
    for status, message in [
        (403, 'pods is forbidden: User "system:serviceaccount:x" cannot create resource'),
        (422, "Pod is invalid"),
        (500, "etcdserver: request is too large"),
        (400, "bad request"),
    ]:
        assert not _not_now(failed(status, message)), (status, message)


def test_an_answer_without_a_status_is_not_taken_for_one() -> None:
    assert not _not_now(ApiException(status=None, reason="no answer"))
