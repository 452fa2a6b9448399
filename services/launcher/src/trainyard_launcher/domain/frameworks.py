"""What a framework needs in a task's environment to find its peers, and how a task's
command is run for the frameworks whose peers need a helper (docs/frameworks.md).

TensorFlow: ``TF_CONFIG``, as TensorFlow's ``TFConfigClusterResolver`` reads it and as
Kubeflow's TFJob writes it::

    {"cluster": {"chief": [...], "master": [...], "ps": [...], "worker": ["host:port", ...]},
     "task": {"type": "worker", "index": 1}}

Kubeflow's replica types ``Chief``, ``Master``, ``PS``, ``Worker`` and ``Evaluator`` are
the lower-cased role name; the evaluator gets a task but is not in the cluster (it talks
to no one). Other role names keep their lower-cased name as their TF job name.

Each address is the task's host and a port placement assigned it: the port labelled
``tfport`` (what the TI dialect asks for), else the first port the role declares. A job
with a task that has no port gets no ``TF_CONFIG`` at all: a cluster spec with a made-up
port would point peers at nothing, and a single-task job needs none.

PyTorch, DeepSpeed, ColossalAI: ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK``
(Kubeflow's PyTorchJob, Volcano's pytorch plugin) plus ``LOCAL_RANK`` and torchrun's
``PET_*`` options. XGBoost: the Rabit tracker's ``DMLC_*`` (and Kubeflow XGBoostJob's
``MASTER_*``, ``WORKER_*``), with the tracker run by task 0's wrapper. MPI: a hostfile
with slots, and a launcher task that runs ``mpirun`` whose remote starts reach the
worker tasks through an rsh agent (:mod:`trainyard_launcher.frameworkwrap`).

The rendezvous (master) task's port is one placement gave it when its role declares one;
otherwise the launcher reserves one for the attempt (``FrameworkContext.master_port``)
and every task of the attempt is told the same value.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import (
    MPI_IMPLEMENTATION_ENV,
    MPIRUN_ARGS_ENV,
    TF_PORT_LABEL,
    JobKind,
    JobSpec,
    RunMode,
    env_dict,
)

EVALUATOR = "evaluator"

# Kinds whose tasks meet at one task's address (MASTER_ADDR:MASTER_PORT).
TORCH_KINDS = frozenset({JobKind.PYTORCH, JobKind.DEEPSPEED, JobKind.COLOSSALAI})
RENDEZVOUS_KINDS = TORCH_KINDS | {JobKind.XGBOOST, JobKind.PADDLE, JobKind.JAX}
# Port labels read as the master's port, in this order: Kubeflow's container port names
# for PyTorchJob, XGBoostJob and JAXJob, then a plain "master" (PaddleJob's); else the
# task's first port.
MASTER_PORT_LABELS = ("pytorchjob-port", "xgboostjob-port", "jaxjob-port", "master")
# The role that hosts the rendezvous: Kubeflow's Master, TF's Chief; else the first role.
MASTER_ROLES = ("master", "chief")
# The role that runs mpirun: Kubeflow MPIJob's Launcher, Volcano's mpi plugin "master".
MPI_LAUNCHER_ROLES = ("launcher", "master")

WRAPPER_MODULE = "trainyard_launcher.frameworkwrap"
HOSTFILE = "hostfile"
# The MPI implementations whose launcher, Hydra, reads "host:slots" hostfiles.
HYDRA_IMPLEMENTATIONS = ("Intel", "MPICH")
RSH_AGENT = "mpi-agent"  # frameworkwrap writes both files under the same names
EXIT_FILE = "exit.json"  # what the task wrapper writes when the command ended
# Carries the wrapped command to frameworkwrap: an argument would show it (with its
# substituted secrets) in `ps` to every user of the node; a process's environment only
# its owner can read.
COMMAND_VAR = "TRAINYARD_WRAPPED_COMMAND"


@dataclass(frozen=True)
class FrameworkContext:
    """What the launcher knows about a task beyond the spec and the placement."""

    # Where the task's framework files are (the MPI hostfile), as the task sees it: on
    # the local backend the task's own ``fw`` directory, whose parent is the task's
    # directory and whose grandparent the attempt's, each task's named ``role-index``.
    files_dir: str
    # The interpreter that runs the helper (frameworkwrap), one the task's user may run;
    # None where the backend runs no helper next to the task (Kubernetes: the image
    # runs the command itself, and the framework gets only its variables and files).
    python: str | None
    # Reserved by the launcher for the attempt when the rendezvous task declares no port.
    master_port: int | None = None
    # The helper's script (trainyard_launcher/frameworkwrap.py, where the task can read it).
    wrapper: str | None = None


def tf_task_type(role: str) -> str:
    return role.lower()


def _address(task: TaskPlacement) -> str | None:
    ports = {a.label: a.ports for a in task.ports if a.ports}
    chosen = ports.get(TF_PORT_LABEL) or next(iter(ports.values()), None)
    return f"{task.host_ip}:{chosen[0]}" if chosen else None


def tf_config(spec: JobSpec, tasks: list[TaskPlacement], role: str, index: int) -> str | None:
    """The TF_CONFIG JSON of task ``role``/``index``; None when some task has no port,
    and for a job of one task, as Kubeflow's operator does (isDistributed): TensorFlow
    1.x's estimators refuse a cluster without a chief, and a lone task trains locally."""
    if sum(r.replicas for r in spec.roles) == 1:
        return None
    cluster: dict[str, list[str]] = {}
    # Roles in the spec's order, tasks by index: every task writes the same cluster.
    by_role = {
        r.name: sorted((t for t in tasks if t.role == r.name), key=lambda t: t.index)
        for r in spec.roles
    }
    for name, members in by_role.items():
        task_type = tf_task_type(name)
        if task_type == EVALUATOR:
            continue
        addresses = [_address(t) for t in members]
        if any(a is None for a in addresses):
            return None
        cluster.setdefault(task_type, []).extend(a for a in addresses if a is not None)
    # "environment": "cloud", as Kubeflow's operator and DLC write it: TensorFlow's
    # estimators read it to know the cluster is not a local one.
    task = {"type": tf_task_type(role), "index": index}
    config = {"cluster": cluster, "task": task, "environment": "cloud"}
    return json.dumps(config, separators=(",", ":"))


