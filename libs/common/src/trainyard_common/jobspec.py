"""The canonical job: the one shape every dialect translates to and from.

Maps are kept as lists of name/value pairs (``EnvVar``) rather than dicts so a job can be
stored in MongoDB and FerretDB as it is: their documents forbid keys with ``.`` or a
leading ``$``, and environment variable names or labels may hold either.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    """Base for every contract model: unknown fields are an error, never silently kept."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class JobKind(StrEnum):
    GENERIC = "generic"
    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"
    XGBOOST = "xgboost"
    MPI = "mpi"
    DEEPSPEED = "deepspeed"
    COLOSSALAI = "colossalai"
    BEAM = "beam"
    PADDLE = "paddle"
    JAX = "jax"


class RunMode(StrEnum):
    IMMEDIATE = "immediate"
    DEBUG = "debug"
    PAUSE = "pause"
    ELASTIC = "elastic"


class RestartPolicy(StrEnum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    ALWAYS = "Always"
    EXIT_CODE = "ExitCode"


class EnvVar(Model):
    name: str
    value: str


class PortSpec(Model):
    """A named group of ports a task needs (OpenPAI's portList entry)."""

    label: str
    begin_at: int = Field(0, description="First port of a fixed range; 0 means any free port.")
    count: int = Field(1, description="How many ports of this label each task gets.")


# The port every TensorFlow task is given where its job declares none (TI, DLC, T9k),
# so placement assigns it a real port and the launcher can write TF_CONFIG with it
# (launcher domain/frameworks.py prefers this label).
TF_PORT_LABEL = "tfport"


# A TaskRef's index for every task of its role (a rule over a role of any size, and of
# the size it has now for an elastic one, in a few bytes).
ALL_TASKS = -1


class TaskRef(Model):
    """One task of a job: a role and an index in it (-1: every task of the role)."""

    role: str
    index: int


# Annotation domains a job's own annotations never reach a pod with: Kubernetes'
# (its components read them: AppArmor's container.apparmor.security.beta.kubernetes.io/
# unconfines a container, seccomp's, the autoscaler's), the CNI's extra networks
# (Multus: another network for the pod), and the platform's own (trainyard.dev/job and
# the like). Subdomains too, but for the test cluster's kwok.trainyard.dev.
RESERVED_ANNOTATION_DOMAINS = ("kubernetes.io", "k8s.io", "k8s.v1.cni.cncf.io")
PLATFORM_ANNOTATION_DOMAIN = "trainyard.dev"
# Container runtimes' own keys, without a domain (CRI-O's devices, user namespaces and
# the like; Kata's hypervisor settings).
RUNTIME_ANNOTATION_PREFIXES = ("io.kubernetes.", "io.katacontainers.", "io.containerd.")


def reaches_pod(annotation: str) -> bool:
    """Whether a job's own annotation key may reach its pods (the operator's may be
    any): the submission warns of one that does not, the Kubernetes backend drops it."""
    if annotation.lower().startswith(RUNTIME_ANNOTATION_PREFIXES):
        return False
    domain = annotation.rpartition("/")[0].lower() if "/" in annotation else ""
    if domain == PLATFORM_ANNOTATION_DOMAIN:
        return False
    return not any(domain == d or domain.endswith("." + d) for d in RESERVED_ANNOTATION_DOMAINS)


class CodeSource(Model):
    """A git repository checked out for every task before its command runs."""

    repo: str = Field(description="git URL or local path of the repository")
    branch: str | None = None
    commit: str | None = None
    mount_path: str = Field(description="where the task finds the checkout")


class DataSource(Model):
    source: str = Field(description="a URI, a local path, or a registered data source id")
    mount_path: str
    # A pod template's mount that says readOnly (T9k, Kubeflow): read-only even where
    # the claim could be written. Left out when False, as ``uncapped``.
    read_only: bool = Field(False, exclude_if=lambda value: not value)


class Resources(Model):
    cpu: float = 1.0
    memory_mb: int = 1024
    shm_mb: int = 64
    gpu: float = Field(0, description="GPUs per task; a fraction below 1 shares one GPU.")
    gpu_type: str | None = Field(
        None,
        description="A required GPU model (the one-model spelling, kept for the jobs "
        "and dialects that have it); the allowed models are this and ``gpu_types`` together "
        "(``allowed_gpu_types``).",
    )
    gpu_types: list[str] = Field(
        default_factory=list,
        description="GPU models a task may run on, any one of them "
        "(all GPUs of one task are on one node, so of one model). Together with "
        "``gpu_type``: both empty means any model. Matched without regard to case.",
    )
    storage_gb: int | None = None
    # Set by TI's translation only (its 0U / 0G machine types): a native job, or a bare
    # spec on the bus, that sets it is refused (dialects.native.validate_native).
    uncapped: list[Literal["cpu", "memory"]] = Field(
        default_factory=list,
        # Left out when empty, so a job that caps everything is written as before the
        # field existed: a service of the version before, still running during an
        # upgrade, reads it (unknown fields are an error to it).
        exclude_if=lambda value: not value,
        description="Figures placement reserves that the task is not held to: no cpu.max "
        "or CPU limit, no memory cap or memory limit (TI's 0 in a machine type: the "
        "tfplus example's 0U0G2P, 'no CPU or memory limit').",
    )

    def allowed_gpu_types(self) -> list[str]:
        """The GPU models a task may use: ``gpu_type`` and ``gpu_types`` together, in that
        order, each once (compared without case); empty means any model."""
        models: list[str] = []
        seen: set[str] = set()
        for model in ([self.gpu_type] if self.gpu_type else []) + self.gpu_types:
            if model.lower() not in seen:
                seen.add(model.lower())
                models.append(model)
        return models


# Kubernetes' imagePullPolicy values.
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
PULL_POLICIES: dict[str, PullPolicy] = {
    "Always": "Always",
    "IfNotPresent": "IfNotPresent",
    "Never": "Never",
}


class RoleSpec(Model):
    name: str
    replicas: int = 1
    # Elastic roles run between these bounds (None: fixed at ``replicas``).
    min_replicas: int | None = None
    max_replicas: int | None = None
    resources: Resources = Field(default_factory=Resources)
    # Only nodes carrying every one of these labels (name and value) may host the role.
    node_selector: list[EnvVar] = Field(default_factory=list)
    image: str | None = None
    # When the node pulls the image (a container's imagePullPolicy, Kubernetes' own
    # values); None: the cluster's default. Only the Kubernetes backend has images.
    image_pull_policy: PullPolicy | None = None
    # A shell command line (OpenPAI, PAI-DLC, TI), run by ``sh -c``. For a container
    # given as argv (``entrypoint`` / ``args``) it is that argv shown as one line.
    command: str
    # A container's argv as Kubernetes means it (Kubeflow, T9k pod templates): the
    # container's ``command`` replaces the image's entrypoint, ``args`` alone run the
    # image's entrypoint with them, and ``$(VAR)`` in either is expanded from the task's
    # environment (``$$(VAR)`` stays literal). Both None: ``command`` is a shell line.
    entrypoint: list[str] | None = Field(
        None, description="The container's command (replaces the image's entrypoint)."
    )
    args: list[str] | None = Field(None, description="The container's args.")
    # The pod template's annotations (T9k, Kubeflow): the Kubernetes backend puts them
    # on the role's pods.
    annotations: list[EnvVar] = Field(default_factory=list)
    # The PersistentVolumeClaims its pod template mounts (T9k, Kubeflow): in its pods on
    # Kubernetes, as the job's data sources are; the local backend mounts none (said on
    # submission). Left out when empty, as ``uncapped``.
    volumes: list[DataSource] = Field(
        default_factory=list,
        exclude_if=lambda value: not value,
        description="The role's pod template's PersistentVolumeClaims (pvc://<claim>"
        "[/<subPath>] at the container's mountPath), mounted in its pods on Kubernetes.",
    )
    ports: list[PortSpec] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    restart_policy: RestartPolicy = RestartPolicy.NEVER
    # With RestartPolicy.EXIT_CODE: the exit codes that restart a task (T9k's policy).
    retryable_exit_codes: list[int] = Field(default_factory=list)
    # OpenPAI semantics: None means "this role never fails the job" (min_failed) and
    # "this role alone never succeeds the job" (min_succeeded).
    min_failed: int | None = 1
    min_succeeded: int | None = None

    @property
    def container_form(self) -> bool:
        """Whether the role is a container argv (``entrypoint`` / ``args``), not a
        shell command line."""
        return self.entrypoint is not None or self.args is not None

    @property
    def uses_image_entrypoint(self) -> bool:
        """A container without a command of its own runs its image's entrypoint."""
        return self.container_form and not self.entrypoint


RETRY_UNLIMITED = -1
RETRY_ALWAYS = -2


class JobSpec(Model):
    name: str
    kind: JobKind = JobKind.GENERIC
    user: str = ""
    queue: str = "default"
    priority: int = 5
    run_mode: RunMode = RunMode.IMMEDIATE
    image: str | None = None
    # The namespace a Kubernetes-style submission names (T9k, Kubeflow): the Kubernetes
    # backend creates the job's pods there when it is allowed to.
    namespace: str | None = None
    env: list[EnvVar] = Field(default_factory=list)
    labels: list[EnvVar] = Field(default_factory=list)
    code_dir: str | None = None
    data_dir: str | None = None
    output_dir: str | None = None
    auth_file: str | None = None
    code_source: CodeSource | None = None
    data_sources: list[DataSource] = Field(default_factory=list)
    # Installed into the job's own environment before the command runs.
    pip_packages: list[str] = Field(default_factory=list)
    pip_requirements_dir: str | None = None
    max_running_minutes: int | None = None
    # How many times a failed attempt runs again; RETRY_UNLIMITED: without limit,
    # RETRY_ALWAYS: after every end, success too, until the job is stopped (OpenPAI's
    # retryCount -1 and -2).
    retry_limit: int = Field(0, ge=-2)
    # False: the tasks need not start together; placement places each as capacity allows
    # (OpenPAI extras.gangAllocation: false), the job runs with those placed so far.
    gang: bool = True
    keep_failed_for_debug: bool = False
    # What to remove when the job ends (T9k cleanUpPolicy: None, All, Unfinished).
    cleanup_policy: str | None = None
    # T9k GenericJob rules: the job succeeds (fails) as soon as every task of any one
    # rule succeeded (failed). Empty: the roles' min_succeeded / min_failed decide.
    success_rules: list[list[TaskRef]] = Field(default_factory=list)
    failure_rules: list[list[TaskRef]] = Field(default_factory=list)
    # Values substituted into commands at launch (OpenPAI <% $secrets.x %>); never shown
    # back: views use ``redacted()``.
    secrets: list[EnvVar] = Field(default_factory=list)
    roles: list[RoleSpec]

    def role(self, name: str) -> RoleSpec:
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)

    def task_count(self) -> int:
        return sum(role.replicas for role in self.roles)

    def redacted(self) -> JobSpec:
        """This spec as it may be shown or stored for reading: secret values hidden."""
        if not self.secrets:
            return self
        hidden = [EnvVar(name=s.name, value=REDACTED) for s in self.secrets]
        return self.model_copy(update={"secrets": hidden})


REDACTED = "******"

# A role variable holding extra mpirun arguments (shell words, already quoted) for the
# mpirun the launcher runs for an MPI job (T9k MPIJob's worker.extraMPIArgs).
MPIRUN_ARGS_ENV = "TRAINYARD_MPIRUN_ARGS"
# A job variable naming its MPI implementation (the MPI Operator's mpiImplementation:
# OpenMPI, Intel, MPICH): the launcher writes the hostfile in that one's form.
MPI_IMPLEMENTATION_ENV = "TRAINYARD_MPI_IMPLEMENTATION"


def env_dict(pairs: list[EnvVar]) -> dict[str, str]:
    return {pair.name: pair.value for pair in pairs}


def env_list(mapping: dict[str, Any]) -> list[EnvVar]:
    return [EnvVar(name=str(k), value=_env_value(v)) for k, v in mapping.items()]


def _env_value(value: Any) -> str:
    # JSON booleans become the spelling shells and OpenPAI's scripts test for.
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)
