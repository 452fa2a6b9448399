"""The environment every task starts with.

System variables (``TRAINYARD_*``, OpenPAI's ``PAI_*`` list from the seed's §4 and
``CUDA_VISIBLE_DEVICES``) are computed from the spec and the placement. The job's and the
role's own variables are included too but can never replace a system variable: OpenPAI
documents jobEnvs as "available in the container and not allowed to replace" the
platform's, and a task that sees a forged ``PAI_HOST_IP_*`` would talk to the wrong peer.
"""

from __future__ import annotations

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec, env_dict


def _number(value: float) -> str:
    # OpenPAI's counts are integers; ours are floats so fractions can exist. Write 1.0
    # as "1" so scripts that do arithmetic on PAI_RESOURCE_* keep working.
    return str(int(value)) if float(value).is_integer() else str(value)


def _optional_count(value: int | None) -> str:
    # An environment variable cannot be null. OpenPAI's null means "this rule is off";
    # the empty string keeps that distinct from any count (a "null" or "0" string would
    # read as a value) and is what `[ -z "$VAR" ]` tests for in a shell.
    return "" if value is None else str(value)


def _ports(placement: TaskPlacement, label: str) -> str:
    for assignment in placement.ports:
        if assignment.label == label:
            return ",".join(str(port) for port in assignment.ports)
    return ""


def resource_string(role: RoleSpec) -> str:
    """OpenPAI's "gpuNumber,cpuNumber,memMB,shmMB" for a role."""
    res = role.resources
    return ",".join(
        (_number(res.gpu), _number(res.cpu), str(res.memory_mb), str(res.shm_mb))
    )


def container_id(job_id: str, attempt: int, role: str, index: int) -> str:
    return f"{job_id}-{attempt}-{role}-{index}"


def build_task_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    role: str,
    index: int,
    attempt: int,
    job_id: str,
    default_fs_uri: str = "",
) -> dict[str, str]:
    """The full environment of task ``role``/``index`` (without the host's variables)."""
    current = next((t for t in tasks if t.role == role and t.index == index), None)
    if current is None:
        raise KeyError(f"no placement for task {role}/{index}")
    current_role = spec.role(role)

    system: dict[str, str] = {
        "TRAINYARD_JOB_ID": job_id,
        "TRAINYARD_ROLE": role,
        "TRAINYARD_INDEX": str(index),
        "TRAINYARD_ATTEMPT": str(attempt),
        "PAI_JOB_NAME": spec.name,
        "PAI_USER_NAME": spec.user,
        "PAI_DEFAULT_FS_URI": default_fs_uri,
        "PAI_TASK_ROLE_COUNT": str(len(spec.roles)),
        "PAI_TASK_ROLE_LIST": ",".join(r.name for r in spec.roles),
        "PAI_CURRENT_TASK_ROLE_NAME": role,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(index),
        "PAI_CONTAINER_HOST_IP": current.host_ip,
        "PAI_CONTAINER_ID": container_id(job_id, attempt, role, index),
        # Empty hides every GPU from a task that was placed without one.
        "CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in current.gpu_indices),
    }
    for r in spec.roles:
        system[f"PAI_TASK_ROLE_TASK_COUNT_{r.name}"] = str(r.replicas)
        system[f"PAI_RESOURCE_{r.name}"] = resource_string(r)
        system[f"PAI_MIN_FAILED_TASK_COUNT_{r.name}"] = _optional_count(r.min_failed)
        system[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{r.name}"] = _optional_count(r.min_succeeded)
    for t in tasks:
        system[f"PAI_HOST_IP_{t.role}_{t.index}"] = t.host_ip
        for assignment in t.ports:
            system[f"PAI_PORT_LIST_{t.role}_{t.index}_{assignment.label}"] = ",".join(
                str(port) for port in assignment.ports
            )
    # Labels the role asked for but the placement gave no port still get the variable,
    # so a command that reads it sees an empty value rather than an unset one.
    for port in current_role.ports:
        system[f"PAI_CONTAINER_HOST_{port.label}_PORT_LIST"] = _ports(current, port.label)
    for assignment in current.ports:
        system[f"PAI_CONTAINER_HOST_{assignment.label}_PORT_LIST"] = ",".join(
            str(p) for p in assignment.ports
        )

    # Role variables are more specific than job variables; system ones win over both.
    return {**env_dict(spec.env), **env_dict(current_role.env), **system}
