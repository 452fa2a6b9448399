"""What the Kubernetes-shaped dialects (T9k, Kubeflow) share: reading a pod template
into a task's image, command, environment and resources, and showing a stored job back
as a resource with a status. Pure; problems are recorded on an ``Issues``."""

from __future__ import annotations

import copy
import math
import re
import shlex
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from ..events import FieldIssue
from ..jobspec import (
    PULL_POLICIES,
    DataSource,
    EnvVar,
    PullPolicy,
    Resources,
    RoleSpec,
    reaches_pod,
)
from ..sources import CLAIM_NAME_RE
from .translation import INT_MAX, Issues, env_problem, join, json_type, show

# Kubernetes object names (metadata.name, namespaces): an RFC 1123 DNS label.
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # fullmatch: <= 63
# A PersistentVolumeClaim's name: sources.CLAIM_NAME_RE, the one rule every claim is
# read by (a data source's pvc:// too).
DNS_SUBDOMAIN_RE = CLAIM_NAME_RE
DNS_LABEL_RULE = (
    "a lowercase RFC 1123 label: ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, at most 63 characters"
)

GPU_RESOURCE = "nvidia.com/gpu"
SHM_PATH = "/dev/shm"
MIB = 2**20
GIB = 2**30

_QUANTITY = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_SUFFIX = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}

# Canonical resource -> the Kubernetes resource it is read from.
RESOURCE_KEYS = {
    "cpu": "cpu",
    "memory_mb": "memory",
    "gpu": GPU_RESOURCE,
    "storage_gb": "ephemeral-storage",
}
# Which table a resource's figure is read from first. Requests are what a task is placed
# by; limits stand in when no request is given (Kubernetes defaults a missing request to
# the limit). Extended resources such as GPUs are whole numbers, given in limits.
RESOURCE_ORDER = {
    "cpu": ("requests", "limits"),
    "memory": ("requests", "limits"),
    GPU_RESOURCE: ("limits", "requests"),
    "ephemeral-storage": ("requests", "limits"),
}

# Node labels that name a node's GPU model (NVIDIA GPU feature discovery, GKE, Alibaba
# ACK, and Trainyard's own). A pod that selects nodes by one of these asks for GPU models,
# which Trainyard matches against each node's gpu_type (its cluster file), not its labels;
# a dialect may pass its own keys to ``pod_template``.
GPU_MODEL_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "aliyun.accelerator/nvidia_name",
    "trainyard.dev/gpu-type",
)
REQUIRED_NODE_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
PULL_POLICY = re.compile(r"^(Always|IfNotPresent|Never)$")

# Container and pod fields that carry meaning Trainyard applies; every other one is
# kept with the original and reported.
_CONTAINER_USED = frozenset(
    {"name", "image", "imagePullPolicy", "command", "args", "env", "resources", "volumeMounts"}
)
_POD_USED = frozenset({"containers", "volumes", "restartPolicy", "nodeSelector", "affinity"})


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity ("500m", "8Gi", 2, "1e3") as a number, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value)) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        return None
    suffix = match["suffix"]
    try:
        number = Decimal(match["num"])
        if suffix and suffix[0] in "eE":
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                return None
            return number * Decimal(10) ** exponent
        return number * _SUFFIX[suffix]
    except (InvalidOperation, ValueError):
        return None


# Kubernetes expands $(NAME) in a container's command and args from the container's
# environment (left as it is when NAME is not set); $$ is a literal $.
_K8S_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _shell_word(part: str) -> str:
    """One argv word as shell text that the shell turns into what the kubelet would:
    literal text quoted, each ``$(NAME)`` the variable's value if set, else itself."""
    pieces: list[str] = []
    literal: list[str] = []
    at = 0
    for ref in _K8S_REF.finditer(part):
        literal.append(part[at : ref.start()])
        at = ref.end()
        if ref.group(1) is None:
            literal.append("$")
            continue
        if literal and "".join(literal):
            pieces.append(shlex.quote("".join(literal)))
        literal = []
        name = ref.group(1)
        pieces.append(f'"${{{name}-\\$({name})}}"')
    literal.append(part[at:])
    if "".join(literal) or not pieces:
        pieces.append(shlex.quote("".join(literal)))
    return "".join(pieces)


def shell_command(parts: list[str]) -> str:
    """A container's argv as one shell command line that runs exactly the argv
    Kubernetes would have executed: each word quoted, ``$(NAME)`` references expanded
    from the task's environment as the kubelet expands them."""
    return " ".join(_shell_word(part) for part in parts)


