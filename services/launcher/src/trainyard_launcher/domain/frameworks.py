"""What a framework needs in a task's environment to find its peers.

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
"""

from __future__ import annotations

import json

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobKind, JobSpec

TF_PORT_LABEL = "tfport"
EVALUATOR = "evaluator"


def tf_task_type(role: str) -> str:
    return role.lower()


def _address(task: TaskPlacement) -> str | None:
    ports = {a.label: a.ports for a in task.ports if a.ports}
    chosen = ports.get(TF_PORT_LABEL) or next(iter(ports.values()), None)
    return f"{task.host_ip}:{chosen[0]}" if chosen else None


def tf_config(spec: JobSpec, tasks: list[TaskPlacement], role: str, index: int) -> str | None:
    """The TF_CONFIG JSON of task ``role``/``index``; None when some task has no port."""
    cluster: dict[str, list[str]] = {}
    # Roles in the spec's order, tasks by index: every task writes the same cluster.
    by_role = {r.name: sorted((t for t in tasks if t.role == r.name), key=lambda t: t.index)
               for r in spec.roles}
    for name, members in by_role.items():
        task_type = tf_task_type(name)
        if task_type == EVALUATOR:
            continue
        addresses = [_address(t) for t in members]
        if any(a is None for a in addresses):
            return None
        cluster.setdefault(task_type, []).extend(a for a in addresses if a is not None)
    return json.dumps(
        {"cluster": cluster, "task": {"type": tf_task_type(role), "index": index}},
        separators=(",", ":"),
    )


def framework_env(spec: JobSpec, tasks: list[TaskPlacement], role: str, index: int
                  ) -> dict[str, str]:
    """The framework variables of one task (empty for kinds that need none here)."""
    if spec.kind is JobKind.TENSORFLOW:
        config = tf_config(spec, tasks, role, index)
        return {"TF_CONFIG": config} if config is not None else {}
    return {}
