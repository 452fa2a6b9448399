"""The Kubernetes-style jobs' metadata as the API server takes it: labels and
annotations a map of text to text (qualified-name keys, label values of at most 63
characters, annotations at most 256 KiB), names and namespaces at most 63 characters.
Kept as given, a list or a number there broke every typed client's read of the object
and of every list it was in (found by an input audit); on create and on a PATCH."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_common.dialects import kubeflow, t9k

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PYTORCH = yaml.safe_load((EXAMPLES / "kubeflow" / "pytorchjob-simple.yaml").read_text())
GENERIC = yaml.safe_load((EXAMPLES / "t9k" / "genericjob-1.yaml").read_text())

BAD = [
    ({"labels": {"a": 5}}, "$.metadata.labels.a", "type"),
    ({"labels": {"b": {"c": 1}}}, "$.metadata.labels.b", "type"),
    ({"labels": ["x"]}, "$.metadata.labels", "type"),
    ({"labels": "x"}, "$.metadata.labels", "type"),
    ({"labels": {"-a": "x"}}, "$.metadata.labels['-a']", "pattern"),
    ({"labels": {"a": "v" * 64}}, "$.metadata.labels.a", "pattern"),
    ({"labels": {"a": "has space"}}, "$.metadata.labels.a", "pattern"),
    ({"annotations": {"k": [1, 2]}}, "$.metadata.annotations.k", "type"),
    ({"annotations": {"a b": "x"}}, "$.metadata.annotations['a b']", "pattern"),
    ({"labels": {"a": "abc\n"}}, "$.metadata.labels.a", "pattern"),
    ({"labels": {"a\n": "v"}}, "$.metadata.labels['a\n']", "pattern"),
    ({"annotations": {"big": "x" * (256 * 1024)}}, "$.metadata.annotations", "range"),
    ({"annotations": {"big": "\u00e9" * (130 * 1024)}}, "$.metadata.annotations", "range"),
    ({"name": "n" * 64}, "$.metadata.name", "pattern"),
    ({"namespace": "s" * 64}, "$.metadata.namespace", "pattern"),
]
GOOD = {
    "labels": {"app.kubernetes.io/name": "mnist", "team": "", "v": "1.0_a-b"},
    "annotations": {"example.com/note": "any text: even spaces, and more than 63 " * 4},
    "name": "n" * 63,
}


def with_meta(payload: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    payload = copy.deepcopy(payload)
    payload["metadata"].update(meta)
    return payload


@pytest.mark.parametrize(("meta", "path", "code"), BAD)
@pytest.mark.parametrize("dialect", ["kubeflow", "t9k"])
def test_metadata_the_api_server_refuses_is_refused_naming_it(
    dialect: str, meta: dict[str, Any], path: str, code: str
) -> None:
    translate = kubeflow.translate_kubeflow if dialect == "kubeflow" else t9k.translate_t9k
    payload = with_meta(PYTORCH if dialect == "kubeflow" else GENERIC, meta)
    errors = [(e.path, e.code) for e in translate(payload).errors]
    assert (path, code) in errors


@pytest.mark.parametrize("dialect", ["kubeflow", "t9k"])
def test_metadata_the_api_server_takes_is_taken(dialect: str) -> None:
    translate = kubeflow.translate_kubeflow if dialect == "kubeflow" else t9k.translate_t9k
    payload = with_meta(PYTORCH if dialect == "kubeflow" else GENERIC, GOOD)
    assert translate(payload).errors == []


def test_a_patch_cannot_make_the_labels_a_list() -> None:
    current = copy.deepcopy(PYTORCH)
    control = kubeflow.control_from_patch(current, {"metadata": {"labels": ["x", {"y": 1}]}})
    assert [e.path for e in control.errors] == ["$.metadata.labels"]
    fine = kubeflow.control_from_patch(current, {"metadata": {"labels": {"team": "vision"}}})
    assert fine.errors == []
