"""OpenPAI job protocol v2: OpenPAI's own examples, every field and where it goes, the
references in commands (parameters at translation, secrets at launch), errors by path,
secrets hidden in every stored form, and the OpenPAI REST views of a job."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard_common.dialects import detect, translate
from trainyard_common.dialects.openpai import render_list_item, render_status
from trainyard_common.dialects.openpai_v2 import (
    REGISTRATION,
    flatten_secrets,
    redact_openpai_v2,
    render,
    translate_openpai_v2,
)
from trainyard_common.jobspec import REDACTED, env_dict
from trainyard_launcher.domain.env import substitute_secrets
from trainyard_status.adapters.views import hide_secrets

from ..seeds import EXAMPLES, seed_job

V2 = EXAMPLES / "openpai" / "v2"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((V2 / name).read_text())


def job(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "protocolVersion": 2,
        "name": "train-1",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "python:3.11"}],
        "parameters": {"epochs": 3, "lr": 0.5, "flag": True},
        "secrets": {"token": "s3cr3t"},
        "taskRoles": {
            "worker": {
                "instances": 2,
                "dockerImage": "img",
                "resourcePerInstance": {"cpu": 2, "memoryMB": 1024, "gpu": 0},
                "commands": [
                    "  echo start  ",
                    "train --epochs <% $parameters.epochs %> "
                    "--lr=<%$parameters.lr%> --token <% $secrets.token %>",
                ],
            },
        },
    }
    payload.update(changes)
    return payload


def role(payload: dict[str, Any], **changes: Any) -> dict[str, Any]:
    payload = copy.deepcopy(payload)
    payload["taskRoles"]["worker"].update(changes)
    return payload


def paths(issues: list[Any]) -> list[str]:
    return [i.path for i in issues]


# ---------------------------------------------------------------------- OpenPAI's examples


@pytest.mark.parametrize("name", sorted(p.name for p in V2.glob("*.yaml")))
def test_every_example_from_openpai_docs_translates_without_errors(name: str) -> None:
    payload = example(name)
    assert detect(payload) == "openpai_v2"
    t = translate(payload, user="alice")
    assert t.ok, t.errors
    assert t.key == payload["name"] == t.spec.name
    assert [r.name for r in t.spec.roles] == list(payload["taskRoles"])
    for r in t.spec.roles:
        assert r.image and r.command and "<% $parameters" not in r.command


def test_the_protocol_spec_example_maps_every_field() -> None:
    t = translate(example("tensorflow-cifar10.yaml"), user="alice")
    spec = t.spec
    assert spec.retry_limit == 1 and spec.queue == "default"
    assert env_dict(spec.secrets) == {"docker_password": "password", "github_token": "cGFzc3dvcmQ="}
    worker, ps = spec.roles
    assert worker.image == "openpai/pai.example.tensorflow"
    assert (
        worker.resources.cpu,
        worker.resources.memory_mb,
        worker.resources.gpu,
        worker.resources.shm_mb,
    ) == (2, 16384, 4, 64)
    assert [(p.label, p.count) for p in worker.ports] == [("ssh", 1), ("http", 1)]
    assert (worker.min_failed, worker.min_succeeded) == (1, 1)
    # minSucceededInstances -1: the role alone never succeeds the job.
    assert (ps.min_failed, ps.min_succeeded) == (1, None)
    lines = worker.command.split("\n")
    # The default deployment's preCommands run first, then the role's commands.
    assert lines[0] == (
        "wget https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz -P data_cifar10"
    )
    assert lines[1].startswith("git clone https://MaggieQi:<% $secrets.github_token %>@")
    assert lines[2] == "cd script_tensorflow_cnnbenchmarks/scripts/tf_cnn_benchmarks"
    assert "--model=resnet20 --batch_size=32" in lines[3]
    assert "--data_dir=$PAI_WORK_DIR/data_cifar10" in lines[3]
    # ps_server's postCommands come after its commands; $output renders its uri.
    assert ps.command.split("\n")[-1] == (
        "hdfs dfs -cp output_tensorflow_cifar10_model hdfs://10.151.40.179:9000/core/cifar10_model"
    )
    assert "cGFzc3dvcmQ=" not in worker.command
    warned = {w.code for w in t.warnings}
    assert {"prerequisite_not_fetched", "auth_not_used"} <= warned


def test_cmd_plugin_prerequisites_run_before_the_commands() -> None:
    spec = translate(example("prerequisites.yaml")).spec
    assert spec.roles[0].command.split("\n") == [
        "apt update",
        "apt install -y  git",
        "mkdir -p /dataset/covid-19",
        "git clone https://github.com/ieee8023/covid-chestxray-dataset.git /dataset/covid-19",
        "ls -la /dataset/covid-19",
    ]


def test_runtime_plugins_in_extras_are_kept_and_warned_about() -> None:
    payload = example("hello-world-job.yaml")
    t = translate(payload)
    assert paths(t.warnings) == ["$.extras['com.microsoft.pai.runtimeplugin']"]
    assert t.spec.roles[0].min_succeeded is None  # -1


def test_gang_allocation_false_places_the_tasks_one_by_one() -> None:
    assert translate(job()).spec.gang is True
    t = translate(job(extras={"gangAllocation": False}))
    assert t.spec.gang is False and not t.errors and not t.warnings
    assert translate(job(extras={"gangAllocation": True})).spec.gang is True
    bad = translate(job(extras={"gangAllocation": "no"}))
    assert paths(bad.errors) == ["$.extras.gangAllocation"]
    # v1 jobs carry it in extras too (the launcher's platformSpecificParameters).
    v1 = seed_job("helloworld_16be675e")
    assert translate(v1).spec.gang is True
    assert translate({**v1, "extras": {"gangAllocation": False}}).spec.gang is False


def test_the_seed_v1_jobs_are_still_v1() -> None:
    for name in ("helloworld_16be675e", "jupyter_16be8b71"):
        assert detect(seed_job(name)) == "openpai"
    # A jobName with taskRoles as a map is a broken v1 job, reported as such.
    assert detect({"jobName": "x", "taskRoles": {"a": {}}}) == "openpai"
    assert detect({"name": "x", "taskRoles": {"a": {}}}) == "openpai_v2"
    assert detect({"protocolVersion": 3, "taskRoles": []}) == "openpai_v2"


# ----------------------------------------------------------------------------- the fields


def test_parameters_are_substituted_and_secrets_are_not() -> None:
    t = translate_openpai_v2(job(), "bob")
    assert t.ok, t.errors
    r = t.spec.roles[0]
    # Each command trimmed, joined with newlines (how OpenPAI builds the entrypoint).
    assert r.command == "echo start\ntrain --epochs 3 --lr=0.5 --token <% $secrets.token %>"
    assert env_dict(t.spec.secrets) == {"token": "s3cr3t"}
    # The launcher substitutes the secret when it starts the task.
    launched = substitute_secrets(r.command, env_dict(t.spec.secrets))
    assert launched.endswith("--token s3cr3t")
    # The spec as stored for reading never holds the value.
    assert "s3cr3t" not in t.spec.redacted().model_dump_json()


def test_parameters_rendered_past_the_bound_are_refused_before_they_are_built() -> None:
    """A 20 kB parameter named 2,000 times: 40 MB of command from a 54 kB body. The
    bound holds for all the job's task roles together."""
    payload = job()
    payload["parameters"]["big"] = "x" * 20_000
    payload["taskRoles"]["worker"]["commands"] = ["echo <% $parameters.big %>"] * 2000
    t = translate_openpai_v2(payload, "bob")
    assert [(e.path, e.code) for e in t.errors] == [("$.taskRoles.worker.commands", "too_large")]
    payload["taskRoles"]["worker"]["commands"] = ["echo <% $parameters.big %>"] * 150
    assert translate_openpai_v2(payload, "bob").ok
    second = copy.deepcopy(payload["taskRoles"]["worker"])
    payload["taskRoles"]["other"] = second
    assert [e.path for e in translate_openpai_v2(payload, "bob").errors] == [
        "$.taskRoles.other.commands"
    ]


