"""The environment a task starts with: OpenPAI's whole PAI_* list (seed §4), Trainyard's
own variables, CUDA_VISIBLE_DEVICES, and job/role variables that cannot replace them."""

from __future__ import annotations

import pytest

from trainyard_common.events import PortAssignment, TaskPlacement
from trainyard_common.jobspec import EnvVar, JobSpec, PortSpec, Resources, RoleSpec
from trainyard_common.limits import TooLong
from trainyard_launcher.domain.env import (
    build_task_env,
    openpai_compat_env,
    resource_string,
    substitute_secrets,
)


def two_role_job() -> tuple[JobSpec, list[TaskPlacement]]:
    spec = JobSpec(
        name="mnist-dist",
        user="alice",
        env=[
            EnvVar(name="LR", value="0.1"),
            EnvVar(name="PAI_JOB_NAME", value="forged"),
            EnvVar(name="SHARED", value="job"),
        ],
        roles=[
            RoleSpec(
                name="master",
                replicas=1,
                command="python master.py",
                resources=Resources(gpu=1, cpu=1, memory_mb=8192, shm_mb=64),
                ports=[PortSpec(label="jupyter"), PortSpec(label="ssh", count=2)],
                min_failed=1,
                min_succeeded=1,
                env=[
                    EnvVar(name="SHARED", value="role"),
                    EnvVar(name="CUDA_VISIBLE_DEVICES", value="0,1,2,3"),
                ],
            ),
            RoleSpec(
                name="worker",
                replicas=2,
                command="python worker.py",
                resources=Resources(gpu=0, cpu=2.5, memory_mb=4096, shm_mb=128),
                ports=[PortSpec(label="http")],
                min_failed=None,
                min_succeeded=None,
            ),
        ],
    )
    tasks = [
        TaskPlacement(
            role="master",
            index=0,
            node="n1",
            host_ip="10.0.0.1",
            gpu_indices=[3],
            ports=[
                PortAssignment(label="jupyter", ports=[20001]),
                PortAssignment(label="ssh", ports=[20002, 20003]),
            ],
        ),
        TaskPlacement(
            role="worker",
            index=0,
            node="n2",
            host_ip="10.0.0.2",
            ports=[PortAssignment(label="http", ports=[21000])],
        ),
        TaskPlacement(
            role="worker",
            index=1,
            node="n2",
            host_ip="10.0.0.2",
            ports=[PortAssignment(label="http", ports=[21001])],
        ),
    ]
    return spec, tasks


