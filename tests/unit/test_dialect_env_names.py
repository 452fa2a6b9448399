"""A variable no process can be given (a name empty or holding '=' or a NUL, a value
holding a NUL) is an error at submission naming where it was written, in every dialect
that takes variables; accepted, the job used to fail only at its start, with an error
naming a directory."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_common.dialects import translate
from trainyard_common.dialects.translation import join

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _native(name: str, value: str) -> tuple[dict[str, Any], str, str]:
    job = {
        "name": "env-names",
        "image": "python:3.11",
        "roles": [{"name": "worker", "command": "true", "env": [{"name": "OK", "value": "1"}]}],
        "env": [],
    }
    job["roles"][0]["env"].append({"name": name, "value": value})
    return job, "native", "$.roles[0].env[1]"


def _dlc(name: str, value: str) -> tuple[dict[str, Any], str, str]:
    job = _load("dlc/createjob-tensorflow-gpu.seed.txt")
    job["Envs"] = {"OK": "1", name: value}
    return job, "dlc", join("$.Envs", name)


def _openpai(name: str, value: str) -> tuple[dict[str, Any], str, str]:
    job = json.loads((EXAMPLES / "openpai" / "helloworld_16be675e.json").read_text())
    job["jobEnvs"] = {"OK": "1", name: value}
    return job, "openpai", join("$.jobEnvs", name)


def _container_env(container: dict[str, Any], name: str, value: str) -> None:
    container["env"] = [{"name": "OK", "value": "1"}, {"name": name, "value": value}]


def _t9k(name: str, value: str) -> tuple[dict[str, Any], str, str]:
    job = _load("t9k/genericjob-1.yaml")
    _container_env(job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0], name, value)
    return job, "t9k", "$.spec.replicaSpecs[0].template.spec.containers[0].env[1]"


def _kubeflow(name: str, value: str) -> tuple[dict[str, Any], str, str]:
    job = _load("kubeflow/pytorchjob-simple.yaml")
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    _container_env(master["template"]["spec"]["containers"][0], name, value)
    return job, "kubeflow", "$.spec.pytorchReplicaSpecs.Master.template.spec.containers[0].env[1]"


BUILDERS: dict[str, Callable[[str, str], tuple[dict[str, Any], str, str]]] = {
    "native": _native,
    "dlc": _dlc,
    "openpai": _openpai,
    "t9k": _t9k,
    "kubeflow": _kubeflow,
}
BAD = {
    "holds =": ("A=B", "1"),
    "holds NUL": ("A\0B", "1"),
    "NUL value": ("GOOD_NAME", "a\0b"),
}


@pytest.mark.parametrize("dialect", BUILDERS)
def test_a_good_variable_is_kept(dialect: str) -> None:
    payload, name, _ = BUILDERS[dialect]("GOOD_NAME", "a b=c")
    translated = translate(copy.deepcopy(payload), name)
    assert not translated.errors, translated.errors
    names = {
        v.name for v in [*translated.spec.env, *(v for r in translated.spec.roles for v in r.env)]
    }
    assert {"OK", "GOOD_NAME"} <= names


@pytest.mark.parametrize("dialect", BUILDERS)
@pytest.mark.parametrize("bad", BAD)
def test_a_variable_no_process_can_take_is_an_error_naming_it(dialect: str, bad: str) -> None:
    payload, name, path = BUILDERS[dialect](*BAD[bad])
    translated = translate(payload, name)
    assert [e.path for e in translated.errors] == [path], translated.errors
    assert "NUL" in translated.errors[0].message or "'='" in translated.errors[0].message