@dataclass
class PodTask:
    """A pod template read for one role."""

    image: str | None = None
    image_pull_policy: PullPolicy | None = None
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: list[EnvVar] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    restart_policy: str | None = None  # the pod's own restartPolicy, if any
    # From nodeSelector and required node affinity; GPU models go to resources.gpu_types.
    node_selector: list[EnvVar] = field(default_factory=list)
    container_path: str = ""
    container_name: str | None = None
    # The template's annotations: the Kubernetes backend puts them on the pods.
    annotations: list[EnvVar] = field(default_factory=list)
    # The claims the container mounts (pvc://<claim>[/<subPath>] at its mountPath).
    volumes: list[DataSource] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


def _annotations(meta: Any, path: str, issues: Issues) -> list[EnvVar]:
    """A pod template's annotations (kept for the pods the Kubernetes backend makes);
    its labels and other metadata are the platform's to set, so they are not applied."""
    if not isinstance(meta, dict):
        issues.error(path, f"metadata must be an object, not {json_type(meta)}", "type")
        return []
    for key in sorted(k for k in meta if k != "annotations"):
        issues.warn(
            join(path, key),
            f"pod template metadata {show(key)} is kept but not applied to tasks",
            "not_applied",
        )
    raw = meta.get("annotations")
    if raw is None:
        return []
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        issues.error(join(path, "annotations"), "annotations must map strings to strings", "type")
        return []
    for key in sorted(k for k in raw if not reaches_pod(k)):
        issues.warn(
            join(join(path, "annotations"), key),
            f"annotation {show(key)} is the cluster's or the platform's to set: kept but "
            "not applied to the pods",
            "not_applied",
        )
    return [EnvVar(name=k, value=v) for k, v in raw.items()]


def _strings(value: Any, path: str, key: str, issues: Issues) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        issues.error(
            path,
            f"{key} must be a list of strings, not {json_type(value)}"
            if not isinstance(value, list)
            else f"{key} must hold only strings",
            "type",
        )
        return []
    return list(value)


def string_list(obj: dict[str, Any], key: str, path: str, issues: Issues) -> list[str]:
    return _strings(obj.get(key), join(path, key), key, issues)


def pod_template(
    template: Any,
    path: str,
    issues: Issues,
    *,
    preferred: tuple[str, ...] = (),
    owner: str = "the replica",
    gpu_labels: tuple[str, ...] = GPU_MODEL_LABELS,
) -> PodTask:
    """Read ``template`` (a PodTemplateSpec) at ``path``. The training container is the
    first one named in ``preferred`` (the kind's rule), else containers[0]. Node labels
    in ``gpu_labels`` name GPU models (see ``node_constraints``)."""
    task = PodTask()
    if template is None:
        issues.error(
            path, f"template is required: {owner} needs a pod template with a container", "required"
        )
        return task
    if not isinstance(template, dict):
        issues.error(path, f"template must be an object, not {json_type(template)}", "type")
        return task
    spec_path = join(path, "spec")
    pod = template.get("spec")
    if pod is None and "containers" in template:
        # T9k's own XGBoost example writes template.containers, without spec.
        issues.warn(
            join(path, "containers"),
            "template.containers is read as "
            "template.spec.containers (a PodTemplateSpec keeps containers under "
            "spec)",
            "spelling",
        )
        pod, spec_path = template, path
    for key in sorted(k for k in template if k not in ("spec", "metadata", "containers")):
        issues.warn(
            join(path, key),
            f"unknown template field {show(key)} is kept but not used",
            "unknown_field",
        )
    if "metadata" in template:
        task.annotations = _annotations(template["metadata"], join(path, "metadata"), issues)
    if not isinstance(pod, dict):
        issues.error(
            spec_path,
            "template.spec is required (an object with containers)"
            if pod is None
            else f"template.spec must be an object, not {json_type(pod)}",
            "required" if pod is None else "type",
        )
        return task
    restart = pod.get("restartPolicy")
    if restart is not None:
        if isinstance(restart, str):
            task.restart_policy = restart
        else:
            issues.error(join(spec_path, "restartPolicy"), "restartPolicy must be a string", "type")
    for key in sorted(k for k in pod if k not in _POD_USED):
        issues.warn(
            join(spec_path, key),
            f"pod field {show(key)} is kept but not applied by Trainyard",
            "not_applied",
        )

    containers_path = join(spec_path, "containers")
    containers = pod.get("containers")
    if containers is None:
        issues.error(
            containers_path,
            "containers is required (a list with at least one container)",
            "required",
        )
        return task
    if not isinstance(containers, list) or not containers:
        issues.error(
            containers_path,
            "containers must be a non-empty list",
            "type" if not isinstance(containers, list) else "required",
        )
        return task
    chosen = _training_container(containers, preferred)
    for i in range(len(containers)):
        if i != chosen:
            issues.warn(
                f"{containers_path}[{i}]",
                f"only containers[{chosen}] runs as the task; containers[{i}] is kept but not run",
                "not_applied",
            )
    cpath = f"{containers_path}[{chosen}]"
    task.container_path = cpath
    container = containers[chosen]
    if not isinstance(container, dict):
        issues.error(cpath, f"a container must be an object, not {json_type(container)}", "type")
        return task
    task.container_name = container.get("name") if isinstance(container.get("name"), str) else None
    task.image = issues.string(container, "image", cpath, required=True, non_blank=True)
    policy = issues.string(
        container, "imagePullPolicy", cpath, required=False, pattern=PULL_POLICY,
        rule="one of Always, IfNotPresent, Never",
    )  # fmt: skip
    task.image_pull_policy = PULL_POLICIES.get(policy or "")
    task.command = string_list(container, "command", cpath, issues)
    task.args = string_list(container, "args", cpath, issues)
    task.env = _env(container.get("env"), join(cpath, "env"), issues)
    task.resources = _resources(container.get("resources"), join(cpath, "resources"), issues)
    shm, task.volumes = _volumes(pod, container, spec_path, cpath, issues)
    if shm is not None:
        task.resources.shm_mb = shm
    for key in sorted(k for k in container if k not in _CONTAINER_USED):
        issues.warn(
            join(cpath, key),
            f"container field {show(key)} is kept but not applied by Trainyard",
            "not_applied",
        )
    task.node_selector, models = node_constraints(pod, spec_path, issues, gpu_labels)
    if models:
        task.resources.gpu_types = models
        if task.resources.gpu <= 0:
            issues.warn(
                join(cpath, "resources"),
                "the pod selects nodes by GPU model, but "
                "the container asks for no GPUs (nvidia.com/gpu); a GPU model binds "
                "only tasks that hold GPUs, so it is kept but not applied",
                "not_applied",
            )
    return task