# --------------------------------------------------------------------- the rendezvous


def _role_named(spec: JobSpec, names: tuple[str, ...]) -> str | None:
    lowered = {r.name.lower(): r.name for r in spec.roles}
    return next((lowered[n] for n in names if n in lowered), None)


def ranked_tasks(spec: JobSpec, tasks: list[TaskPlacement]) -> list[TaskPlacement]:
    """Every task in rank order: the master role first (Kubeflow gives its Master rank
    0 and worker i rank i+1), then the other roles in the spec's order, by index."""
    master = _role_named(spec, MASTER_ROLES)
    order = [r.name for r in spec.roles]
    if master is not None:
        order.remove(master)
        order.insert(0, master)
    position = {name: i for i, name in enumerate(order)}
    known = [t for t in tasks if t.role in position]
    return sorted(known, key=lambda t: (position[t.role], t.index))


def rendezvous_task(spec: JobSpec, tasks: list[TaskPlacement]) -> TaskPlacement | None:
    """The task the others meet at (rank 0); None for kinds that have none."""
    if spec.kind not in RENDEZVOUS_KINDS:
        return None
    ranked = ranked_tasks(spec, tasks)
    return ranked[0] if ranked else None


def declared_port(task: TaskPlacement) -> int | None:
    ports = {a.label: a.ports[0] for a in task.ports if a.ports}
    for label in MASTER_PORT_LABELS:
        if label in ports:
            return ports[label]
    return next(iter(ports.values()), None)


def port_to_reserve(spec: JobSpec, tasks: list[TaskPlacement]) -> TaskPlacement | None:
    """The rendezvous task when the launcher must reserve its port (it declares none)."""
    master = rendezvous_task(spec, tasks)
    if master is None or declared_port(master) is not None:
        return None
    return master


def _master_port(
    spec: JobSpec, tasks: list[TaskPlacement], context: FrameworkContext | None
) -> tuple[TaskPlacement, int] | None:
    master = rendezvous_task(spec, tasks)
    if master is None:
        return None
    port = declared_port(master)
    if port is None and context is not None:
        port = context.master_port
    return (master, port) if port is not None else None


@dataclass(frozen=True)
class Rendezvous:
    """Where a task meets its peers: rank 0's task and port, and every task by rank."""

    master: TaskPlacement
    port: int
    ranked: list[TaskPlacement]
    rank: int  # this task's


def _rendezvous(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    context: FrameworkContext | None,
) -> Rendezvous | None:
    found = _master_port(spec, tasks, context)
    if found is None:
        return None
    ranked = ranked_tasks(spec, tasks)
    rank = next(i for i, t in enumerate(ranked) if t.role == role and t.index == index)
    return Rendezvous(found[0], found[1], ranked, rank)