def test_parameter_values_are_written_as_openpai_writes_them() -> None:
    text, missing = render(
        "<% $parameters.flag %> <% $parameters.l[1] %> <% $parameters.n.a %>"
        " <% $parameters.nope %> <%$data.name%>",
        {"$parameters": {"flag": True, "l": [1, 2.0], "n": {"a": None}}},
    )
    assert text == "true 2 <% $parameters.n.a %> <% $parameters.nope %> <% $data.name %>"
    assert missing == ["$parameters.n.a", "$parameters.nope", "$data.name"]


def test_unknown_references_are_kept_and_warned_about() -> None:
    payload = role(job(), commands=["echo <% $parameters.missing %> <% $secrets.nope %>"])
    t = translate_openpai_v2(payload)
    assert t.ok
    assert t.spec.roles[0].command == "echo <% $parameters.missing %> <% $secrets.nope %>"
    assert paths(t.warnings) == ["$.taskRoles.worker.commands"] * 2


def test_nested_secrets_are_flattened_to_the_names_commands_use() -> None:
    pairs = flatten_secrets({"db": {"user": "root", "ports": [1, 2]}, "flag": False, "n": None})
    assert env_dict(pairs) == {
        "db.user": "root",
        "db.ports.0": "1",
        "db.ports.1": "2",
        "flag": "false",
    }