def node_constraints(
    pod: dict[str, Any],
    spec_path: str,
    issues: Issues,
    gpu_labels: tuple[str, ...] = GPU_MODEL_LABELS,
) -> tuple[list[EnvVar], list[str]]:
    """A pod spec's nodeSelector and required node affinity as Trainyard's node selector
    (labels a node must carry) and GPU models (any of them). Of the affinity, one
    nodeSelectorTerm is read: ``In`` on a GPU model label gives the models; ``In`` with one
    value on any other label is a label the node must carry. Anything else (several terms,
    other operators, preferences, pod affinity) is kept with a warning naming it."""
    selector: list[EnvVar] = []
    models: list[str] | None = None
    models_path = ""

    def allow(values: list[str], where: str) -> None:
        nonlocal models, models_path
        if models is None:
            models, models_path = list(dict.fromkeys(values)), where
            return
        both = [m for m in models if m in values]
        if not both:
            issues.error(
                where,
                f"no GPU model is allowed both here ({', '.join(values)}) "
                f"and at {models_path} ({', '.join(models)})",
                "conflict",
            )
        models = both

    raw = pod.get("nodeSelector")
    npath = join(spec_path, "nodeSelector")
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not isinstance(value, str):
                issues.error(
                    join(npath, str(key)),
                    f"a nodeSelector value must be a string, "
                    f"not {json_type(value)} (quote it in YAML)",
                    "type",
                )
            elif key in gpu_labels:
                allow([value], join(npath, key))
            else:
                selector.append(EnvVar(name=str(key), value=value))
    elif raw is not None:
        issues.error(
            npath, f"nodeSelector must be an object of label values, not {json_type(raw)}", "type"
        )

    for key, values, where in _affinity(
        pod.get("affinity"), join(spec_path, "affinity"), issues, gpu_labels
    ):
        if key in gpu_labels:
            allow(values, where)
        else:
            selector.append(EnvVar(name=key, value=values[0]))
    return selector, models or []