def _is_elastic(spec: JobSpec) -> bool:
    return spec.run_mode is RunMode.ELASTIC or any(
        r.min_replicas is not None or r.max_replicas is not None for r in spec.roles
    )


def torch_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    context: FrameworkContext | None = None,
) -> dict[str, str]:
    """torch.distributed's env:// variables and torchrun's options (``PET_<OPTION>``,
    which torchrun reads for each of its command-line options), one node per task."""
    meet = _rendezvous(spec, tasks, role, index, context)
    if meet is None:
        return {}
    master, port, ranked, rank = meet.master, meet.port, meet.ranked, meet.rank
    current = spec.role(role)
    nproc = max(1, int(current.resources.gpu))
    env = {
        "MASTER_ADDR": master.host_ip,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(ranked)),
        "RANK": str(rank),
        # One process per task; torchrun sets its own children's LOCAL_RANK.
        "LOCAL_RANK": "0",
        "PET_MASTER_ADDR": master.host_ip,
        "PET_MASTER_PORT": str(port),
        "PET_NNODES": str(len(ranked)),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": str(nproc),
        # DLC's name for it (torchrun --nproc_per_node=$NPROC_PER_NODE in its examples).
        "NPROC_PER_NODE": str(nproc),
    }
    if _is_elastic(spec):
        low = sum(r.min_replicas if r.min_replicas is not None else r.replicas for r in spec.roles)
        high = sum(r.max_replicas if r.max_replicas is not None else r.replicas for r in spec.roles)
        is_master = master.role == role and master.index == index
        env.update(
            {
                "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ENDPOINT": f"{master.host_ip}:{port}",
                "PET_RDZV_ID": spec.name,
                # torchrun's --nnodes=MIN:MAX: the elastic range of the whole job.
                "PET_NNODES": f"{low}:{high}",
                # The master's agent hosts the c10d store. Only here: an explicit
                # is_host=false makes a non-master's `torchrun --standalone` (which
                # still reads it) a client of a store no one hosts, and an endpoint
                # set for every job would override a command's own --master_addr.
                "PET_RDZV_CONF": f"is_host={'true' if is_master else 'false'}",
            }
        )
        del env["PET_NODE_RANK"]  # the rendezvous assigns node ranks
    return env


def xgboost_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    context: FrameworkContext | None = None,
) -> dict[str, str]:
    """The Rabit tracker's DMLC_* (rank 0's wrapper runs the tracker on MASTER_PORT) and
    Kubeflow XGBoostJob's MASTER_*/WORKER_* variables."""
    meet = _rendezvous(spec, tasks, role, index, context)
    if meet is None:
        return {}
    master, port, ranked, rank = meet.master, meet.port, meet.ranked, meet.rank
    workers = [t for t in ranked if not (t.role == master.role and t.index == master.index)]
    return {
        "DMLC_TRACKER_URI": master.host_ip,
        "DMLC_TRACKER_PORT": str(port),
        "DMLC_NUM_WORKER": str(len(ranked)),
        "DMLC_NUM_SERVER": "0",
        "DMLC_TASK_ID": str(rank),
        "DMLC_ROLE": "worker",
        "MASTER_ADDR": master.host_ip,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(ranked)),
        "RANK": str(rank),
        "WORKER_ADDRS": ",".join(t.host_ip for t in workers),
        "WORKER_PORT": str(port),
    }


def paddle_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    context: FrameworkContext | None = None,
) -> dict[str, str]:
    """Kubeflow PaddleJob's variables, which ``paddle.distributed.launch`` reads: the
    rendezvous at the Master (parameter-server mode) or Worker 0 (collective mode)."""
    meet = _rendezvous(spec, tasks, role, index, context)
    if meet is None:
        return {}
    env = {
        "PYTHONUNBUFFERED": "0",
        "PADDLE_JOB_ID": spec.name,
        "PADDLE_NNODES": str(len(meet.ranked)),
        "PADDLE_MASTER": f"{meet.master.host_ip}:{meet.port}",
    }
    if _role_named(spec, ("master",)) is not None:
        # Parameter-server mode: each task is one server (the Master) or one trainer.
        key = "PADDLE_SERVER_NUM" if role.lower() == "master" else "PADDLE_TRAINER_NUM"
        env[key] = "1"
    return env