def test_completion_minus_one_null_and_defaults() -> None:
    def counts(completion: Any) -> tuple[Any, Any]:
        r = translate_openpai_v2(role(job(), completion=completion)).spec.roles[0]
        return r.min_failed, r.min_succeeded

    assert counts(None) == (1, 2)  # absent: 1 and instances
    assert counts({}) == (1, 2)
    assert counts({"minFailedInstances": None, "minSucceededInstances": None}) == (1, 2)
    assert counts({"minFailedInstances": -1, "minSucceededInstances": -1}) == (None, None)
    assert counts({"minFailedInstances": 2, "minSucceededInstances": 1}) == (2, 1)
    # 0 is the schema's (any integer) and k8s.js reads it as JavaScript does, falsy: the
    # default.
    zero = translate_openpai_v2(
        role(job(), completion={"minFailedInstances": 0, "minSucceededInstances": 0})
    )
    assert zero.errors == [] and counts({"minFailedInstances": 0, "minSucceededInstances": 0}) == (
        1,
        2,
    )


def test_job_level_fields() -> None:
    payload = job(
        jobRetryCount=4,
        defaults={"virtualCluster": "vc-a"},
        version="1.0",
        contributor="me",
        description="d",
        extras={"submitFrom": "x"},
    )
    t = translate_openpai_v2(payload, "carol")
    assert t.ok and t.warnings == []
    spec = t.spec
    assert (spec.name, spec.user, spec.queue, spec.retry_limit) == ("train-1", "carol", "vc-a", 4)
    assert spec.image == "python:3.11" == spec.roles[0].image
    assert t.key == "train-1"


def test_role_resources_ports_and_shm() -> None:
    payload = role(
        job(),
        extraContainerOptions={"shmMB": 256},
        resourcePerInstance={"cpu": 3, "memoryMB": 2048, "gpu": 1, "ports": {"tb": 2, "http": 1}},
    )
    r = translate_openpai_v2(payload).spec.roles[0]
    assert (
        r.replicas,
        r.resources.cpu,
        r.resources.memory_mb,
        r.resources.gpu,
        r.resources.shm_mb,
    ) == (2, 3, 2048, 1, 256)
    assert [(p.label, p.count, p.begin_at) for p in r.ports] == [
        ("tb", 2, 0),
        ("http", 1, 0),
        ("ssh", 1, 0),
    ]
    assert translate_openpai_v2(job()).spec.roles[0].resources.shm_mb == 512


def test_a_deployment_wraps_the_commands() -> None:
    payload = job(
        deployments=[
            {
                "name": "prod",
                "taskRoles": {
                    "worker": {
                        "preCommands": ["echo pre"],
                        "postCommands": ["echo post <% $parameters.epochs %>"],
                    }
                },
            }
        ],
        defaults={"deployment": "prod"},
    )
    command = translate_openpai_v2(payload).spec.roles[0].command
    assert command.split("\n")[0] == "echo pre" and command.split("\n")[-1] == "echo post 3"
    # Without defaults.deployment no deployment is applied.
    del payload["defaults"]
    assert translate_openpai_v2(payload).spec.roles[0].command.startswith("echo start")


def test_task_retries_and_infiniband_are_warnings() -> None:
    payload = role(job(), taskRetryCount=2, extraContainerOptions={"infiniband": True}, surprise=1)
    t = translate_openpai_v2(payload)
    assert t.ok
    assert paths(t.warnings) == [
        "$.taskRoles.worker.taskRetryCount",
        "$.taskRoles.worker.extraContainerOptions.infiniband",
        "$.taskRoles.worker.surprise",
    ]