def _affinity(
    raw: Any, path: str, issues: Issues, gpu_labels: tuple[str, ...]
) -> list[tuple[str, list[str], str]]:
    """The ``In`` expressions of a required node affinity that Trainyard can apply, as
    (label, values, path); warnings for every part it cannot."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        issues.error(path, f"affinity must be an object, not {json_type(raw)}", "type")
        return []
    for key in sorted(k for k in raw if k != "nodeAffinity"):
        issues.warn(
            join(path, key),
            f"{show(key)} (placement relative to other pods) is kept but not applied by Trainyard",
            "not_applied",
        )
    node = raw.get("nodeAffinity")
    npath = join(path, "nodeAffinity")
    if node is None:
        return []
    if not isinstance(node, dict):
        issues.error(npath, f"nodeAffinity must be an object, not {json_type(node)}", "type")
        return []
    for key in sorted(k for k in node if k != REQUIRED_NODE_AFFINITY):
        issues.warn(
            join(npath, key),
            f"{show(key)} is kept but not applied: Trainyard places "
            "by required node constraints only",
            "not_applied",
        )
    required = node.get(REQUIRED_NODE_AFFINITY)
    rpath = join(npath, REQUIRED_NODE_AFFINITY)
    if required is None:
        return []
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    tpath = join(rpath, "nodeSelectorTerms")
    if not isinstance(terms, list):
        issues.error(
            tpath if isinstance(required, dict) else rpath,
            "a required node affinity needs nodeSelectorTerms (a list)",
            "type",
        )
        return []
    if len(terms) != 1:
        if terms:
            issues.warn(
                tpath,
                f"{len(terms)} nodeSelectorTerms (any one may match) cannot be "
                "written as Trainyard's node selector (every label must match); "
                "kept but not applied",
                "not_applied",
            )
        return []
    term, term_path = terms[0], f"{tpath}[0]"
    if not isinstance(term, dict):
        issues.error(
            term_path, f"a nodeSelectorTerm must be an object, not {json_type(term)}", "type"
        )
        return []
    for key in sorted(k for k in term if k != "matchExpressions"):
        issues.warn(
            join(term_path, key),
            f"{show(key)} is kept but not applied: Trainyard selects nodes by their labels only",
            "not_applied",
        )
    expressions = term.get("matchExpressions")
    epath = join(term_path, "matchExpressions")
    if expressions is None:
        return []
    if not isinstance(expressions, list):
        issues.error(
            epath, f"matchExpressions must be a list, not {json_type(expressions)}", "type"
        )
        return []
    found: list[tuple[str, list[str], str]] = []
    for i, expression in enumerate(expressions):
        where = f"{epath}[{i}]"
        if not isinstance(expression, dict):
            issues.error(
                where, f"a match expression must be an object, not {json_type(expression)}", "type"
            )
            continue
        key = issues.string(expression, "key", where, required=True, non_blank=True)
        operator = issues.string(expression, "operator", where, required=True, non_blank=True)
        before = len(issues.errors)
        values = _strings(expression.get("values"), join(where, "values"), "values", issues)
        if key is None or operator is None or len(issues.errors) > before:
            continue
        if operator == "In" and values and (key in gpu_labels or len(values) == 1):
            found.append((key, values, where))
            continue
        if operator == "In" and not values:
            issues.error(join(where, "values"), "operator In needs at least one value", "required")
            continue
        written = f"{key} {operator} ({', '.join(values)})" if values else f"{key} {operator}"
        issues.warn(
            where,
            f"the node affinity {written} is kept but not applied: Trainyard "
            "applies In on a GPU model label (" + ", ".join(gpu_labels) + ") and In "
            "with one value on other labels",
            "not_applied",
        )
    return found


def _training_container(containers: list[Any], preferred: tuple[str, ...]) -> int:
    names = [c.get("name") if isinstance(c, dict) else None for c in containers]
    return next((names.index(wanted) for wanted in preferred if wanted in names), 0)


def template_field_path(
    template: Any, path: str, field: str, preferred: tuple[str, ...] = ()
) -> str:
    """Where a canonical role field is written in the pod template at ``path``, read as
    ``pod_template`` reads it: the training container, and of a resource the table
    (requests or limits) its figure was taken from. Total: a template it cannot follow
    gets the nearest enclosing path."""
    if not isinstance(template, dict):
        return path
    pod, spec_path = template.get("spec"), join(path, "spec")
    if pod is None and "containers" in template:
        pod, spec_path = template, path
    if field in ("node_selector", "gpu_types") and isinstance(pod, dict):
        return _constraint_path(pod, spec_path, field)
    containers = pod.get("containers") if isinstance(pod, dict) else None
    if not isinstance(containers, list) or not containers:
        return spec_path
    chosen = _training_container(containers, preferred)
    cpath = f"{join(spec_path, 'containers')}[{chosen}]"
    container = containers[chosen]
    if not isinstance(container, dict):
        return cpath
    if field == "command":
        return join(
            cpath, "command" if "command" in container or "args" not in container else "args"
        )
    if field in ("image", "env"):
        return join(cpath, field)
    if field == "shm_mb":
        return join(spec_path, "volumes")
    key = RESOURCE_KEYS.get(field)
    if key is None:
        return join(cpath, "resources") if field == "gpu_type" else cpath
    resources = container.get("resources")
    order = RESOURCE_ORDER[key]
    part = next(
        (
            p
            for p in order
            if isinstance(resources, dict)
            and isinstance(resources.get(p), dict)
            and key in resources[p]
        ),
        order[0],
    )
    return join(join(join(cpath, "resources"), part), key)


def _constraint_path(
    pod: dict[str, Any], spec_path: str, field: str, gpu_labels: tuple[str, ...] = GPU_MODEL_LABELS
) -> str:
    """Where ``node_constraints`` read the role's GPU models or node labels from: the
    first place that gave one (nodeSelector, then the affinity's expressions)."""
    gpu = field == "gpu_types"
    selector = pod.get("nodeSelector")
    if isinstance(selector, dict):
        for key in selector:
            if (key in gpu_labels) == gpu:
                return join(join(spec_path, "nodeSelector"), str(key))
    rpath = join(join(join(spec_path, "affinity"), "nodeAffinity"), REQUIRED_NODE_AFFINITY)
    try:
        terms = pod["affinity"]["nodeAffinity"][REQUIRED_NODE_AFFINITY]["nodeSelectorTerms"]
        expressions = terms[0]["matchExpressions"]
    except (KeyError, IndexError, TypeError):
        return spec_path
    epath = f"{join(rpath, 'nodeSelectorTerms')}[0].matchExpressions"
    for i, expression in enumerate(expressions if isinstance(expressions, list) else []):
        if isinstance(expression, dict) and (expression.get("key") in gpu_labels) == gpu:
            return f"{epath}[{i}]"
    return spec_path


def _env(raw: Any, path: str, issues: Issues) -> list[EnvVar]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        issues.error(path, f"env must be a list, not {json_type(raw)}", "type")
        return []
    out: list[EnvVar] = []
    for i, entry in enumerate(raw):
        epath = f"{path}[{i}]"
        if not isinstance(entry, dict):
            issues.error(epath, f"an env entry must be an object, not {json_type(entry)}", "type")
            continue
        name = issues.string(entry, "name", epath, required=True, non_blank=True)
        if "valueFrom" in entry:
            issues.warn(
                join(epath, "valueFrom"),
                f"env {show(name)} takes its value from "
                "another resource (valueFrom); Trainyard cannot resolve it, so the "
                "variable is not set",
                "not_applied",
            )
            continue
        value = entry.get("value", "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            issues.error(
                join(epath, "value"),
                f"env value must be a string, not {json_type(value)} (quote it in YAML)",
                "type",
            )
            continue
        if name is not None and (problem := env_problem(name, value)):
            issues.error(epath, problem)
        elif name is not None:
            out.append(EnvVar(name=name, value=value))
    return out


def _amount(raw: dict[str, Any], key: str, path: str, issues: Issues) -> Decimal | None:
    if key not in raw:
        return None
    value = quantity(raw[key])
    if value is None:
        issues.error(
            join(path, key),
            f"{key} {show(raw[key])} is not a Kubernetes quantity (e.g. 500m, 2, 512Mi, 8Gi)",
            "type",
        )
        return None
    return value


def _resources(raw: Any, path: str, issues: Issues) -> Resources:
    resources = Resources()
    if raw is None:
        return resources
    if not isinstance(raw, dict):
        issues.error(path, f"resources must be an object, not {json_type(raw)}", "type")
        return resources
    tables: dict[str, dict[str, Any]] = {}
    for part in ("requests", "limits"):
        table = raw.get(part)
        if table is None:
            continue
        if not isinstance(table, dict):
            issues.error(join(path, part), f"{part} must be an object", "type")
            continue
        tables[part] = table
    for key in sorted(k for k in raw if k not in ("requests", "limits")):
        issues.warn(
            join(path, key), f"resources field {show(key)} is kept but not applied", "not_applied"
        )
    known = {"cpu", "memory", GPU_RESOURCE, "ephemeral-storage"}
    amounts: dict[str, dict[str, Decimal]] = {}
    for part, table in tables.items():
        ppath = join(path, part)
        for key in table:
            if key not in known:
                issues.warn(
                    join(ppath, key),
                    f"resource {show(key)} is not one Trainyard "
                    "schedules (cpu, memory, nvidia.com/gpu, ephemeral-storage); it "
                    "is kept but not reserved",
                    "not_applied",
                )
                continue
            value = _amount(table, key, ppath, issues)
            if value is not None:
                amounts.setdefault(key, {})[part] = value
    for key, parts in amounts.items():
        if "requests" in parts and "limits" in parts and parts["limits"] < parts["requests"]:
            issues.error(
                join(join(path, "limits"), key),
                f"limits {key} must not be less than requests {key}",
                "range",
            )

    def pick(key: str, order: tuple[str, str]) -> tuple[Decimal, str] | None:
        for part in order:
            if part in amounts.get(key, {}):
                return amounts[key][part], join(join(path, part), key)
        return None

    cpu = pick("cpu", RESOURCE_ORDER["cpu"])
    if cpu is not None:
        if cpu[0] <= 0 or cpu[0] > INT_MAX:
            issues.error(cpu[1], f"cpu must be more than 0, got {cpu[0]}", "range")
        else:
            resources.cpu = float(cpu[0])
    memory = pick("memory", RESOURCE_ORDER["memory"])
    if memory is not None:
        mb = math.ceil(memory[0] / MIB) if memory[0] > 0 else 0
        if mb <= 0 or mb > INT_MAX:
            issues.error(
                memory[1], f"memory must be more than 0 and at most {INT_MAX} MiB", "range"
            )
        else:
            resources.memory_mb = mb
    gpu = pick(GPU_RESOURCE, RESOURCE_ORDER[GPU_RESOURCE])
    if gpu is not None:
        if gpu[0] != gpu[0].to_integral_value() or gpu[0] < 0 or gpu[0] > INT_MAX:
            issues.error(
                gpu[1], f"{GPU_RESOURCE} must be a whole number of GPUs, got {gpu[0]}", "range"
            )
        else:
            resources.gpu = float(gpu[0])
    storage = pick("ephemeral-storage", RESOURCE_ORDER["ephemeral-storage"])
    if storage is not None and 0 <= storage[0] <= Decimal(INT_MAX) * GIB:
        resources.storage_gb = math.ceil(storage[0] / GIB)
    return resources


def _volumes(
    pod: dict[str, Any], container: dict[str, Any], spec_path: str, cpath: str, issues: Issues
) -> tuple[int | None, list[DataSource]]:
    """The size of a memory-backed emptyDir mounted at /dev/shm (T9k's and Kubeflow's
    documented way to give a task shared memory), in MB; and the PersistentVolumeClaims
    the container mounts (T9k's examples keep their data and outputs on one), each
    mount a ``pvc://<claim>[/<subPath>]`` at its mountPath. Other volumes are warned of,
    kept but not mounted."""
    volumes = pod.get("volumes")
    mounts = container.get("volumeMounts")
    by_name: dict[str, tuple[int, dict[str, Any]]] = {}
    if isinstance(volumes, list):
        for i, volume in enumerate(volumes):
            if isinstance(volume, dict) and isinstance(volume.get("name"), str):
                by_name[volume["name"]] = (i, volume)
    elif volumes is not None:
        issues.error(join(spec_path, "volumes"), "volumes must be a list", "type")
    shm_volume: str | None = None
    mounted: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    if isinstance(mounts, list):
        for j, mount in enumerate(mounts):
            if not isinstance(mount, dict) or not isinstance(mount.get("name"), str):
                continue
            if mount.get("mountPath") == SHM_PATH:
                shm_volume = mount["name"]
            else:
                mounted.setdefault(mount["name"], []).append((j, mount))
    elif mounts is not None:
        issues.error(join(cpath, "volumeMounts"), "volumeMounts must be a list", "type")
    size: int | None = None
    claims: list[DataSource] = []
    for name, (i, volume) in by_name.items():
        vpath = f"{join(spec_path, 'volumes')}[{i}]"
        empty = volume.get("emptyDir")
        if name == shm_volume and isinstance(empty, dict) and empty.get("medium") == "Memory":
            limit = quantity(empty.get("sizeLimit")) if "sizeLimit" in empty else None
            if limit is not None and limit > 0:
                size = min(math.ceil(limit / MIB), INT_MAX)
            continue
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, dict) and name in mounted:
            claims += _claim_mounts(claim, mounted[name], vpath, join(cpath, "volumeMounts"),
                                    issues)  # fmt: skip
            continue
        kinds = ", ".join(sorted(k for k in volume if k != "name")) or "no source"
        issues.warn(
            vpath,
            f"volume {show(name)} ({kinds}) is kept but not mounted: "
            "Trainyard tasks see the node's file system",
            "not_applied",
        )
    return size, claims


