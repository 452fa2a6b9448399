"""Each framework's variables and commands (domain/frameworks.py): TF_CONFIG as Kubeflow's
TFJob writes it; MASTER_*/RANK/torchrun's PET_* for PyTorch, DeepSpeed and ColossalAI;
the tracker's DMLC_* for XGBoost with the tracker next to rank 0; MPI's hostfile with
slots and the task that runs mpirun (Kubeflow's Launcher, Volcano's master, T9k's
worker 0)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard_common.dialects.dlc import translate_dlc
from trainyard_common.dialects.t9k import translate_t9k
from trainyard_common.dialects.ti import translate_ti
from trainyard_common.events import PortAssignment, TaskPlacement
from trainyard_common.jobspec import (
    MPI_IMPLEMENTATION_ENV,
    EnvVar,
    JobKind,
    JobSpec,
    PortSpec,
    Resources,
    RoleSpec,
    env_list,
)
from trainyard_launcher import frameworkwrap
from trainyard_launcher.adapters.rendezvous import reserve_port
from trainyard_launcher.domain.env import build_task_env
from trainyard_launcher.domain.frameworks import (
    FrameworkContext,
    framework_command,
    framework_env,
    mpi_layout,
    port_to_reserve,
    tf_config,
    uses_hydra,
)
from trainyard_launcher.domain.pods import mpi_hostfile


def role(name: str, replicas: int, ports: list[PortSpec] | None = None) -> RoleSpec:
    return RoleSpec(
        name=name,
        replicas=replicas,
        command="python train.py",
        ports=[PortSpec(label="tfport")] if ports is None else ports,
    )


def place(
    name: str, index: int, port: int | None, host: str = "10.0.0.1", label: str = "tfport"
) -> TaskPlacement:
    ports = [PortAssignment(label=label, ports=[port])] if port is not None else []
    return TaskPlacement(role=name, index=index, node="n1", host_ip=host, ports=ports)


def tf_job() -> tuple[JobSpec, list[TaskPlacement]]:
    spec = JobSpec(
        name="tf",
        kind=JobKind.TENSORFLOW,
        roles=[role("Chief", 1), role("Worker", 2), role("PS", 1), role("Evaluator", 1)],
    )
    tasks = [
        place("Worker", 1, 2002, host="10.0.0.2"),
        place("Worker", 0, 2001),
        place("Chief", 0, 2000),
        place("PS", 0, 2003, host="10.0.0.3"),
        place("Evaluator", 0, 2004),
    ]
    return spec, tasks


def test_every_task_gets_the_same_cluster_and_its_own_task() -> None:
    spec, tasks = tf_job()
    cluster = {
        "chief": ["10.0.0.1:2000"],
        "worker": ["10.0.0.1:2001", "10.0.0.2:2002"],
        "ps": ["10.0.0.3:2003"],
    }
    for t in tasks:
        config = json.loads(framework_env(spec, tasks, t.role, t.index)["TF_CONFIG"])
        assert config["cluster"] == cluster
        assert config["task"] == {"type": t.role.lower(), "index": t.index}


def test_the_evaluator_is_a_task_but_not_in_the_cluster() -> None:
    spec, tasks = tf_job()
    config = json.loads(tf_config(spec, tasks, "Evaluator", 0) or "")
    assert "evaluator" not in config["cluster"]
    assert config["task"] == {"type": "evaluator", "index": 0}


def test_master_is_kept_as_master() -> None:
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[role("master", 1), role("worker", 1)])
    tasks = [place("master", 0, 3000), place("worker", 0, 3001)]
    config = json.loads(tf_config(spec, tasks, "master", 0) or "")
    assert config == {
        "cluster": {"master": ["10.0.0.1:3000"], "worker": ["10.0.0.1:3001"]},
        "task": {"type": "master", "index": 0},
        "environment": "cloud",
    }


def test_tfport_wins_over_other_ports_and_any_port_will_do() -> None:
    spec = JobSpec(
        name="tf",
        kind=JobKind.TENSORFLOW,
        roles=[
            role("worker", 1, ports=[PortSpec(label="http"), PortSpec(label="tfport")]),
            role("ps", 1, ports=[PortSpec(label="grpc")]),
        ],
    )
    tasks = [
        TaskPlacement(
            role="worker",
            index=0,
            node="n1",
            host_ip="h",
            ports=[
                PortAssignment(label="http", ports=[80]),
                PortAssignment(label="tfport", ports=[81]),
            ],
        ),
        place("ps", 0, 90, host="h", label="grpc"),
    ]
    assert json.loads(tf_config(spec, tasks, "ps", 0) or "")["cluster"] == {
        "worker": ["h:81"],
        "ps": ["h:90"],
    }


def test_no_tf_config_when_a_task_has_no_port() -> None:
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[role("worker", 2, ports=[])])
    tasks = [place("worker", 0, None), place("worker", 1, None)]
    assert framework_env(spec, tasks, "worker", 0) == {}


def test_a_tensorflow_job_of_one_task_gets_no_tf_config() -> None:
    # Kubeflow's operator writes none for a job of one task (isDistributed): TensorFlow
    # 1.x's estimators refuse a cluster without a chief, and a lone worker trains
    # locally. A default TI job (one worker) on a tia runtime crashed so (found in review).
    spec = JobSpec(name="tf", kind=JobKind.TENSORFLOW, roles=[role("worker", 1)])
    assert framework_env(spec, [place("worker", 0, 3000)], "worker", 0) == {}
    two = spec.model_copy(update={"roles": [role("worker", 2)]})
    tasks = [place("worker", 0, 3000), place("worker", 1, 3001)]
    assert "TF_CONFIG" in framework_env(two, tasks, "worker", 1)


def test_other_kinds_get_no_tf_config() -> None:
    spec, tasks = tf_job()
    generic = spec.model_copy(update={"kind": JobKind.GENERIC})
    assert framework_env(generic, tasks, "Worker", 0) == {}


def test_build_task_env_carries_tf_config_and_the_job_cannot_forge_it() -> None:
    translated = translate_ti(
        {
            "name": "n",
            "cluster": "c",
            "command": ["true"],
            "workerCount": 2,
            "parameterServerCount": 1,
        }
    )
    spec = translated.spec.model_copy(update={"env": [EnvVar(name="TF_CONFIG", value="forged")]})
    tasks = [place("worker", 0, 4000), place("worker", 1, 4001), place("ps", 0, 4002)]
    env = build_task_env(spec, tasks, "worker", 1, attempt=1, job_id="j")
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.0.1:4000", "10.0.0.1:4001"], "ps": ["10.0.0.1:4002"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    assert env["PAI_CONTAINER_HOST_tfport_PORT_LIST"] == "4001"


def test_the_ti_translation_asks_placement_for_a_tf_port_per_role() -> None:
    spec = translate_ti(
        {
            "name": "n",
            "cluster": "c",
            "command": ["true"],
            "workerCount": 2,
            "parameterServerCount": 1,
            "masterType": "1U2G0P",
        }
    ).spec
    assert {r.name: [p.label for p in r.ports] for r in spec.roles} == {
        "worker": ["tfport"],
        "ps": ["tfport"],
        "master": ["tfport"],
    }


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("translate", "example"),
    [
        # The seed's CreateJob body (a trailing comma: not strict JSON; YAML reads it).
        (translate_dlc, "dlc/createjob-tensorflow-gpu.seed.txt"),
        (translate_t9k, "t9k/tensorflowtrainingjob-1.yaml"),
    ],
)
def test_dlc_and_t9k_tensorflow_jobs_get_tf_config_on_every_task(
    translate: Any, example: str
) -> None:
    """Their TensorFlow jobs declare no ports, yet DLC and T9k give every node
    TF_CONFIG: each role asks placement for a port, as TI's and Kubeflow's do."""
    translated = translate(yaml.safe_load((EXAMPLES / example).read_text()))
    assert not translated.errors, translated.errors
    spec = translated.spec
    assert spec.kind is JobKind.TENSORFLOW
    ports = iter(range(5000, 5100))
    # What placement does: a port for each port a role declares, none where it has none.
    tasks = [
        place(
            r.name, i, next(ports) if r.ports else None, label=r.ports[0].label if r.ports else ""
        )
        for r in spec.roles
        for i in range(r.replicas)
    ]
    for task in tasks:
        env = build_task_env(spec, tasks, task.role, task.index, attempt=1, job_id="j")
        config = json.loads(env["TF_CONFIG"])
        assert sum(len(a) for a in config["cluster"].values()) == len(tasks)
        assert config["task"] == {"type": task.role.lower(), "index": task.index}
        assert config["environment"] == "cloud"


# ---------------------------------------------------------------- PyTorch and friends


def ctx(
    task_dir: str = "/data/jobs/j/attempt-1/master-0", port: int | None = None
) -> FrameworkContext:
    # The local backend's layout: a task's framework files in its directory's fw/.
    return FrameworkContext(files_dir=f"{task_dir}/fw", python="/venv/bin/python", master_port=port)


def torch_job(
    kind: JobKind = JobKind.PYTORCH, master_ports: list[PortSpec] | None = None
) -> tuple[JobSpec, list[TaskPlacement]]:
    spec = JobSpec(
        name="ddp",
        kind=kind,
        roles=[
            role("worker", 2, ports=[]),
            role(
                "master",
                1,
                ports=[PortSpec(label="pytorchjob-port")] if master_ports is None else master_ports,
            ),
        ],
    )
    tasks = [
        place("worker", 1, None, host="10.0.0.3"),
        place("worker", 0, None, host="10.0.0.2"),
        place("master", 0, 23456, label="pytorchjob-port"),
    ]
    return spec, tasks


def test_torch_tasks_rank_the_master_first_and_share_its_address() -> None:
    spec, tasks = torch_job()
    envs = {(t.role, t.index): framework_env(spec, tasks, t.role, t.index) for t in tasks}
    assert {k: e["RANK"] for k, e in envs.items()} == {
        ("master", 0): "0",
        ("worker", 0): "1",
        ("worker", 1): "2",
    }
    for env in envs.values():
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"]) == (
            "10.0.0.1",
            "23456",
            "3",
        )
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"], env["PET_NNODES"]) == (
            "10.0.0.1",
            "23456",
            "3",
        )
        assert env["PET_NODE_RANK"] == env["RANK"]
        assert env["LOCAL_RANK"] == "0"
        # No rendezvous options: `torchrun --standalone` on any task, and a command's
        # own --master_addr/--master_port, must keep working (torchrun takes
        # PET_RDZV_ENDPOINT over --master_addr, and an explicit is_host=false makes a
        # standalone agent a client of a store no one hosts). T9k's torchrunConfig
        # names its c10d endpoint on the command line (tests/unit/test_dialect_t9k.py).
        assert not {k for k in env if k.startswith("PET_RDZV_")}, env


def test_nproc_per_node_is_the_tasks_gpu_count() -> None:
    spec, tasks = torch_job(JobKind.DEEPSPEED)
    spec.roles[0].resources = Resources(gpu=4)
    worker, master = (framework_env(spec, tasks, r, 0) for r in ("worker", "master"))
    assert (worker["PET_NPROC_PER_NODE"], worker["NPROC_PER_NODE"]) == ("4", "4")
    assert (master["PET_NPROC_PER_NODE"], master["NPROC_PER_NODE"]) == ("1", "1")


def test_without_a_declared_port_the_reserved_one_is_used_and_none_is_made_up() -> None:
    spec, tasks = torch_job(JobKind.COLOSSALAI, master_ports=[])
    tasks[2] = place("master", 0, None)
    assert port_to_reserve(spec, tasks) == tasks[2]
    assert framework_env(spec, tasks, "worker", 1) == {}
    env = framework_env(spec, tasks, "worker", 1, ctx(port=40001))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"]) == ("10.0.0.1", "40001", "2")


def test_a_declared_port_needs_no_reservation_and_other_kinds_none_at_all() -> None:
    spec, tasks = torch_job()
    assert port_to_reserve(spec, tasks) is None
    generic = spec.model_copy(update={"kind": JobKind.GENERIC})
    assert port_to_reserve(generic, [place("worker", 0, None)]) is None
    assert framework_env(generic, tasks, "master", 0, ctx(port=1)) == {}


def test_workers_only_make_worker_0_the_master() -> None:
    spec = JobSpec(name="ds", kind=JobKind.DEEPSPEED, roles=[role("worker", 2, ports=[])])
    tasks = [place("worker", 1, None, host="10.0.0.9"), place("worker", 0, None, host="10.0.0.8")]
    assert port_to_reserve(spec, tasks) == tasks[1]
    env = framework_env(spec, tasks, "worker", 1, ctx(port=29500))
    assert (env["MASTER_ADDR"], env["RANK"], env["WORLD_SIZE"]) == ("10.0.0.8", "1", "2")


def test_elastic_roles_rendezvous_over_c10d_at_the_master() -> None:
    spec = JobSpec(
        name="elastic",
        kind=JobKind.PYTORCH,
        roles=[
            RoleSpec(name="worker", replicas=2, min_replicas=1, max_replicas=4, command="train")
        ],
    )
    tasks = [place("worker", 0, None), place("worker", 1, None, host="10.0.0.2")]
    first = framework_env(spec, tasks, "worker", 0, ctx(port=29400))
    second = framework_env(spec, tasks, "worker", 1, ctx(port=29400))
    for env in (first, second):
        assert (
            env["PET_RDZV_BACKEND"],
            env["PET_RDZV_ENDPOINT"],
            env["PET_RDZV_ID"],
            env["PET_NNODES"],
        ) == ("c10d", "10.0.0.1:29400", "elastic", "1:4")
        assert "PET_NODE_RANK" not in env
    assert (first["PET_RDZV_CONF"], second["PET_RDZV_CONF"]) == ("is_host=true", "is_host=false")


def test_the_job_cannot_forge_the_rank() -> None:
    spec, tasks = torch_job()
    spec = spec.model_copy(update={"env": [EnvVar(name="RANK", value="7")]})
    env = build_task_env(spec, tasks, "worker", 0, attempt=1, job_id="j")
    assert env["RANK"] == "1"


def test_the_reserved_port_is_chosen_once_per_attempt(tmp_path: Path) -> None:
    first = reserve_port(tmp_path / "attempt-1", "127.0.0.1")
    assert reserve_port(tmp_path / "attempt-1", "127.0.0.1") == first
    assert (tmp_path / "attempt-1" / "master-port").read_text().strip() == str(first)
    assert 0 < first < 65536


# ----------------------------------------------------------------------------- XGBoost


def xgb_job() -> tuple[JobSpec, list[TaskPlacement]]:
    spec = JobSpec(
        name="xgb",
        kind=JobKind.XGBOOST,
        roles=[role("master", 1, ports=[]), role("worker", 2, ports=[])],
    )
    tasks = [
        place("master", 0, None),
        place("worker", 0, None, host="10.0.0.2"),
        place("worker", 1, None, host="10.0.0.3"),
    ]
    return spec, tasks


def test_xgboost_workers_get_the_trackers_address_and_their_task_ids() -> None:
    spec, tasks = xgb_job()
    env = framework_env(spec, tasks, "worker", 1, ctx(port=9091))
    assert {k: v for k, v in env.items() if k.startswith("DMLC_")} == {
        "DMLC_TRACKER_URI": "10.0.0.1",
        "DMLC_TRACKER_PORT": "9091",
        "DMLC_NUM_WORKER": "3",
        "DMLC_NUM_SERVER": "0",
        "DMLC_TASK_ID": "2",
        "DMLC_ROLE": "worker",
    }
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["WORLD_SIZE"]) == (
        "10.0.0.1",
        "9091",
        "2",
        "3",
    )
    assert env["WORKER_ADDRS"] == "10.0.0.2,10.0.0.3"


def test_rank_0_runs_the_tracker_around_its_command_and_the_others_run_theirs() -> None:
    spec, tasks = xgb_job()
    wrapped = framework_command(spec, tasks, "master", 0, "python train.py", ctx(port=9091))
    # The command travels in a variable: on the wrapper's command line `ps` would show it.
    assert shlex.split(wrapped) == [
        "TRAINYARD_WRAPPED_COMMAND=python train.py",
        "exec",
        "/venv/bin/python",
        "-I",
        "-m",
        "trainyard_launcher.frameworkwrap",
        "xgboost-tracker",
        "--dir",
        "/data/jobs/j/attempt-1/master-0/fw",
        "--workers",
        "3",
        "--host",
        "10.0.0.1",
        "--port",
        "9091",
    ]
    assert (
        framework_command(spec, tasks, "worker", 0, "python train.py", ctx(port=9091))
        == "python train.py"
    )
    # Where the helper is a script the task's user can read, it runs by its path.
    scripted = dataclasses.replace(ctx(port=9091), wrapper="/data/bin/frameworkwrap.py")
    words = shlex.split(framework_command(spec, tasks, "master", 0, "true", scripted))
    assert words[2:6] == ["/venv/bin/python", "-I", "/data/bin/frameworkwrap.py", "xgboost-tracker"]


# --------------------------------------------------------------------------------- MPI


def mpi_job(launcher: str | None = "launcher") -> tuple[JobSpec, list[TaskPlacement]]:
    roles = [role("worker", 2, ports=[])]
    roles[0].resources = Resources(gpu=2)
    tasks = [place("worker", 0, None), place("worker", 1, None)]
    if launcher is not None:
        roles.insert(0, role(launcher, 1, ports=[]))
        tasks.append(place(launcher, 0, None))
    return JobSpec(name="mpi", kind=JobKind.MPI, roles=roles), tasks


def test_the_hostfile_lists_every_worker_with_its_slots() -> None:
    spec, tasks = mpi_job()
    layout = mpi_layout(spec, tasks)
    assert layout is not None and layout.launcher == ("launcher", 0)
    assert layout.hostfile() == "worker-0 slots=2\nworker-1 slots=2\n"


def test_the_launcher_gets_the_agent_and_every_task_the_hostfile() -> None:
    spec, tasks = mpi_job()
    launcher = framework_env(spec, tasks, "launcher", 0, ctx("/a/attempt-1/launcher-0"))
    worker = framework_env(spec, tasks, "worker", 1, ctx("/a/attempt-1/worker-1"))
    assert launcher["OMPI_MCA_orte_default_hostfile"] == "/a/attempt-1/launcher-0/fw/hostfile"
    assert launcher["OMPI_MCA_plm_rsh_agent"] == "/a/attempt-1/launcher-0/fw/mpi-agent"
    assert (launcher["MPI_HOST"], launcher["K_MPI_JOB_ROLE"]) == ("worker-0,worker-1", "launcher")
    assert worker["OMPI_MCA_orte_default_hostfile"] == "/a/attempt-1/worker-1/fw/hostfile"
    assert "OMPI_MCA_plm_rsh_agent" not in worker and worker["K_MPI_JOB_ROLE"] == "worker"


def test_the_launcher_runs_mpirun_and_workers_wait_for_it() -> None:
    spec, tasks = mpi_job()
    launcher = shlex.split(
        framework_command(
            spec, tasks, "launcher", 0, "mpirun -np 4 ./prog", ctx("/a/attempt-1/launcher-0")
        )
    )
    assert launcher[0] == "TRAINYARD_WRAPPED_COMMAND=mpirun -np 4 ./prog"
    assert launcher[6:] == [
        "mpi-launcher",
        "--dir",
        "/a/attempt-1/launcher-0/fw",
        "--hosts",
        "worker-0=2,worker-1=2",
        "--attempt-dir",
        "/a/attempt-1",
    ]
    worker = shlex.split(
        framework_command(
            spec, tasks, "worker", 0, "/usr/sbin/sshd -De", ctx("/a/attempt-1/worker-0")
        )
    )
    assert worker[0] == "exec"  # the worker's own command is not run: see docs/frameworks.md
    assert worker[5:] == [
        "mpi-worker",
        "--dir",
        "/a/attempt-1/worker-0/fw",
        "--hosts",
        "worker-0=2,worker-1=2",
        "--until",
        "/a/attempt-1/launcher-0/exit.json",
    ]


def test_intel_mpi_and_mpich_get_hydras_hostfile_form(tmp_path: Path) -> None:
    spec, tasks = mpi_job()
    spec = spec.model_copy(update={"env": env_list({MPI_IMPLEMENTATION_ENV: "MPICH"})})
    words = shlex.split(
        framework_command(spec, tasks, "launcher", 0, "mpirun ./prog", ctx("/a/attempt-1/l-0"))
    )
    assert words[words.index("--hostfile-format") + 1] == "hydra"
    assert uses_hydra(spec) and not uses_hydra(mpi_job()[0])
    # On Kubernetes, the hostfile of the attempt's ConfigMap.
    assert mpi_hostfile([("w-0.svc", 2)], hydra=True) == "w-0.svc:2\n"
    assert mpi_hostfile([("w-0.svc", 2)]) == "w-0.svc slots=2\n"
    # The wrapper writes what it is told.
    frameworkwrap._mpi_files(tmp_path, [("worker-0", 2)], hydra=True)
    assert (tmp_path / "hostfile").read_text() == "worker-0:2\n"
    frameworkwrap._mpi_files(tmp_path, [("worker-0", 2)])
    assert (tmp_path / "hostfile").read_text() == "worker-0 slots=2\n"
    # OpenMPI (the default) keeps Open MPI's form.
    plain = shlex.split(
        framework_command(mpi_job()[0], tasks, "launcher", 0, "mpirun", ctx("/a/attempt-1/l-0"))
    )
    assert "--hostfile-format" not in plain


def test_volcanos_master_role_is_the_mpi_launcher() -> None:
    spec, tasks = mpi_job(launcher="master")
    layout = mpi_layout(spec, tasks)
    assert layout is not None and layout.launcher == ("master", 0)
    assert [h[:2] for h in layout.hosts] == [("worker", 0), ("worker", 1)]


def test_a_t9k_mpijob_has_worker_0_run_its_cmd_under_mpirun_over_all_workers() -> None:
    spec = translate_t9k(
        {
            "apiVersion": "batch.tensorstack.dev/v1beta1",
            "kind": "MPIJob",
            "metadata": {"name": "walk"},
            "spec": {
                "worker": {
                    "replicas": 2,
                    "cmd": ["./random_walk", "20"],
                    "template": {"spec": {"containers": [{"name": "mpi-worker", "image": "mpi"}]}},
                }
            },
        }
    ).spec
    tasks = [place("worker", 0, None), place("worker", 1, None)]
    first = shlex.split(
        framework_command(
            spec, tasks, "worker", 0, spec.roles[0].command, ctx("/a/attempt-1/worker-0")
        )
    )
    assert first[0] == "TRAINYARD_WRAPPED_COMMAND=mpirun bash -c './random_walk 20'"
    assert first[6:] == [
        "mpi-launcher",
        "--dir",
        "/a/attempt-1/worker-0/fw",
        "--hosts",
        "worker-0=1,worker-1=1",
        "--attempt-dir",
        "/a/attempt-1",
    ]
    second = shlex.split(
        framework_command(
            spec, tasks, "worker", 1, spec.roles[0].command, ctx("/a/attempt-1/worker-1")
        )
    )
    assert second[-2:] == ["--until", "/a/attempt-1/worker-0/exit.json"]


def test_a_t9k_mpijobs_extra_mpi_args_go_on_the_mpirun_line() -> None:
    spec = translate_t9k(
        {
            "apiVersion": "batch.tensorstack.dev/v1beta1",
            "kind": "MPIJob",
            "metadata": {"name": "walk"},
            "spec": {
                "mca": {"btl": "^openib"},
                "worker": {
                    "replicas": 2,
                    "cmd": ["./random_walk", "20"],
                    "extraMPIArgs": ["-bind-to", "none", "--mca", "pml", "ob1 x"],
                    "template": {"spec": {"containers": [{"name": "mpi-worker", "image": "mpi"}]}},
                },
            },
        }
    ).spec
    tasks = [place("worker", 0, None), place("worker", 1, None)]
    first = shlex.split(
        framework_command(
            spec, tasks, "worker", 0, spec.roles[0].command, ctx("/a/attempt-1/worker-0")
        )
    )
    wrapped = first[0].removeprefix("TRAINYARD_WRAPPED_COMMAND=")
    assert shlex.split(wrapped) == [
        "mpirun",
        "-bind-to",
        "none",
        "--mca",
        "pml",
        "ob1 x",
        "bash",
        "-c",
        "./random_walk 20",
    ]


@pytest.mark.parametrize("host", ["../other-job/attempt-1/worker-0", "a/b", "..", ""])
def test_the_mpi_agent_refuses_a_host_outside_the_attempt(tmp_path: Path, host: str) -> None:
    from trainyard_launcher.frameworkwrap import mpi_rsh

    # A saved environment the agent must never reach from this attempt.
    outside = tmp_path / "other-job" / "attempt-1" / "worker-0"
    (outside / "fw").mkdir(parents=True)
    (outside / "fw" / "mpi-env.json").write_text('{"cwd": "/", "env": {"SECRET": "x"}}')
    attempt = tmp_path / "job" / "attempt-1"
    attempt.mkdir(parents=True)
    assert mpi_rsh(["--attempt-dir", str(attempt), host, "true"]) == 255


def test_paddle_and_jax_get_their_rendezvous_as_kubeflow_writes_it() -> None:
    paddle = JobSpec(
        name="pd",
        kind=JobKind.PADDLE,
        roles=[role("Worker", 2, [PortSpec(label="master")])],
    )
    tasks = [
        place("Worker", 1, 37001, host="10.0.0.2", label="master"),
        place("Worker", 0, 37000, label="master"),
    ]
    env = framework_env(paddle, tasks, "Worker", 1)
    assert env["PADDLE_MASTER"] == "10.0.0.1:37000" and env["PADDLE_NNODES"] == "2"
    assert env["PADDLE_JOB_ID"] == "pd" and "PADDLE_TRAINER_NUM" not in env
    server = JobSpec(
        name="ps",
        kind=JobKind.PADDLE,
        roles=[role("Master", 1, [PortSpec(label="master")]), role("Worker", 1, [])],
    )
    placed = [place("Master", 0, 36543, label="master"), place("Worker", 0, None)]
    assert framework_env(server, placed, "Master", 0)["PADDLE_SERVER_NUM"] == "1"
    assert framework_env(server, placed, "Worker", 0)["PADDLE_TRAINER_NUM"] == "1"
    assert framework_env(server, placed, "Worker", 0)["PADDLE_MASTER"] == "10.0.0.1:36543"
    jax = JobSpec(
        name="jx", kind=JobKind.JAX, roles=[role("Worker", 3, [PortSpec(label="jaxjob-port")])]
    )
    workers = [
        place("Worker", i, 6666 + i, host=f"10.0.0.{i + 1}", label="jaxjob-port") for i in range(3)
    ]
    env = framework_env(jax, workers, "Worker", 2)
    assert (env["COORDINATOR_ADDRESS"], env["COORDINATOR_PORT"]) == ("10.0.0.1", "6666")
    assert (env["NUM_PROCESSES"], env["PROCESS_ID"]) == ("3", "2")
