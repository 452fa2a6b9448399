"""The environment every task starts with.

System variables (``TRAINYARD_*``, OpenPAI's ``PAI_*`` list from the seed's §4 and
``CUDA_VISIBLE_DEVICES``) are computed from the spec and the placement. The job's and the
role's own variables are included too but can never replace a system variable: OpenPAI
documents jobEnvs as "available in the container and not allowed to replace" the
platform's, and a task that sees a forged ``PAI_HOST_IP_*`` would talk to the wrong peer.
"""

from __future__ import annotations

import re

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec, env_dict
from trainyard_common.limits import bounded_sub

from .frameworks import FrameworkContext, framework_env


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
    return ",".join((_number(res.gpu), _number(res.cpu), str(res.memory_mb), str(res.shm_mb)))


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
    framework: FrameworkContext | None = None,
) -> dict[str, str]:
    """The full environment of task ``role``/``index`` (without the host's variables).
    ``framework``: what the launcher adds for the job's framework (its task directory,
    a reserved master port); without it only what the spec and placement tell is set."""
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
    system.update(openpai_compat_env(spec, tasks, current, current_role, default_fs_uri))

    # TF_CONFIG, MASTER_*/RANK/PET_*, DMLC_*, the MPI hostfile: domain/frameworks.py.
    system.update(framework_env(spec, tasks, role, index, framework))

    # Role variables are more specific than job variables; system ones win over both.
    return {**env_dict(spec.env), **env_dict(current_role.env), **system}


# --------------------------------------------------------------- OpenPAI's other names
#
# Besides the seed's §4 list, OpenPAI gives every container the names its older and newer
# runtimes used, and jobs in the wild read them. Sources (microsoft/pai unless noted):
# - src/rest-server/src/models/v2/job/runtime-env.js (generateFrameworkEnv: job level and
#   its "backward compatibility" block) and k8s.js (PAI_TASK_INDEX);
# - microsoft/openpai-runtime src/init.d/framework_parser.py (generate_runtime_env:
#   PAI_CURRENT_CONTAINER_*, PAI_CONTAINER_HOST_PORT / _SSH_PORT / _PORT_LIST,
#   PAI_TASK_ROLE_$role_HOST_LIST, PAI_$role_$index_$label_PORT, PAI_TASK_ROLE_INSTANCES);
# - src/rest-server/src/templates/yarnContainerScript.mustache before commit 5fec45c52
#   (the "Backward compatibility" block: PAI_TASK_ROLE_NAME, PAI_TASK_ROLE_INDEX,
#   PAI_TASK_CPU_NUM, PAI_CURRENT_TASK_ROLE_*_COUNT, PAI_DATA_DIR, PAI_RESOURCE, ...).


def _first_port(placement: TaskPlacement, label: str) -> str:
    return next((str(a.ports[0]) for a in placement.ports if a.label == label and a.ports), "")


_PAI_NAMES = "PAI_DEFAULT_FS_URI|PAI_JOB_NAME|PAI_USER_NAME|PAI_USERNAME|jobName"
_PAI_REF = re.compile(rf"\$(?:\{{({_PAI_NAMES})\}}|({_PAI_NAMES})\b)")


def pai_dir(value: str | None, spec: JobSpec, default_fs_uri: str) -> str:
    """An OpenPAI v1 directory (dataDir, outputDir, codeDir) as OpenPAI hands it to the
    task: ``$PAI_DEFAULT_FS_URI``, ``$PAI_JOB_NAME`` (``$jobName``) and
    ``$PAI_USER_NAME`` (``$PAI_USERNAME``) replaced by their values."""
    if not value:
        return ""
    values = {
        "PAI_DEFAULT_FS_URI": default_fs_uri,
        "PAI_JOB_NAME": spec.name,
        "jobName": spec.name,
        "PAI_USER_NAME": spec.user,
        "PAI_USERNAME": spec.user,
    }
    return _PAI_REF.sub(lambda m: values[m.group(1) or m.group(2)], value)