def _claim_mounts(
    claim: dict[str, Any],
    mounts: list[tuple[int, dict[str, Any]]],
    vpath: str,
    mounts_path: str,
    issues: Issues,
) -> list[DataSource]:
    """A claim's mounts in the container, as data sources (``pvc://<claim>[/<sub>]``)."""
    name = issues.string(claim, "claimName", join(vpath, "persistentVolumeClaim"),
                         required=True, pattern=DNS_SUBDOMAIN_RE,
                         rule="a lowercase RFC 1123 subdomain")  # fmt: skip
    out: list[DataSource] = []
    for j, mount in mounts:
        mpath = f"{mounts_path}[{j}]"
        where = issues.string(mount, "mountPath", mpath, required=True, non_blank=True)
        sub = issues.string(mount, "subPath", mpath, required=False) or ""
        if sub.startswith("/") or ".." in sub.split("/"):
            issues.error(join(mpath, "subPath"), f"subPath {show(sub)} must be a relative "
                         "path without '..'", "pattern")  # fmt: skip
            continue
        if name and where:
            read_only = claim.get("readOnly") is True or mount.get("readOnly") is True
            out.append(DataSource(source=f"pvc://{name}" + (f"/{sub}" if sub else ""),
                                  mount_path=where, read_only=read_only))  # fmt: skip
    return out