def jax_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    context: FrameworkContext | None = None,
) -> dict[str, str]:
    """Kubeflow JAXJob's variables for ``jax.distributed.initialize``: the coordinator is
    Worker 0."""
    meet = _rendezvous(spec, tasks, role, index, context)
    if meet is None:
        return {}
    master, port, ranked, rank = meet.master, meet.port, meet.ranked, meet.rank
    return {
        "PYTHONUNBUFFERED": "1",
        "COORDINATOR_ADDRESS": master.host_ip,
        "COORDINATOR_PORT": str(port),
        "NUM_PROCESSES": str(len(ranked)),
        "PROCESS_ID": str(rank),
    }


# ------------------------------------------------------------------------------- MPI


@dataclass(frozen=True)
class MpiLayout:
    """Who runs mpirun, and the hosts (tasks) its ranks run on."""

    launcher: tuple[str, int]
    hosts: tuple[tuple[str, int, int], ...]  # role, index, slots

    def host_name(self, role: str, index: int) -> str:
        # The task's directory name, which the local rsh agent maps back to the task.
        return f"{role}-{index}"

    def hostfile(self) -> str:
        return "".join(f"{self.host_name(r, i)} slots={s}\n" for r, i, s in self.hosts)

    def hosts_arg(self) -> str:
        return ",".join(f"{self.host_name(r, i)}={s}" for r, i, s in self.hosts)


def mpi_layout(spec: JobSpec, tasks: list[TaskPlacement]) -> MpiLayout | None:
    """A job with a Launcher (Kubeflow) or master (Volcano) role: that task runs the
    user's mpirun over the other roles' tasks. Without one (T9k's MPIJob, only workers),
    worker 0 runs ``mpirun`` with the role's command over every task, itself included."""
    if spec.kind is not JobKind.MPI:
        return None
    launcher_role = _role_named(spec, MPI_LAUNCHER_ROLES)
    position = {r.name: i for i, r in enumerate(spec.roles)}
    ordered = sorted(
        (t for t in tasks if t.role in position), key=lambda t: (position[t.role], t.index)
    )
    if not ordered:
        return None
    members = [t for t in ordered if t.role != launcher_role]
    if launcher_role is not None:
        launcher = (launcher_role, 0)
    else:
        launcher = (ordered[0].role, ordered[0].index)
    hosts = tuple((t.role, t.index, _slots(spec, t.role)) for t in members)
    return MpiLayout(launcher, hosts) if hosts else None


def _slots(spec: JobSpec, role: str) -> int:
    # Kubeflow's slotsPerWorker defaults to 1; a task with GPUs gets one slot per GPU.
    return max(1, int(spec.role(role).resources.gpu))


def uses_hydra(spec: JobSpec) -> bool:
    """Intel MPI and MPICH (Hydra) read "host:slots" hostfile lines, as the MPI Operator
    writes them for those implementations; Open MPI "host slots=N"."""
    return env_dict(spec.env).get(MPI_IMPLEMENTATION_ENV) in HYDRA_IMPLEMENTATIONS


def mpi_env(layout: MpiLayout, role: str, index: int, context: FrameworkContext) -> dict[str, str]:
    hostfile = f"{context.files_dir}/{HOSTFILE}"
    env = {
        # Open MPI 4 (ORTE) and 5 (PRRTE), MPICH / Intel MPI's Hydra: the same hostfile.
        "OMPI_MCA_orte_default_hostfile": hostfile,
        "PRTE_MCA_prte_default_hostfile": hostfile,
        "HYDRA_HOST_FILE": hostfile,
        "I_MPI_HYDRA_HOST_FILE": hostfile,
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        # Open MPI 4.1's orted maps its hwloc topology into the "biggest" hole of its
        # address space, which can be next to the stack and segfaults there (seen in
        # the e2e MPI test): without a hole the topology is simply not shared.
        "OMPI_MCA_rtc_hwloc_vmhole": "none",
        "TRAINYARD_MPI_HOSTFILE": hostfile,
        "K_MPI_JOB_ROLE": "worker",
    }
    if (role, index) != layout.launcher:
        return env
    env.update(
        {
            # Volcano's mpi plugin: the worker hosts, comma-separated.
            "MPI_HOST": ",".join(layout.host_name(r, i) for r, i, _ in layout.hosts),
            "K_MPI_JOB_ROLE": "launcher",
        }
    )
    if context.python is not None:
        # mpirun's remote starts go through the wrapper's agent, not ssh.
        agent = f"{context.files_dir}/{RSH_AGENT}"
        env.update(
            {
                "OMPI_MCA_plm_rsh_agent": agent,
                "PRTE_MCA_plm_ssh_agent": agent,
                "HYDRA_LAUNCHER_EXEC": agent,
                "I_MPI_HYDRA_BOOTSTRAP_EXEC": agent,
            }
        )
    return env


