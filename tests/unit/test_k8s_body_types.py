"""A Kubernetes-style create or replace reads its body as its Content-Type says: JSON
only when it says JSON (as the API server does), YAML when it says YAML, either when
it says neither (curl's form type). Read again as YAML, a JSON body's NaN passed as the
string "NaN" (found by an input audit)."""

from __future__ import annotations

import pytest

from trainyard_common.parsing import BodyError
from trainyard_intake.dialect_api.k8s_resources import _decode

JOB = b'{"metadata": {"name": "a", "annotations": {"x": %s}}}'


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_that_says_so_is_read_as_json_only(value: bytes, content_type: str) -> None:
    with pytest.raises(BodyError) as refused:
        _decode(JOB % value, content_type)
    assert refused.value.status == 400
    assert "YAML" not in str(refused.value)


def test_a_cut_off_json_body_is_named_json() -> None:
    with pytest.raises(BodyError, match="JSON"):
        _decode(b'{"metadata": {"name": "a"', "application/json")


def test_yaml_or_an_unnamed_type_is_still_read() -> None:
    assert _decode(b"metadata: {name: a}", "application/yaml") == {"metadata": {"name": "a"}}
    assert _decode(b"metadata: {name: a}", "application/x-www-form-urlencoded") == {
        "metadata": {"name": "a"}
    }
    assert _decode(b'{"metadata": {"name": "a"}}', "application/json") == {
        "metadata": {"name": "a"}
    }