# ----------------------------------------------------------------------- showing back


def timestamp(value: Any) -> str | None:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times."""
    if isinstance(value, datetime):
        text = value.isoformat()
    elif isinstance(value, str) and value:
        text = value
    else:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC)
    return parsed.strftime("%Y-%m-%dT%H:%M:%SZ")


def latest_tasks(view: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each task of the job's latest attempt (the view lists every attempt)."""
    tasks = [t for t in view.get("tasks") or [] if isinstance(t, dict)]
    attempt = max((t.get("attempt") or 1 for t in tasks), default=1)
    return {
        (str(t.get("role")), int(t.get("index") or 0)): t
        for t in tasks
        if (t.get("attempt") or 1) == attempt
    }


def restarts(view: dict[str, Any], role: str) -> int:
    """How many times a role's tasks were started again (earlier attempts)."""
    tasks = [t for t in view.get("tasks") or [] if isinstance(t, dict) and t.get("role") == role]
    return max(0, len({t.get("attempt") for t in tasks}) - 1)


def is_paused(view: dict[str, Any]) -> bool:
    """PAUSED; or submitted to start paused (T9k runMode.pause, Kubeflow suspend) and
    not yet announced so: a resumed job (a later attempt) is no longer paused."""
    if view.get("state") == "PAUSED":
        return True
    spec = view.get("spec") or {}
    return (
        isinstance(spec, dict)
        and spec.get("run_mode") == "pause"
        and (view.get("attempt") or 1) == 1
        and view.get("state") in ("SUBMITTED", "ACCEPTED", "QUEUED")
    )