# ------------------------------------------------------------------------------ the errors


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (job(protocolVersion=1), "$.protocolVersion"),
        (job(name="bad name"), "$.name"),
        (job(name="a.b"), "$.name"),
        (job(type="component"), "$.type"),
        (job(jobRetryCount=-1), "$.jobRetryCount"),
        (job(parameters=[1]), "$.parameters"),
        (job(secrets="x"), "$.secrets"),
        (job(taskRoles={}), "$.taskRoles"),
        (job(taskRoles=[]), "$.taskRoles"),
        (job(taskRoles={"1bad": {}}), "$.taskRoles['1bad']"),
        (role(job(), instances=0), "$.taskRoles.worker.instances"),
        (role(job(), instances="2"), "$.taskRoles.worker.instances"),
        (role(job(), dockerImage="nope"), "$.taskRoles.worker.dockerImage"),
        (role(job(), data="nope"), "$.taskRoles.worker.data"),
        (role(job(), commands=[]), "$.taskRoles.worker.commands"),
        (role(job(), commands=["ok", 3]), "$.taskRoles.worker.commands[1]"),
        (role(job(), commands=["  "]), "$.taskRoles.worker.commands"),
        (
            role(job(), completion={"minSucceededInstances": -2}),
            "$.taskRoles.worker.completion.minSucceededInstances",
        ),
        (
            role(job(), resourcePerInstance={"cpu": 1, "gpu": 0}),
            "$.taskRoles.worker.resourcePerInstance.memoryMB",
        ),
        (
            role(job(), resourcePerInstance={"cpu": 0, "memoryMB": 512, "gpu": 0}),
            "$.taskRoles.worker.resourcePerInstance.cpu",
        ),
        (
            role(
                job(),
                resourcePerInstance={"cpu": 1, "memoryMB": 512, "gpu": 0, "ports": {"a-b": 1}},
            ),
            "$.taskRoles.worker.resourcePerInstance.ports['a-b']",
        ),
        (
            role(
                job(), resourcePerInstance={"cpu": 1, "memoryMB": 512, "gpu": 0, "ports": {"p": 0}}
            ),
            "$.taskRoles.worker.resourcePerInstance.ports.p",
        ),
        (job(prerequisites=[{"name": "img", "type": "dockerimage"}]), "$.prerequisites[0].uri"),
        (
            job(
                prerequisites=[
                    {"name": "img", "type": "dockerimage", "uri": "a"},
                    {"name": "img", "type": "dockerimage", "uri": "b"},
                ]
            ),
            "$.prerequisites[1].name",
        ),
        (job(prerequisites=[{"name": "x", "type": "job"}]), "$.prerequisites[0].type"),
        (job(defaults={"deployment": "none"}), "$.defaults.deployment"),
    ],
)
def test_each_rule_names_its_field(payload: dict[str, Any], path: str) -> None:
    t = translate_openpai_v2(payload)
    assert path in paths(t.errors), t.errors
    assert REGISTRATION.validate(payload, t.spec) == t.errors


def test_a_missing_prerequisite_also_fails_the_role_that_uses_it() -> None:
    t = translate_openpai_v2(job(prerequisites=None))
    assert paths(t.errors) == ["$.taskRoles.worker.dockerImage"]


# ------------------------------------------------------------------------------- secrets


def test_redact_hides_secret_values_and_literal_registry_passwords() -> None:
    payload = example("tensorflow-cifar10.yaml")
    payload["prerequisites"][0]["auth"]["password"] = "literal-pw"
    payload["secrets"]["nested"] = {"a": ["x", "y"]}
    shown = redact_openpai_v2(payload)
    text = json.dumps(shown)
    for value in (': "password"', "cGFzc3dvcmQ=", "literal-pw", '"x"'):
        assert value not in text
    assert shown["secrets"]["docker_password"] == REDACTED
    assert shown["secrets"]["nested"] == {"a": [REDACTED, REDACTED]}
    assert payload["secrets"]["github_token"] == "cGFzc3dvcmQ="  # the input is untouched
    ref = example("tensorflow-cifar10.yaml")
    # A password given as a secret reference is no secret itself.
    assert (
        redact_openpai_v2(ref)["prerequisites"][0]["auth"]["password"]
        == "<% $secrets.docker_password %>"
    )