def test_every_pai_variable_for_the_master_task() -> None:
    spec, tasks = two_role_job()
    env = build_task_env(
        spec, tasks, "master", 0, attempt=2, job_id="job-42", default_fs_uri="hdfs://nn:9000"
    )
    expected_system = {
        "TRAINYARD_JOB_ID": "job-42",
        "TRAINYARD_ROLE": "master",
        "TRAINYARD_INDEX": "0",
        "TRAINYARD_ATTEMPT": "2",
        "PAI_JOB_NAME": "mnist-dist",
        "PAI_USER_NAME": "alice",
        "PAI_DEFAULT_FS_URI": "hdfs://nn:9000",
        "PAI_TASK_ROLE_COUNT": "2",
        "PAI_TASK_ROLE_LIST": "master,worker",
        "PAI_TASK_ROLE_TASK_COUNT_master": "1",
        "PAI_TASK_ROLE_TASK_COUNT_worker": "2",
        "PAI_HOST_IP_master_0": "10.0.0.1",
        "PAI_HOST_IP_worker_0": "10.0.0.2",
        "PAI_HOST_IP_worker_1": "10.0.0.2",
        "PAI_PORT_LIST_master_0_jupyter": "20001",
        "PAI_PORT_LIST_master_0_ssh": "20002,20003",
        "PAI_PORT_LIST_worker_0_http": "21000",
        "PAI_PORT_LIST_worker_1_http": "21001",
        "PAI_RESOURCE_master": "1,1,8192,64",
        "PAI_RESOURCE_worker": "0,2.5,4096,128",
        "PAI_MIN_FAILED_TASK_COUNT_master": "1",
        "PAI_MIN_SUCCEEDED_TASK_COUNT_master": "1",
        "PAI_MIN_FAILED_TASK_COUNT_worker": "",
        "PAI_MIN_SUCCEEDED_TASK_COUNT_worker": "",
        "PAI_CURRENT_TASK_ROLE_NAME": "master",
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "0",
        "PAI_CONTAINER_HOST_jupyter_PORT_LIST": "20001",
        "PAI_CONTAINER_HOST_ssh_PORT_LIST": "20002,20003",
        "PAI_CONTAINER_HOST_IP": "10.0.0.1",
        "PAI_CONTAINER_ID": "job-42-2-master-0",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    user = {"LR": "0.1", "SHARED": "role"}
    # The back-compatible aliases are checked one by one below.
    compat = openpai_compat_env(spec, tasks, tasks[0], spec.role("master"), "hdfs://nn:9000")
    assert compat["PAI_OUTPUT_DIR"] == "hdfs://nn:9000/Output/mnist-dist"  # the seed's default
    assert env == {**expected_system, **compat, **user}


def test_current_task_of_the_second_role() -> None:
    spec, tasks = two_role_job()
    env = build_task_env(spec, tasks, "worker", 1, attempt=1, job_id="j")
    assert env["PAI_CURRENT_TASK_ROLE_NAME"] == "worker"
    assert env["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == "1"
    assert env["TRAINYARD_INDEX"] == "1"
    assert env["PAI_CONTAINER_HOST_http_PORT_LIST"] == "21001"
    assert "PAI_CONTAINER_HOST_jupyter_PORT_LIST" not in env
    assert env["PAI_CONTAINER_HOST_IP"] == "10.0.0.2"
    # A CPU task sees no GPU at all, not every GPU of the machine.
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PAI_DEFAULT_FS_URI"] == ""
    # Job variables reach every role; only the master role set its own SHARED.
    assert env["SHARED"] == "job"


def test_job_and_role_env_cannot_replace_system_variables() -> None:
    spec, tasks = two_role_job()
    env = build_task_env(spec, tasks, "master", 0, attempt=1, job_id="j")
    assert env["PAI_JOB_NAME"] == "mnist-dist"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_label_without_assigned_ports_is_empty_not_missing() -> None:
    spec, tasks = two_role_job()
    tasks[0] = tasks[0].model_copy(update={"ports": []})
    env = build_task_env(spec, tasks, "master", 0, attempt=1, job_id="j")
    assert env["PAI_CONTAINER_HOST_jupyter_PORT_LIST"] == ""
    assert "PAI_PORT_LIST_master_0_jupyter" not in env


def test_several_gpus_are_comma_joined() -> None:
    spec, tasks = two_role_job()
    tasks[0] = tasks[0].model_copy(update={"gpu_indices": [0, 2]})
    assert build_task_env(spec, tasks, "master", 0, 1, "j")["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_resource_string_formats_fractions_and_integers() -> None:
    role = RoleSpec(
        name="r", command="x", resources=Resources(gpu=0.5, cpu=4.0, memory_mb=100, shm_mb=0)
    )
    assert resource_string(role) == "0.5,4,100,0"


def test_unknown_task_is_an_error() -> None:
    spec, tasks = two_role_job()
    with pytest.raises(KeyError):
        build_task_env(spec, tasks, "worker", 7, 1, "j")


def test_openpai_back_compatible_and_runtime_aliases() -> None:
    spec, tasks = two_role_job()
    spec = spec.model_copy(update={"queue": "vc1", "data_dir": "hdfs://d", "code_dir": None})
    tasks[1] = tasks[1].model_copy(
        update={
            "ports": [
                PortAssignment(label="http", ports=[21000]),
                PortAssignment(label="ssh", ports=[22000]),
            ]
        }
    )
    env = build_task_env(spec, tasks, "worker", 0, attempt=1, job_id="j")
    expected = {
        # rest-server runtime-env.js (job level and its backward compatibility block)
        "PAI_FRAMEWORK_NAME": "alice~mnist-dist",
        "PAI_VIRTUAL_CLUSTER": "vc1",
        "PAI_USERNAME": "alice",
        "PAI_TASKS_NUM": "3",
        "PAI_JOB_TASK_COUNT": "3",
        "PAI_TASK_ROLES_NUM": "2",
        "PAI_JOB_TASK_ROLE_COUNT": "2",
        "PAI_JOB_TASK_ROLE_LIST": "master,worker",
        "PAI_TASK_INDEX": "0",
        # the yarn-era container script's backward compatibility block
        "PAI_TASK_ROLE_NAME": "worker",
        "PAI_TASK_ROLE_INDEX": "0",
        "PAI_TASK_ROLE_NUM": "2",
        "PAI_CURRENT_TASK_ROLE_TASK_COUNT": "2",
        "PAI_TASK_CPU_NUM": "2.5",
        "PAI_CURRENT_TASK_ROLE_CPU_COUNT": "2.5",
        "PAI_TASK_MEM_MB": "4096",
        "PAI_CURRENT_TASK_ROLE_MEM_MB": "4096",
        "PAI_TASK_GPU_NUM": "0",
        "PAI_CURRENT_TASK_ROLE_GPU_COUNT": "0",
        "PAI_CURRENT_TASK_ROLE_SHM_MB": "128",
        "PAI_CURRENT_TASK_ROLE_MIN_FAILED_TASK_COUNT": "",
        "PAI_CURRENT_TASK_ROLE_MIN_SUCCEEDED_TASK_COUNT": "",
        "PAI_RESOURCE": "0,2.5,4096,128",
        "PAI_DATA_DIR": "hdfs://d",
        "PAI_OUTPUT_DIR": "",
        "PAI_CODE_DIR": "",
        # openpai-runtime framework_parser.py
        "PAI_CURRENT_CONTAINER_IP": "10.0.0.2",
        "PAI_CURRENT_CONTAINER_PORT": "21000",
        "PAI_CONTAINER_HOST_PORT": "21000",
        "PAI_CONTAINER_SSH_PORT": "22000",
        "PAI_CONTAINER_HOST_PORT_LIST": "http:21000;ssh:22000;",
        "PAI_TASK_ROLE_INSTANCES": "master:0,worker:0,worker:1",
        "PAI_TASK_ROLE_master_HOST_LIST": "10.0.0.1",
        "PAI_TASK_ROLE_worker_HOST_LIST": "10.0.0.2:21000,10.0.0.2:21001",
        "PAI_master_0_ssh_PORT": "20002,20003",
        "PAI_master_0_jupyter_PORT": "20001",
        "PAI_worker_0_http_PORT": "21000",
        "PAI_worker_0_ssh_PORT": "22000",
        "PAI_worker_1_http_PORT": "21001",
    }
    assert {k: env.get(k) for k in expected} == expected
    # The seed's own names are unchanged next to their aliases.
    assert env["PAI_CURRENT_TASK_ROLE_NAME"] == "worker"
    assert env["PAI_CONTAINER_HOST_http_PORT_LIST"] == "21000"


def test_a_task_without_http_or_ssh_ports_gets_empty_port_aliases() -> None:
    spec, tasks = two_role_job()
    env = build_task_env(spec, tasks, "master", 0, attempt=1, job_id="j")
    assert env["PAI_CURRENT_CONTAINER_PORT"] == "" and env["PAI_CONTAINER_SSH_PORT"] == "20002"
    assert env["PAI_CONTAINER_HOST_PORT_LIST"] == "jupyter:20001;ssh:20002,20003;"


def test_job_env_cannot_replace_an_alias() -> None:
    spec, tasks = two_role_job()
    spec = spec.model_copy(update={"env": [EnvVar(name="PAI_TASK_INDEX", value="9")]})
    assert build_task_env(spec, tasks, "worker", 1, 1, "j")["PAI_TASK_INDEX"] == "1"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo <% $secrets.token %>", "echo s3cr3t"),
        ("echo <%$secrets.token%>;<%   $secrets.token   %>", "echo s3cr3t;s3cr3t"),
        ("login <% $secrets.db.user %>:<% $secrets.list[1] %>", "login root:b"),
        ("echo <% $secrets.unknown %>", "echo <% $secrets.unknown %>"),
        ("echo <% $parameters.token %>", "echo <% $parameters.token %>"),
        ("no references", "no references"),
    ],
)
def test_substitute_secrets(command: str, expected: str) -> None:
    secrets = {"token": "s3cr3t", "db.user": "root", "list.0": "a", "list.1": "b"}
    assert substitute_secrets(command, secrets) == expected


def test_substitute_secrets_without_secrets_leaves_the_command() -> None:
    assert substitute_secrets("echo <% $secrets.x %>", {}) == "echo <% $secrets.x %>"


def test_substituting_secrets_stops_at_the_bound_before_building_the_line() -> None:
    command = "<% $secrets.a %>" * 1000
    assert len(substitute_secrets(command, {"a": "x" * 4000})) == 4_000_000
    with pytest.raises(TooLong):
        substitute_secrets(command, {"a": "x" * 5000})


def test_a_secret_value_is_not_re_expanded() -> None:
    # A value that itself looks like a reference is inserted as it is.
    assert (
        substitute_secrets("<% $secrets.a %>", {"a": "<% $secrets.b %>", "b": "x"})
        == "<% $secrets.b %>"
    )


def test_openpai_directories_name_the_default_file_system_as_openpai_fills_it_in() -> None:
    spec, tasks = two_role_job()
    spec = spec.model_copy(
        update={
            "data_dir": "$PAI_DEFAULT_FS_URI/data/${PAI_USER_NAME}",
            "code_dir": "hdfs://x/code",
        }
    )
    env = build_task_env(spec, tasks, "master", 0, 1, "job-1", default_fs_uri="hdfs://nn:9000")
    assert env["PAI_DATA_DIR"] == f"hdfs://nn:9000/data/{spec.user}"
    assert env["PAI_CODE_DIR"] == "hdfs://x/code"
    # outputDir not given: $PAI_DEFAULT_FS_URI/Output/$jobName.
    assert env["PAI_OUTPUT_DIR"] == f"hdfs://nn:9000/Output/{spec.name}"
    # $PAI_USERNAME too (OpenPAI's own TensorFlow example writes it), and only as a word.
    spec = spec.model_copy(
        update={"code_dir": "$PAI_DEFAULT_FS_URI/$PAI_USERNAME/x/$PAI_USERNAMES"}
    )
    env = build_task_env(spec, tasks, "master", 0, 1, "job-1", default_fs_uri="hdfs://nn:9000")
    assert env["PAI_CODE_DIR"] == f"hdfs://nn:9000/{spec.user}/x/$PAI_USERNAMES"
    # No default file system configured: nothing made up.
    bare = build_task_env(spec.model_copy(update={"output_dir": None}), tasks, "master", 0, 1, "j")
    assert bare["PAI_OUTPUT_DIR"] == "" and bare["PAI_DATA_DIR"] == f"/data/{spec.user}"