def resource_metadata(view: dict[str, Any], original: dict[str, Any]) -> dict[str, Any]:
    """The resource's metadata as stored: what the user sent plus the server's fields."""
    meta = original.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta["uid"] = view.get("id")
    created = timestamp(view.get("submitted_at"))
    if created:
        meta["creationTimestamp"] = created
    # The API server's own fields, where the reader gave them (status's views).
    if view.get("resource_version") is not None:
        meta["resourceVersion"] = str(view["resource_version"])
    meta["generation"] = int(view.get("generation") or 1)
    deleted = timestamp(view.get("deleted_at"))
    if deleted:
        meta["deletionTimestamp"] = deleted
    meta.setdefault("namespace", "default")
    warnings = [
        f"{w.get('path')}: {w.get('message')}"
        for w in view.get("warnings") or []
        if isinstance(w, dict)
    ]
    if warnings:
        annotations = meta.get("annotations")
        annotations = dict(annotations) if isinstance(annotations, dict) else {}
        annotations["trainyard.dev/warnings"] = "\n".join(warnings)
        meta["annotations"] = annotations
    return meta


def condition(kind: str, status: bool, reason: str, message: str, at: str | None) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
    }


def rejection_message(view: dict[str, Any]) -> str:
    errors = [
        f"{e.get('path')}: {e.get('message')}"
        for e in view.get("errors") or []
        if isinstance(e, dict)
    ]
    return "; ".join(errors) or str(view.get("reason") or "rejected")


# ------------------------------------------------------------------ PATCH of a submitted job


@dataclass
class Control:
    """What a PATCH of a submitted job asks for: pause (True) or resume (False), new
    replica counts of elastic roles, or the reasons it cannot be done."""

    pause: bool | None = None
    scale: dict[str, int] = field(default_factory=dict)
    errors: list[FieldIssue] = field(default_factory=list)


MERGE_PATCH = "application/merge-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch (what ``kubectl patch --type=merge`` sends): objects
    merge key by key, null deletes a key, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def without(value: Any, path: tuple[str, ...]) -> Any:
    """``value`` with the field at ``path`` removed ("*": in every item of a list)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if head == "*" and isinstance(value, list):
        return [without(item, rest) for item in value]
    if not isinstance(value, dict) or head not in value:
        return value
    if not rest:
        return {k: v for k, v in value.items() if k != head}
    return {**value, head: without(value[head], rest)}


def _hollow(value: Any) -> bool:
    return isinstance(value, dict) and all(_hollow(v) for v in value.values())


def first_difference(old: Any, new: Any, path: str = "$") -> str | None:
    """The JSON path of the first place ``new`` differs from ``old``, or None. An empty
    object is no different from none (a merge patch that deletes a field's last key
    leaves one)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in old or key not in new:
                if _hollow((old if key in old else new)[key]):
                    continue
                return join(path, str(key))
            found = first_difference(old[key], new[key], join(path, str(key)))
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if old == new and type(old) is type(new):
        return None
    return None if _same_quantity(old, new) else path


def _same_quantity(old: Any, new: Any) -> bool:
    """A number and a string of the same quantity (``1`` and ``"1"``): the Kubeflow SDK
    types a container's limits as strings, so its get_job then update_job sends back as
    "1" what was written 1, a change of nothing."""
    pair = {type(old), type(new)}
    if str not in pair or bool in pair or not pair & {int, float}:
        return False
    a, b = quantity(old), quantity(new)
    return a is not None and a == b