# ----------------------------------------------------------------------- entry points


def framework_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    context: FrameworkContext | None = None,
) -> dict[str, str]:
    """The framework variables of one task (empty for kinds that need none here)."""
    if spec.kind is JobKind.TENSORFLOW:
        config = tf_config(spec, tasks, role, index)
        return {"TF_CONFIG": config} if config is not None else {}
    if spec.kind in TORCH_KINDS:
        return torch_env(spec, tasks, role, index, context)
    if spec.kind is JobKind.XGBOOST:
        return xgboost_env(spec, tasks, role, index, context)
    if spec.kind is JobKind.PADDLE:
        return paddle_env(spec, tasks, role, index, context)
    if spec.kind is JobKind.JAX:
        return jax_env(spec, tasks, role, index, context)
    if spec.kind is JobKind.MPI and context is not None:
        layout = mpi_layout(spec, tasks)
        return mpi_env(layout, role, index, context) if layout is not None else {}
    return {}


def _wrap(context: FrameworkContext, mode: str, args: list[str], command: str | None) -> str:
    assert context.python is not None, "a backend without helpers wraps no command"
    helper = [context.wrapper] if context.wrapper else ["-m", WRAPPER_MODULE]
    words = shlex.join([context.python, "-I", *helper, mode, "--dir", context.files_dir, *args])
    if command is None:
        return f"exec {words}"
    return f"{COMMAND_VAR}={shlex.quote(command)} exec {words}"


def framework_command(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    command: str,
    context: FrameworkContext,
) -> str:
    """The command the task runs: ``command`` itself, or the framework wrapper around it
    (the XGBoost tracker next to rank 0; MPI's hostfile, rsh agent and waiting workers).
    Where no helper runs (Kubernetes), MPI is as Kubeflow's and T9k's operators run it:
    the launcher runs mpirun over ssh and the workers run sshd."""
    if context.python is None:
        return _unwrapped_command(spec, tasks, role, index, command)
    if spec.kind is JobKind.XGBOOST:
        found = _master_port(spec, tasks, context)
        if found is not None and (found[0].role, found[0].index) == (role, index):
            master, port = found
            return _wrap(
                context,
                "xgboost-tracker",
                [
                    "--workers",
                    str(len(ranked_tasks(spec, tasks))),
                    "--host",
                    master.host_ip,
                    "--port",
                    str(port),
                ],
                command,
            )
        return command
    if spec.kind is JobKind.MPI:
        layout = mpi_layout(spec, tasks)
        if layout is None:
            return command
        attempt_dir = PurePosixPath(context.files_dir).parent.parent
        common = ["--hosts", layout.hosts_arg()]
        if uses_hydra(spec):
            common += ["--hostfile-format", "hydra"]
        if (role, index) == layout.launcher:
            if _role_named(spec, MPI_LAUNCHER_ROLES) is None:
                # T9k's MPIJob names the MPI program; worker 0 runs it under mpirun.
                extra = env_dict(spec.role(role).env).get(MPIRUN_ARGS_ENV, "")
                command = " ".join(
                    filter(None, ["mpirun", extra, "bash", "-c", shlex.quote(command)])
                )
            return _wrap(
                context, "mpi-launcher", [*common, "--attempt-dir", str(attempt_dir)], command
            )
        until = attempt_dir / layout.host_name(*layout.launcher) / EXIT_FILE
        return _wrap(context, "mpi-worker", [*common, "--until", str(until)], None)
    return command


# The ssh daemon a worker of an MPI job runs where ranks arrive over ssh (the images
# Kubeflow's MPI operator and T9k run have it there).
SSHD = "/usr/sbin/sshd -De"


def _unwrapped_command(
    spec: JobSpec, tasks: list[TaskPlacement], role: str, index: int, command: str
) -> str:
    if spec.kind is not JobKind.MPI or _role_named(spec, MPI_LAUNCHER_ROLES) is not None:
        return command  # a Launcher role runs its own mpirun; workers their own command
    layout = mpi_layout(spec, tasks)
    if layout is None:
        return command
    if (role, index) == layout.launcher:
        # T9k's MPIJob names the MPI program; worker 0 runs it under mpirun over ssh.
        extra = env_dict(spec.role(role).env).get(MPIRUN_ARGS_ENV, "")
        return " ".join(filter(None, ["mpirun", extra, "bash", "-c", shlex.quote(command)]))
    return SSHD
