"""The OpenPAI dialect (seed §4): detection, translation of the seed's own examples,
field paths, the native dialect, and totality under arbitrary input."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainyard_common.dialects import (
    Translation,
    UnknownDialect,
    detect,
    field_path,
    translate,
    validate_native,
    validate_openpai,
)
from trainyard_common.dialects.translation import MAX_JOB_TASKS
from trainyard_common.events import FieldIssue, JobSubmitted, decode, encode
from trainyard_common.jobspec import JobSpec, env_dict

from ..seeds import seed_text

# Both documents verbatim from shared/seeds/openpai-scm-submit-job.md.
HELLOWORLD = seed_text("helloworld_16be675e")
JUPYTER = seed_text("jupyter_16be8b71")


def helloworld() -> dict[str, Any]:
    return json.loads(HELLOWORLD)


def jupyter() -> dict[str, Any]:
    return json.loads(JUPYTER)


# ------------------------------------------------------------------------ the seed jobs


def test_helloworld_translates_without_errors() -> None:
    t = translate(helloworld(), user="alice")
    assert t.dialect == "openpai"
    assert t.errors == []
    assert t.warnings == []  # tmp and extras are expected, not unknown
    spec = t.spec
    assert spec.name == "helloworld_16be675e"
    assert spec.user == "alice"
    assert spec.image == "sitonholy/tensorflow:16.04-9.0-3.5-1.8.0"
    assert spec.queue == "default"
    assert spec.retry_limit == 0
    assert (spec.code_dir, spec.data_dir, spec.output_dir, spec.auth_file) == (None,) * 4
    assert spec.env == [] and spec.keep_failed_for_debug is False
    assert [r.name for r in spec.roles] == ["task_1"]
    role = spec.roles[0]
    assert role.replicas == 1
    assert role.resources.cpu == 1
    assert role.resources.memory_mb == 8192
    assert role.resources.shm_mb == 64
    assert role.resources.gpu == 1
    assert role.resources.gpu_type == "TITANX"
    assert role.resources.storage_gb == 5
    assert role.command == "nvidia-smi"
    # OpenPAI's default ports (v1 rest-server, generateFrameworkDescription): the seed's
    # SSH connection to this job uses its ssh port.
    assert [(p.label, p.begin_at, p.count) for p in role.ports] == [("http", 0, 1), ("ssh", 0, 1)]
    assert role.min_failed is None
    assert role.min_succeeded is None
    assert validate_native(spec) == []


def test_jupyter_translates_with_its_port() -> None:
    t = translate(jupyter())
    assert t.errors == [] and t.warnings == []
    role = t.spec.roles[0]
    assert [(p.label, p.begin_at, p.count) for p in role.ports] == [
        ("jupyter", 0, 1),
        ("http", 0, 1),
        ("ssh", 0, 1),
    ]
    assert role.command.startswith("jupyter notebook --allow-root")
    assert "$PAI_CONTAINER_HOST_jupyter_PORT_LIST" in role.command
    assert '--NotebookApp.token=\\"\\"' in role.command
    assert validate_openpai(jupyter()) == []


def test_translated_seed_travels_in_an_event() -> None:
    payload = helloworld()
    t = translate(payload, user="bob")
    event = JobSubmitted(job_id="j1", spec=t.spec, dialect=t.dialect, original=payload)
    again = decode(encode(event))
    assert isinstance(again, JobSubmitted)
    assert again.spec == t.spec and again.original == payload


# ---------------------------------------------------------------------------- mapping


def test_full_mapping_of_optional_fields() -> None:
    payload = helloworld()
    payload.update(
        authFile="hdfs://auth",
        dataDir="hdfs://data",
        outputDir="hdfs://out",
        codeDir="hdfs://code",
        virtualCluster="research",
        retryCount=3,
        jobEnvs={"isDebug": True, "LR": 0.1, "EPOCHS": 10, "NAME": "x", "OFF": False},
    )
    payload["taskRoles"].append(
        {
            "name": "worker",
            "taskNumber": 4,
            "cpuNumber": 2,
            "memoryMB": 4096,
            "gpuNumber": 2,
            "command": "python train.py",
            "portList": [{"label": "ssh", "beginAt": 2222, "portNumber": 2}],
        }
    )
    t = translate(payload)
    assert t.errors == []
    spec = t.spec
    assert (spec.auth_file, spec.data_dir, spec.output_dir, spec.code_dir) == (
        "hdfs://auth",
        "hdfs://data",
        "hdfs://out",
        "hdfs://code",
    )
    assert spec.queue == "research"
    assert spec.retry_limit == 3
    assert spec.keep_failed_for_debug is True
    assert env_dict(spec.env) == {
        "isDebug": "true",
        "LR": "0.1",
        "EPOCHS": "10",
        "NAME": "x",
        "OFF": "false",
    }
    worker = spec.role("worker")
    assert worker.replicas == 4 and worker.resources.cpu == 2
    assert worker.resources.shm_mb == 64  # OpenPAI's default when shmMB is absent
    assert worker.resources.gpu_type == "TITANX"  # gpuType applies to every role
    assert worker.resources.storage_gb is None
    # Keys absent: OpenPAI's defaults, min_failed 1 and min_succeeded None.
    assert worker.min_failed == 1 and worker.min_succeeded is None
    # Its own ssh ports stand; the http port is OpenPAI's default.
    assert [(p.label, p.begin_at, p.count) for p in worker.ports] == [
        ("ssh", 2222, 2),
        ("http", 0, 1),
    ]


def test_explicit_min_counts() -> None:
    payload = helloworld()
    payload["taskRoles"][0].update(taskNumber=3, minFailedTaskCount=2, minSucceededTaskCount=3)
    role = translate(payload).spec.roles[0]
    assert (role.min_failed, role.min_succeeded) == (2, 3)


@pytest.mark.parametrize("key", ["minFailedTaskCount", "minSucceededTaskCount"])
def test_a_min_count_above_task_number_is_refused_as_openpai_refuses_it(key: str) -> None:
    """Kept, it could never trigger: a job whose every task failed would succeed."""
    payload = helloworld()
    payload["taskRoles"][0].update({"taskNumber": 2, key: 3})
    errors = translate(payload).errors
    assert [(e.path, e.code) for e in errors] == [(f"$.taskRoles[0].{key}", "count_above_tasks")]
    assert "must not be greater than taskNumber (2)" in errors[0].message


def test_integral_floats_are_integers_but_fractions_are_not() -> None:
    payload = helloworld()
    payload["taskRoles"][0]["taskNumber"] = 2.0
    t = translate(payload)
    assert t.errors == [] and t.spec.roles[0].replicas == 2
    payload["taskRoles"][0]["taskNumber"] = 2.5
    t = translate(payload)
    assert [e.path for e in t.errors] == ["$.taskRoles[0].taskNumber"]


def test_unknown_keys_warn_but_extras_and_tmp_do_not() -> None:
    payload = helloworld()
    payload["priority"] = 3
    payload["taskRoles"][0]["gpuMemory"] = 4
    t = translate(payload)
    assert t.errors == []
    assert {w.path for w in t.warnings} == {"$.priority", "$.taskRoles[0].gpuMemory"}
    assert all("priority" in w.message or "gpuMemory" in w.message for w in t.warnings)


def test_a_retry_count_below_zero_is_taken_and_said_what_it_does() -> None:
    # OpenPAI's own schema takes -1 and -2; the guide says "at least 0" (found by an
    # audit of the seeds): taken, with what they do said.
    for count, words in ((-1, "without limit"), (-2, "success too")):
        payload = helloworld()
        payload["retryCount"] = count
        result = translate(payload)
        assert result.errors == []
        [said] = [w for w in result.warnings if w.path == "$.retryCount"]
        assert said.code == "retries_without_limit" and words in said.message
    payload = helloworld()
    payload["retryCount"] = 0
    assert not [w for w in translate(payload).warnings if w.path == "$.retryCount"]


def test_a_job_env_of_the_platforms_names_is_said_to_be_the_platforms() -> None:
    # The guide: jobEnvs "may not replace" the platform's; the platform's value won
    # silently (found by an audit of the seeds).
    payload = helloworld()
    payload["jobEnvs"] = {"PAI_JOB_NAME": "forged", "PAI_X": "1", "MY_PAI_X": "2"}
    result = translate(payload)
    assert result.errors == []
    reserved = [w.path for w in result.warnings if w.code == "env_reserved"]
    assert reserved == ["$.jobEnvs.PAI_JOB_NAME", "$.jobEnvs.PAI_X"]


def test_empty_optional_strings_mean_not_given() -> None:
    payload = helloworld()
    payload["virtualCluster"] = ""
    payload["gpuType"] = ""
    t = translate(payload)
    assert t.spec.queue == "default"
    assert t.spec.roles[0].resources.gpu_type is None


# -------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    ("payload", "dialect"),
    [
        ({"jobName": "a"}, "openpai"),
        ({"taskRoles": []}, "openpai"),
        ({"jobName": "a", "name": "b", "roles": []}, "openpai"),
        ({"name": "a", "roles": []}, "native"),
    ],
)
def test_detect(payload: Any, dialect: str) -> None:
    assert detect(payload) == dialect


@pytest.mark.parametrize("payload", [{}, {"name": "a"}, {"roles": []}, [], "job", None, 3])
def test_detect_unknown_says_what_was_tried(payload: Any) -> None:
    with pytest.raises(UnknownDialect) as info:
        detect(payload)
    assert isinstance(info.value, ValueError)
    assert "openpai" in str(info.value) and "native" in str(info.value)


@pytest.mark.parametrize("payload", [None, [], [1, 2], "text", 7, {"what": 1}])
def test_unparseable_input_gives_a_minimal_spec_and_errors(payload: Any) -> None:
    t = translate(payload, user="carol")
    assert t.spec.name == "" and t.spec.roles == [] and t.spec.user == "carol"
    assert t.errors and all(e.path.startswith("$") for e in t.errors)


def test_forced_dialect_on_wrong_shape() -> None:
    t = translate([1], dialect="openpai")
    assert t.dialect == "openpai"
    assert [e.path for e in t.errors] == ["$"]
    t = translate({"jobName": "x"}, dialect="klingon")
    assert t.errors[0].code == "unknown_dialect"


# ----------------------------------------------------------------------------- paths


_THREE_ROLES = {
    "jobName": "j",
    "taskRoles": [{"name": "a"}, "not a role", {"name": "c"}, {"name": "d"}],
}
_NATIVE = {"name": "n", "roles": [{"name": "a"}, {"name": "b"}]}


@pytest.mark.parametrize(
    ("dialect", "payload", "role", "field", "path"),
    [
        ("openpai", _THREE_ROLES, "a", "gpu", "$.taskRoles[0].gpuNumber"),
        ("openpai", _THREE_ROLES, "c", "memory_mb", "$.taskRoles[2].memoryMB"),
        ("openpai", _THREE_ROLES, "d", "cpu", "$.taskRoles[3].cpuNumber"),
        ("openpai", _THREE_ROLES, "a", "replicas", "$.taskRoles[0].taskNumber"),
        ("openpai", _THREE_ROLES, "c", "role", "$.taskRoles[2]"),
        ("openpai", _THREE_ROLES, "nobody", "cpu", "$.taskRoles"),
        ("openpai", "not a job", "a", "cpu", "$.taskRoles"),
        ("openpai", _THREE_ROLES, None, "gpu_type", "$.gpuType"),
        ("openpai", _THREE_ROLES, "d", "gpu_type", "$.gpuType"),
        ("openpai", _THREE_ROLES, None, "queue", "$.virtualCluster"),
        ("openpai", _THREE_ROLES, None, "name", "$.jobName"),
        ("openpai", _THREE_ROLES, None, "keep_failed_for_debug", "$.jobEnvs.isDebug"),
        ("openpai_v2", {}, "worker", "gpu", "$.taskRoles.worker.resourcePerInstance.gpu"),
        ("openpai_v2", {}, "a b", "role", "$.taskRoles['a b']"),
        ("openpai_v2", {}, None, "queue", "$.defaults.virtualCluster"),
        ("native", _NATIVE, "a", "gpu", "$.roles[0].resources.gpu"),
        ("native", _NATIVE, "b", "command", "$.roles[1].command"),
        ("native", _NATIVE, "b", "role", "$.roles[1]"),
        ("native", _NATIVE, None, "queue", "$.queue"),
        ("native", _NATIVE, None, "name", "$.name"),
    ],
)
def test_field_path(dialect: str, payload: Any, role: str | None, field: str, path: str) -> None:
    assert field_path(dialect, payload, role, field) == path


# ---------------------------------------------------------------------------- native


def test_native_round_trip() -> None:
    spec = translate(helloworld()).spec
    payload = spec.model_dump(mode="json")
    t = translate(payload, user="dave")
    assert t.dialect == "native" and t.errors == []
    assert t.spec == spec.model_copy(update={"user": "dave"})


def test_native_type_errors_have_paths_and_keep_the_valid_part() -> None:
    payload = {
        "name": "job",
        "priority": "high",
        "unknown": 1,
        "roles": [
            {"name": "ok", "command": "run"},
            {"name": "bad", "command": "run", "replicas": True, "resources": {"gpu": "lots"}},
        ],
    }
    t = translate(payload)
    paths = {e.path for e in t.errors}
    assert paths == {"$.priority", "$.unknown", "$.roles[1].replicas", "$.roles[1].resources.gpu"}
    assert t.spec.name == "job" and [r.name for r in t.spec.roles] == ["ok"]


def test_native_rules_are_reported_by_translate() -> None:
    t = translate({"name": "bad name", "roles": []})
    assert {e.path for e in t.errors} == {"$.name", "$.roles"}


# ---------------------------------------------------------------------- totality

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | st.text(max_size=20)
)
json_like = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
_keys = st.sampled_from(
    sorted(
        {
            "jobName",
            "image",
            "taskRoles",
            "gpuType",
            "retryCount",
            "jobEnvs",
            "extras",
            "tmp",
            "virtualCluster",
            "name",
            "roles",
            "taskNumber",
            "cpuNumber",
            "memoryMB",
            "shmMB",
            "gpuNumber",
            "portList",
            "label",
            "beginAt",
            "portNumber",
            "command",
            "isDebug",
            "minFailedTaskCount",
            "minSucceededTaskCount",
            "resources",
            "replicas",
            "ports",
        }
    )
) | st.text(max_size=8)
# Dicts keyed by the dialects' own field names reach deeper than random keys would.
shaped = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=8),
    max_leaves=40,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


SEED_PATHS = [p for p in _paths(helloworld()) + _paths(jupyter()) if p]


@st.composite
def mutated_seed(draw: st.DrawFn) -> dict[str, Any]:
    payload = copy.deepcopy(draw(st.sampled_from([helloworld(), jupyter()])))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(SEED_PATHS))
        parent: Any = payload
        try:
            for part in path[:-1]:
                parent = parent[part]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_like)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed this path
    return payload


def _assert_well_formed(t: Translation, user: str = "u") -> None:
    assert isinstance(t.spec, JobSpec)
    assert t.spec.user == user
    JobSpec.model_validate(t.spec.model_dump())  # the spec is a valid model, not a shell
    for issue in [*t.errors, *t.warnings]:
        assert isinstance(issue, FieldIssue)
        assert issue.path.startswith("$")
        assert issue.code != "internal", issue.message


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(json_like)
def test_translate_never_raises_on_any_json(payload: Any) -> None:
    _assert_well_formed(translate(payload, user="u"))
    _assert_well_formed(translate(payload, dialect="openpai", user="u"))
    _assert_well_formed(translate(payload, dialect="native", user="u"))
    assert isinstance(validate_openpai(payload), list)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(shaped)
def test_translate_never_raises_on_dialect_shaped_input(payload: Any) -> None:
    _assert_well_formed(translate(payload, dialect="openpai", user="u"))
    _assert_well_formed(translate(payload, dialect="native", user="u"))
    assert isinstance(validate_openpai(payload), list)


def _many_tasks() -> dict[str, Any]:
    payload = helloworld()
    payload["taskRoles"][0]["taskNumber"] = MAX_JOB_TASKS + 1  # found by this test once
    return payload


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@example(_many_tasks())
@given(mutated_seed())
def test_mutated_seed_never_raises_and_clean_means_valid(payload: dict[str, Any]) -> None:
    # Named explicitly: a mutation may delete both keys detection looks for.
    t = translate(payload, dialect="openpai", user="u")
    _assert_well_formed(t)
    assert validate_openpai(payload) == t.errors
    if not t.errors:
        # Whatever OpenPAI's rules let through must meet the canonical rules too, but the
        # platform's own bound on a job's tasks, which OpenPAI does not have: checked
        # after every dialect's translation (intake's checked(), validation's rules).
        beyond = validate_native(t.spec)
        assert all(issue.code == "too_many_tasks" for issue in beyond), beyond
        tasks = sum(max(r.replicas, r.max_replicas or 0) for r in t.spec.roles)
        assert bool(beyond) is (tasks > MAX_JOB_TASKS)
    event = JobSubmitted(
        job_id="j", spec=t.spec, dialect=t.dialect, translation_errors=t.errors, warnings=t.warnings
    )
    assert decode(encode(event)) == event


def test_auth_file_and_code_dir_say_what_is_not_done_with_them() -> None:
    """The seed: codeDir is copied into the container, authFile authenticates the
    registry. Neither happens here, and the job is told so."""
    payload = helloworld()
    payload.update(authFile="hdfs://nn/auth", codeDir="hdfs://nn/code")
    translated = translate(payload)
    assert translated.errors == []
    warned = {w.path: w.code for w in translated.warnings}
    assert warned == {"$.authFile": "not_applied", "$.codeDir": "not_applied"}
    payload.update(authFile="", codeDir="")
    assert translate(payload).warnings == []