# Metadata the server writes: a client's copy of them is ignored on a write.
SERVER_METADATA = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
# Kubernetes' ObjectMeta: every object takes these, the server's and the writer's.
OBJECT_META_FIELDS = SERVER_METADATA | {
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
}


# A label's or annotation's key (a qualified name: an optional DNS subdomain prefix and
# "/", then a name of at most 63 characters) and a label's value, as Kubernetes has them.
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MAX_KEY = 253 + 1 + 63
MAX_ANNOTATIONS = 256 * 1024  # the API server's bound on all of an object's annotations


def unknown_metadata(meta: dict[str, Any], issues: Issues) -> None:
    """Warn of a metadata key that is not ObjectMeta's, as the API server's strict field
    validation (kubectl's default) refuses it; ObjectMeta's own keys are Kubernetes'.
    Refuse labels and annotations the API server refuses: anything but a map of text to
    text, a key that is not a qualified name, a label value that is not one, annotations
    past 256 KiB (kept as given, a list or a number there broke every typed client's
    read of the object, and of every list it was in)."""
    for extra in sorted(str(k) for k in meta if k not in OBJECT_META_FIELDS):
        issues.warn(
            join("$.metadata", extra),
            f"metadata.{extra} is not a field of ObjectMeta",
            "unknown_field",
        )
    for field_name in ("labels", "annotations"):
        _string_map(meta, field_name, issues)


def _string_map(meta: dict[str, Any], field_name: str, issues: Issues) -> None:
    where = join("$.metadata", field_name)
    values = meta.get(field_name)
    if values is None:
        return
    if not isinstance(values, dict):
        issues.error(where, f"{field_name} must be an object of strings, not {json_type(values)}",
                     "type")  # fmt: skip
        return
    size = 0
    for key, value in values.items():
        key = str(key)  # a body's keys are text; a caller's dict may hold others
        at = join(where, key)
        # fullmatch: "$" also matches before a final newline.
        if not (len(key) <= MAX_KEY and LABEL_KEY_RE.fullmatch(key)):
            issues.error(at, f"{field_name[:-1]} key {show(key)} is not a qualified name "
                         "(an optional DNS prefix and '/', then at most 63 letters, digits, "
                         "'-', '_' or '.', beginning and ending alphanumeric)", "pattern")  # fmt: skip
        if not isinstance(value, str):
            issues.error(at, f"{field_name[:-1]} {show(key)} must be a string, not "
                         f"{json_type(value)}", "type")  # fmt: skip
        elif field_name == "labels" and not LABEL_VALUE_RE.fullmatch(value):
            issues.error(at, f"label value {show(value)} must be at most 63 letters, digits, "
                         "'-', '_' or '.', beginning and ending alphanumeric", "pattern")  # fmt: skip
        else:
            size += len(key.encode()) + len(value.encode())  # bytes, as the API server
    if field_name == "annotations" and size > MAX_ANNOTATIONS:
        issues.error(where, f"annotations may hold at most {MAX_ANNOTATIONS} bytes in all, "
                     f"not {size}", "range")  # fmt: skip


# What Kubernetes lets every object's writer change at any time.
FREE_METADATA = tuple(
    ("metadata", name) for name in ("labels", "annotations", "finalizers", "ownerReferences")
)


def immutable_change(
    current: dict[str, Any],
    patched: dict[str, Any],
    changeable: tuple[tuple[str, ...], ...],
    allowed: str,
) -> FieldIssue | None:
    """The first change a PATCH makes outside the ``changeable`` fields, as an error."""
    old, new = current, patched
    for path in (("status",), *FREE_METADATA, *changeable):
        old, new = without(old, path), without(new, path)
    where = first_difference(old, new)
    if where is None:
        return None
    return FieldIssue(
        path=where,
        code="immutable",
        message=(
            f"{where.removeprefix('$.')} cannot be changed on a submitted job; a PATCH may "
            f"change {allowed}"
        ),
    )


def elastic_scale(role: RoleSpec, replicas: Any, path: str, errors: list[FieldIssue]) -> int | None:
    """``replicas`` for an elastic role, checked against its bounds."""
    if role.min_replicas is None or role.max_replicas is None:
        errors.append(
            FieldIssue(
                path=path,
                code="immutable",
                message=(f"the replicas of role {role.name!r} cannot change: it is not elastic"),
            )
        )
        return None
    if (
        isinstance(replicas, bool)
        or not isinstance(replicas, int)
        or not (role.min_replicas <= replicas <= role.max_replicas)
    ):
        errors.append(
            FieldIssue(
                path=path,
                code="range",
                message=(
                    f"role {role.name!r} scales between {role.min_replicas} and "
                    f"{role.max_replicas} replicas, not {show(replicas)}"
                ),
            )
        )
        return None
    return replicas