def test_history_events_show_no_secret_values() -> None:
    t = translate_openpai_v2(job(), "bob")
    event = {
        "type": "JobSubmitted",
        "dialect": "openpai_v2",
        "spec": json.loads(t.spec.model_dump_json()),
        "original": job(),
    }
    shown = hide_secrets(copy.deepcopy(event))
    assert "s3cr3t" not in json.dumps(shown)
    assert shown["spec"]["secrets"] == [{"name": "token", "value": REDACTED}]
    # Events without secrets pass unchanged.
    plain = {"type": "TaskStateChanged", "state": "RUNNING"}
    assert hide_secrets(dict(plain)) == plain


# -------------------------------------------------------------------------- totality


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)
_keys = st.sampled_from(
    [
        "protocolVersion",
        "name",
        "type",
        "prerequisites",
        "parameters",
        "secrets",
        "jobRetryCount",
        "taskRoles",
        "deployments",
        "defaults",
        "extras",
        "instances",
        "completion",
        "minFailedInstances",
        "minSucceededInstances",
        "dockerImage",
        "data",
        "commands",
        "resourcePerInstance",
        "cpu",
        "memoryMB",
        "gpu",
        "ports",
        "uri",
        "auth",
        "preCommands",
        "postCommands",
        "deployment",
        "virtualCluster",
        "plugin",
        "callbacks",
        "event",
        "extraContainerOptions",
        "shmMB",
        "worker",
        "img",
    ]
) | st.text(max_size=6)
_shaped = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.text(max_size=30)
    | st.sampled_from(["<% $parameters.a %>", "<% $secrets.b %>", "dockerimage", "img", 2]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=8),
    max_leaves=40,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(_json, _shaped))
def test_translate_never_raises(payload: Any) -> None:
    t = translate_openpai_v2(payload, "u")
    assert t.dialect == "openpai_v2"
    assert isinstance(t.errors, list)
    redact_openpai_v2(payload)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data())
def test_mutated_examples_never_raise(data: st.DataObject) -> None:
    payload = example(data.draw(st.sampled_from(sorted(p.name for p in V2.glob("*.yaml")))))
    target: Any = payload
    for _ in range(data.draw(st.integers(0, 3))):
        if isinstance(target, dict) and target:
            key = data.draw(st.sampled_from(sorted(target, key=str)))
            if data.draw(st.booleans()):
                target[key] = data.draw(_shaped)
                break
            target = target[key]
        elif isinstance(target, list) and target:
            target = target[data.draw(st.integers(0, len(target) - 1))]
    translate_openpai_v2(payload, "u")


# ----------------------------------------------------------------------- the REST views


def view(**changes: Any) -> dict[str, Any]:
    spec = json.loads(translate_openpai_v2(job(), "bob").spec.redacted().model_dump_json())
    base: dict[str, Any] = {
        "id": "j1",
        "name": "train-1",
        "user": "bob",
        "state": "SUCCEEDED",
        "dialect": "openpai_v2",
        "queue": "default",
        "priority": 5,
        "attempt": 1,
        "submitted_at": datetime(2024, 1, 1, tzinfo=UTC),
        "finished_at": "2024-01-01T00:01:00+00:00",
        "exit_code": 0,
        "reason": "all done",
        "spec": spec,
        "tasks": [
            {
                "role": "worker",
                "index": i,
                "attempt": 1,
                "state": "SUCCEEDED",
                "exit_code": 0,
                "reason": None,
                "node": "n1",
                "host_ip": "10.0.0.1",
                "gpu_indices": [],
                "ports": [
                    {"label": "http", "ports": [31000 + i]},
                    {"label": "ssh", "ports": [31010 + i, 31020 + i]},
                ],
                "updated_at": datetime(2024, 1, 1, 0, 1, tzinfo=UTC),
            }
            for i in range(2)
        ],
    }
    base.update(changes)
    return base


def test_render_status_is_openpai_shape() -> None:
    status = render_status(view())
    assert status["name"] == "train-1" and status["debugId"] == "bob~train-1"
    js = status["jobStatus"]
    assert (js["username"], js["state"], js["subState"], js["executionType"]) == (
        "bob",
        "SUCCEEDED",
        "Completed",
        "START",
    )
    assert js["createdTime"] == 1704067200000 and js["completedTime"] == 1704067260000
    assert js["appExitCode"] == 0 and js["retries"] == 0 and js["virtualCluster"] == "default"
    tasks = status["taskRoles"]["worker"]["taskStatuses"]
    assert status["taskRoles"]["worker"]["taskRoleStatus"] == {"name": "worker"}
    assert [t["taskIndex"] for t in tasks] == [0, 1]
    assert tasks[1]["taskState"] == "SUCCEEDED" and tasks[1]["containerIp"] == "10.0.0.1"
    assert tasks[1]["containerPorts"] == {"http": "31001", "ssh": "31011,31021"}
    assert tasks[1]["containerExitCode"] == 0 and tasks[1]["containerId"] == "j1-1-worker-1"