def openpai_compat_env(
    spec: JobSpec,
    tasks: list[TaskPlacement],
    current: TaskPlacement,
    role: RoleSpec,
    default_fs_uri: str = "",
) -> dict[str, str]:
    """OpenPAI's back-compatible and runtime aliases for task ``current``."""
    # outputDir, when not given: "$PAI_DEFAULT_FS_URI/Output/$jobName" (the seed's §5),
    # where a default file system is configured.
    output = spec.output_dir or ("$PAI_DEFAULT_FS_URI/Output/$jobName" if default_fs_uri else "")
    task_count = str(spec.task_count())
    role_count = str(len(spec.roles))
    role_list = ",".join(r.name for r in spec.roles)
    res = role.resources
    env: dict[str, str] = {
        "PAI_FRAMEWORK_NAME": f"{spec.user}~{spec.name}",
        "PAI_VIRTUAL_CLUSTER": spec.queue,
        "PAI_USERNAME": spec.user,
        "PAI_TASKS_NUM": task_count,
        "PAI_JOB_TASK_COUNT": task_count,
        "PAI_TASK_ROLES_NUM": role_count,
        "PAI_JOB_TASK_ROLE_COUNT": role_count,
        "PAI_JOB_TASK_ROLE_LIST": role_list,
        "PAI_DATA_DIR": pai_dir(spec.data_dir, spec, default_fs_uri),
        "PAI_OUTPUT_DIR": pai_dir(output, spec, default_fs_uri),
        "PAI_CODE_DIR": pai_dir(spec.code_dir, spec, default_fs_uri),
        "PAI_TASK_INDEX": str(current.index),
        "PAI_TASK_ROLE_INDEX": str(current.index),
        "PAI_TASK_ROLE_NAME": role.name,
        "PAI_TASK_ROLE_NUM": str(role.replicas),
        "PAI_CURRENT_TASK_ROLE_TASK_COUNT": str(role.replicas),
        "PAI_TASK_CPU_NUM": _number(res.cpu),
        "PAI_CURRENT_TASK_ROLE_CPU_COUNT": _number(res.cpu),
        "PAI_TASK_MEM_MB": str(res.memory_mb),
        "PAI_CURRENT_TASK_ROLE_MEM_MB": str(res.memory_mb),
        "PAI_TASK_GPU_NUM": _number(res.gpu),
        "PAI_CURRENT_TASK_ROLE_GPU_COUNT": _number(res.gpu),
        "PAI_CURRENT_TASK_ROLE_SHM_MB": str(res.shm_mb),
        "PAI_CURRENT_TASK_ROLE_MIN_FAILED_TASK_COUNT": _optional_count(role.min_failed),
        "PAI_CURRENT_TASK_ROLE_MIN_SUCCEEDED_TASK_COUNT": _optional_count(role.min_succeeded),
        "PAI_RESOURCE": resource_string(role),
        "PAI_CURRENT_CONTAINER_IP": current.host_ip,
        # The runtime's "container port" is the task's first http port, its ssh port the
        # first ssh port (OpenPAI v2 gives every task one of each).
        "PAI_CURRENT_CONTAINER_PORT": _first_port(current, "http"),
        "PAI_CONTAINER_HOST_PORT": _first_port(current, "http"),
        "PAI_CONTAINER_SSH_PORT": _first_port(current, "ssh"),
        "PAI_CONTAINER_HOST_PORT_LIST": "".join(
            f"{a.label}:{','.join(str(p) for p in a.ports)};" for a in current.ports
        ),
        "PAI_TASK_ROLE_INSTANCES": ",".join(f"{t.role}:{t.index}" for t in tasks),
    }
    hosts: dict[str, list[str]] = {r.name: [] for r in spec.roles}
    for t in tasks:
        http = _first_port(t, "http")
        hosts.setdefault(t.role, []).append(f"{t.host_ip}:{http}" if http else t.host_ip)
        for assignment in t.ports:
            env[f"PAI_{t.role}_{t.index}_{assignment.label}_PORT"] = ",".join(
                str(port) for port in assignment.ports
            )
    for name, host_list in hosts.items():
        env[f"PAI_TASK_ROLE_{name}_HOST_LIST"] = ",".join(host_list)
    return env


# OpenPAI's runtime renders <% $secrets.name %> (also $secrets.a.b, $secrets.a[0]) in
# the command inside the container; references to unknown secrets stay as written.
_SECRET_REF = re.compile(r"<%\s*\$secrets\.([^%\s]+?)\s*%>")
_SECRET_INDEX = re.compile(r"\[(\d+)\]")


def substitute_secrets(command: str, secrets: dict[str, str]) -> str:
    """``command`` with each ``<% $secrets.x %>`` replaced by the secret's value, at
    launch, so the value is never part of the stored job. Raises TooLong, before
    building it, for a command that would pass MAX_RENDERED characters (a large secret
    named many times)."""
    if not secrets:
        return command

    def replace(match: re.Match[str]) -> str:
        name = _SECRET_INDEX.sub(r".\1", match.group(1))
        return secrets.get(name, match.group(0))

    return bounded_sub(_SECRET_REF, command, replace)
