"""The pure Kubernetes API machinery: selectors, JSON Patch, strategic merge, the merge
diff that turns a PUT into the dialect's control, discovery and OpenAPI as kubectl reads
them, Tables and ages."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_common.dialects import k8s_api, kubeflow, translate
from trainyard_common.dialects.k8s_api import PatchError, SelectorError
from trainyard_common.dialects.k8s_pod import merge_patch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def obj(labels: dict[str, str], name: str = "a", namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("team=a", {"team": "a"}, True),
        ("team==a", {"team": "b"}, False),
        ("team!=a", {}, True),
        ("team!=a", {"team": "a"}, False),
        ("team in (a, b),stage", {"team": "b", "stage": "x"}, True),
        ("team in (a,b),stage", {"team": "b"}, False),
        ("team notin (a)", {"team": "c"}, True),
        ("!team", {"team": "c"}, False),
        ("app.kubernetes.io/name=x", {"app.kubernetes.io/name": "x"}, True),
        ("", {"anything": "1"}, True),
    ],
)
def test_label_selectors_match_as_kubectl_means_them(
    selector: str, labels: dict[str, str], expected: bool
) -> None:
    parsed = k8s_api.parse_label_selector(selector)
    assert k8s_api.selected(obj(labels), parsed, []) is expected


@pytest.mark.parametrize(
    "selector", ["a in (b", "a=b)", "=x", "a=b c", "bad key!=1", "a,,b", "a in ()", "a notin ( , )"]
)
def test_bad_label_selectors_are_refused(selector: str) -> None:
    with pytest.raises(SelectorError):
        k8s_api.parse_label_selector(selector)


def test_field_selectors_know_name_and_namespace_only() -> None:
    fields = k8s_api.parse_field_selector("metadata.name=a,metadata.namespace!=other")
    assert k8s_api.selected(obj({}), [], fields)
    assert not k8s_api.selected(obj({}, name="b"), [], fields)
    with pytest.raises(SelectorError, match="status.phase"):
        k8s_api.parse_field_selector("status.phase=Running")


DOC = {"metadata": {"labels": {"a": "1"}}, "spec": {"list": [1, 2, 3], "x": {"y": 1}}}


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "add", "path": "/metadata/labels/b", "value": "2"}], ("metadata", "labels", {"a": "1", "b": "2"})),
        ([{"op": "remove", "path": "/spec/list/0"}], ("spec", "list", [2, 3])),
        ([{"op": "add", "path": "/spec/list/-", "value": 4}], ("spec", "list", [1, 2, 3, 4])),
        ([{"op": "replace", "path": "/spec/x/y", "value": 5}], ("spec", "x", {"y": 5})),
        ([{"op": "move", "from": "/spec/x/y", "path": "/spec/x/z"}], ("spec", "x", {"z": 1})),
        ([{"op": "copy", "from": "/spec/x", "path": "/spec/w"}], ("spec", "w", {"y": 1})),
        ([{"op": "test", "path": "/spec/x/y", "value": 1}], ("spec", "x", {"y": 1})),
        ([{"op": "add", "path": "/metadata/labels/a~1b", "value": "s"}], ("metadata", "labels", {"a": "1", "a/b": "s"})),
    ],
)  # fmt: skip
def test_json_patch_follows_rfc_6902(ops: list[dict[str, Any]], expected: tuple[Any, ...]) -> None:
    patched = k8s_api.json_patch(DOC, ops)
    first, second, value = expected
    assert patched[first][second] == value
    assert DOC["spec"]["list"] == [1, 2, 3]  # the original is untouched


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/spec/x/y", "value": 2}],
        [{"op": "replace", "path": "/spec/missing", "value": 1}],
        [{"op": "add", "path": "/no/such/parent", "value": 1}],
        [{"op": "remove", "path": "/spec/list/7"}],
        [{"op": "move", "from": "/spec", "path": "/spec/inner"}],
        [{"op": "frobnicate", "path": "/spec"}],
        [{"op": "add", "path": "spec"}],
        {"op": "add"},
    ],
)
def test_json_patch_failures_fail_the_whole_patch(ops: Any) -> None:
    with pytest.raises(PatchError):
        k8s_api.json_patch(DOC, ops)


def test_a_json_patch_cannot_make_a_resource_past_what_a_body_may_be() -> None:
    # Each copy doubled the resource: 26 operations of a 2 kB patch took gigabytes.
    doubling = [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y" * 1000}}]
    doubling += [
        {"op": "copy", "from": "/metadata/annotations", "path": f"/metadata/annotations/k{i}"}
        for i in range(40)
    ]
    with pytest.raises(PatchError, match="larger than"):
        k8s_api.json_patch(DOC, doubling)
    # Values put one below the other: past the depth a reader or the bus takes.
    deep: Any = 1
    for _ in range(30):
        deep = {"d": deep}
    stacked, path = [], "/spec"
    for _ in range(5):
        stacked.append({"op": "add", "path": f"{path}/n", "value": deep})
        path += "/n" + "/d" * 29
    with pytest.raises(PatchError, match="nested deeper than 64"):
        k8s_api.json_patch(DOC, stacked)
    moved = [{"op": "add", "path": "/spec/n", "value": deep}]
    moved += [{"op": "move", "from": "/spec/n", "path": "/spec/x/n"}]
    assert k8s_api.json_patch(DOC, moved)["spec"]["x"]["n"] == deep  # within the bound


def test_strategic_merge_is_a_merge_here_and_refuses_directives() -> None:
    assert k8s_api.strategic_merge_patch(DOC, {"spec": {"list": [9]}})["spec"]["list"] == [9]
    with pytest.raises(PatchError, match=r"\$patch"):
        k8s_api.strategic_merge_patch(DOC, {"spec": {"$patch": "replace"}})


@pytest.mark.parametrize(
    "after",
    [
        {"metadata": {"labels": {"a": "2"}}, "spec": {"list": [1], "x": {"y": 1}}},
        {"metadata": {}, "spec": {"x": {"y": 1, "z": 2}}},
        {"spec": {"list": [1, 2, 3], "x": {}}},
    ],
)
def test_merge_diff_is_the_patch_between_two_documents(after: dict[str, Any]) -> None:
    assert merge_patch(DOC, k8s_api.merge_diff(DOC, after)) == after


def pytorchjob(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "p", "namespace": "ml", "labels": {"team": "a"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "template": {
                        "spec": {"containers": [{"name": "pytorch", "image": "i", "command": ["true"]}]}
                    },
                }
            },
            **spec,
        },
    }  # fmt: skip


def test_a_put_changes_labels_and_suspend_but_not_the_job_itself() -> None:
    current = pytorchjob()
    relabelled = pytorchjob(runPolicy={"suspend": True})
    relabelled["metadata"]["labels"] = {"team": "b"}
    relabelled["metadata"]["annotations"] = {"note": "x"}
    control = kubeflow.control_from_patch(current, k8s_api.merge_diff(current, relabelled))
    assert control.errors == [] and control.pause is True
    bigger = pytorchjob()
    bigger["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "image"
    ] = "other"
    refused = kubeflow.control_from_patch(current, k8s_api.merge_diff(current, bigger))
    assert [e.code for e in refused.errors] == ["immutable"]


def test_client_fields_drop_what_the_server_writes() -> None:
    sent = {**pytorchjob(), "status": {"conditions": []}}
    sent["metadata"].update(uid="u", resourceVersion="9", generation=4, managedFields=[])
    kept = k8s_api.client_fields(sent)
    assert "status" not in kept
    assert set(kept["metadata"]) == {"name", "namespace", "labels"}


def test_discovery_and_openapi_name_every_served_kind_as_kubectl_reads_them() -> None:
    groups = {g["name"] for g in k8s_api.group_list()["groups"]}
    assert groups == {"kubeflow.org", "batch.tensorstack.dev"}
    listed = k8s_api.resource_list("kubeflow.org", "v1")
    assert listed is not None
    names = {r["name"] for r in listed["resources"]}
    assert {"pytorchjobs", "pytorchjobs/status", "tfjobs"} <= names
    assert k8s_api.resource_list("kubeflow.org", "v9") is None
    # kubectl validates on the server when a PATCH of the kind takes fieldValidation.
    document = k8s_api.openapi_v3("kubeflow.org", "v1")
    assert document is not None
    patches = [
        op["patch"]
        for op in document["paths"].values()
        if "patch" in op and op["patch"]["x-kubernetes-group-version-kind"]["kind"] == "PyTorchJob"
    ]
    assert any(p["name"] == "fieldValidation" for p in patches[0]["parameters"])
    root = k8s_api.openapi_v3_root()["paths"]
    assert root["apis/kubeflow.org/v1"]["serverRelativeURL"].startswith(
        "/openapi/v3/apis/kubeflow.org/v1?hash="
    )


@pytest.mark.parametrize(
    ("ago", "shown"),
    [
        (timedelta(seconds=5), "5s"),
        (timedelta(minutes=3, seconds=4), "3m4s"),
        (timedelta(minutes=45), "45m"),
        (timedelta(hours=5, minutes=2), "5h2m"),
        (timedelta(hours=30), "30h"),
        (timedelta(days=3, hours=1), "3d1h"),
        (timedelta(days=400), "400d"),
        (timedelta(days=1000), "2y270d"),
    ],
)
def test_ages_are_written_as_kubectl_writes_them(ago: timedelta, shown: str) -> None:
    now = datetime(2026, 11, 26, tzinfo=UTC)
    created = (now - ago).isoformat().replace("+00:00", "Z")
    table = k8s_api.table([{"metadata": {"name": "a", "creationTimestamp": created}}], {}, now)
    assert table["rows"][0]["cells"] == ["a", "", shown]
    assert k8s_api.wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not k8s_api.wants_table("application/json")


@pytest.mark.parametrize("example", ["t9k/genericjob-1.yaml", "kubeflow/pytorchjob-simple.yaml"])
def test_object_metadata_is_kubernetes_and_only_an_unknown_key_is_warned(example: str) -> None:
    """kubectl validates strictly by default: a warning of ``unknown_field`` there is a
    400, so ObjectMeta's own keys (generateName, finalizers, ownerReferences) must pass
    as an API server passes them, and a key ObjectMeta lacks is named as it names it."""
    job = yaml.safe_load((EXAMPLES / example).read_text())
    job["metadata"].update(
        generateName="mnist-",
        finalizers=["example.com/keep"],
        ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"}],
        labels={"team": "a"},
        annotations={"note": "x"},
    )
    result = translate(job, user="alice")
    assert result.errors == [] and result.warnings == [], (result.errors, result.warnings)
    job["metadata"]["owner"] = "alice"
    [warning] = translate(job, user="alice").warnings
    assert (warning.path, warning.code) == ("$.metadata.owner", "unknown_field")


def test_a_watch_timeout_is_a_whole_number_of_seconds() -> None:
    from trainyard_status.dialect_api.k8s_resources import MAX_WATCH_S, watch_timeout

    assert [watch_timeout(t) for t in ("", "0", "30", "999999")] == [
        MAX_WATCH_S, MAX_WATCH_S, 30, MAX_WATCH_S
    ]  # fmt: skip
    # A watch that closed at once (nan, -1) or took a float is refused, as Kubernetes does.
    assert [watch_timeout(t) for t in ("nan", "-1", "1e9", "1.5", "inf")] == [None] * 5


def test_a_lists_limit_is_a_whole_number_and_a_page_holds_at_most_a_thousand() -> None:
    # As the API server parses it (Go's ParseInt): a sign, and 0 or less for no limit.
    assert [k8s_api.list_limit(t) for t in ("", "0", "1", "+5", "-1", "500", "1000000")] == [
        0, 0, 1, 5, 0, 500, k8s_api.MAX_LIST_PAGE
    ]  # fmt: skip
    for asked in ("x", "-", "--1", "+-1", "1.5", "1e3", "²", "9" * 5000):
        with pytest.raises(k8s_api.ContinueError, match="limit"):
            k8s_api.list_limit(asked)


def test_a_continue_token_gives_back_where_the_page_ended_and_refuses_others() -> None:
    at = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
    token = k8s_api.continue_token(42, at, "job-1")
    assert "=" not in token and token.isascii()
    assert k8s_api.parse_continue(token) == (42, at, "job-1")
    # The same moment in another zone is the same place (the stores compare in UTC).
    east = at.astimezone(timezone(timedelta(hours=8)))
    assert k8s_api.parse_continue(k8s_api.continue_token(1, east, "j")) == (1, at, "j")

    def forged(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()

    for token in (
        "!!!", "e30", "x" * 2000, forged([1, 2]), forged({"rv": 1, "id": "j"}),
        forged({"rv": -1, "at": at.isoformat(), "id": "j"}),
        forged({"rv": True, "at": at.isoformat(), "id": "j"}),
        forged({"rv": 1, "at": "2026-11-29T12:00:00", "id": "j"}),  # no zone
        forged({"rv": 1, "at": "0001-01-01T00:00:00+23:59", "id": "j"}),  # no time in UTC
        forged({"rv": 1, "at": at.isoformat(), "id": 7}),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        base64.urlsafe_b64encode(b"[" * 700).decode(),  # a parse this deep: a 500 once
        base64.urlsafe_b64encode(b'{"a":' + b"[" * 700).decode()[:1024],
    ):  # fmt: skip
        # The API server's 400 message for a token it cannot read.
        with pytest.raises(k8s_api.ContinueError, match="^invalid continue token: continue key"):
            k8s_api.parse_continue(token)