@pytest.mark.parametrize(
    ("state", "stop", "expected"),
    [
        ("SUBMITTED", False, ("WAITING", "AttemptCreationPending", "START")),
        ("QUEUED", False, ("WAITING", "AttemptCreationPending", "START")),
        ("PLACED", False, ("WAITING", "AttemptPreparing", "START")),
        ("RUNNING", False, ("RUNNING", "AttemptRunning", "START")),
        ("RUNNING", True, ("STOPPING", "AttemptDeletionPending", "STOP")),
        ("STOPPED", True, ("STOPPED", "Completed", "STOP")),
        ("FAILED", False, ("FAILED", "Completed", "START")),
        ("REJECTED", False, ("FAILED", "Completed", "START")),
    ],
)
def test_states_map_to_openpai_states(state: str, stop: bool, expected: tuple[str, ...]) -> None:
    v = view(state=state, stop_requested=stop, exit_code=None)
    js = render_status(v)["jobStatus"]
    assert (js["state"], js["subState"], js["executionType"]) == expected
    item = render_list_item(v)
    assert (item["state"], item["subState"], item["executionType"]) == expected
    if state == "STOPPED":
        assert js["appExitCode"] == -210  # OpenPAI's code for a user stop
    if expected[2] == "START" and expected[0] in ("WAITING", "RUNNING"):
        assert js["completedTime"] is None and js["appExitCode"] is None


def test_unplaced_tasks_are_waiting_and_only_the_latest_attempt_shows() -> None:
    v = view(
        state="QUEUED",
        tasks=[dict(view()["tasks"][0], attempt=1)],
        attempt=2,
        attempts=[{"attempt": 1, "state": "FAILED", "failure_class": "user", "retried_as": 2}],
    )
    tasks = render_status(v)["taskRoles"]["worker"]["taskStatuses"]
    assert [t["taskState"] for t in tasks] == ["WAITING", "WAITING"]
    assert render_status(v)["jobStatus"]["retries"] == 1


def test_only_failed_attempts_run_again_count_as_retries() -> None:
    # Attempt 1 restarted, 2 paused, 3 lost by the platform, 4 failed (unknown), 5 runs.
    ended = [
        {"attempt": 1, "state": "STOPPED", "interrupted": "restarted", "retried_as": 2},
        {"attempt": 2, "state": "STOPPED", "interrupted": "paused"},
        {"attempt": 3, "state": "FAILED", "failure_class": "platform", "retried_as": 4},
        {"attempt": 4, "state": "FAILED", "failure_class": "unknown", "retried_as": 5},
    ]
    v = view(state="RUNNING", attempt=5, attempts=ended)
    js = render_status(v)["jobStatus"]
    assert (js["retries"], js["attemptId"]) == (2, 4)
    assert js["retryDetails"] == {"user": 1, "platform": 1, "resource": 0}
    item = render_list_item(v)
    assert (item["retries"], item["retryDetails"]) == (2, js["retryDetails"])
    restarted = view(state="QUEUED", attempt=2, attempts=ended[:1])
    assert render_status(restarted)["jobStatus"]["retries"] == 0
    assert render_list_item(restarted)["retries"] == 0


def test_render_list_item_totals() -> None:
    payload = role(job(), resourcePerInstance={"cpu": 1, "memoryMB": 512, "gpu": 2})
    spec = json.loads(translate_openpai_v2(payload).spec.model_dump_json())
    item = render_list_item(view(spec=spec))
    assert (
        item["name"],
        item["username"],
        item["totalTaskNumber"],
        item["totalGpuNumber"],
        item["totalTaskRoleNumber"],
        item["submissionTime"],
    ) == ("train-1", "bob", 2, 4, 1, 1704067200000)


def test_views_of_a_broken_view_do_not_raise() -> None:
    assert render_status({})["taskRoles"] == {}
    assert render_list_item({"spec": {"roles": [None, {"replicas": "x"}]}})["totalTaskNumber"] == 1


def test_the_examples_are_there() -> None:
    # The parametrized example test would pass vacuously without them.
    assert len(list(V2.glob("*.yaml"))) >= 5
