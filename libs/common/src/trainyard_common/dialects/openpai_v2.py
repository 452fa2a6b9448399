"""OpenPAI job protocol v2 (the YAML of OpenPAI >= 0.14 and its rest-server's
``POST /api/v2/jobs``) to and from the canonical job.

Sources, read for the meaning of every field (our code, not theirs):
- the protocol spec, microsoft/pai ``docs/pai-job-protocol.yaml`` (moved to
  microsoft/openpai-protocol ``schemas/v2/schema.yaml``);
- the rest-server that runs it: ``src/rest-server/src/config/v2/protocol.js`` (the JSON
  schema), ``src/rest-server/src/middlewares/v2/protocol.js`` (prerequisite checks and the
  rendering of commands) and ``src/rest-server/src/models/v2/job/k8s.js`` (defaults).

What OpenPAI does, and so what we do:
- commands (with the selected deployment's preCommands / postCommands around them) are
  each trimmed and joined with newlines into one script;
- ``<% $parameters.x %>``, ``<% $data.x %>``, ``<% $script.x %>``, ``<% $output.x %>``
  are rendered at submission; any other reference is left as ``<% x %>``;
- ``<% $secrets.x %>`` is never rendered at submission ("Will not render secret here for
  security issue"): the runtime substitutes it in the container. Here the launcher does
  (``substitute_secrets``), and the secret values travel only in ``JobSpec.secrets``;
- completion: ``-1`` turns a rule off (min_failed / min_succeeded None); a missing or null
  value takes the default (minFailedInstances 1, minSucceededInstances = instances);
- every task role gets an ``ssh`` and an ``http`` port unless it names them itself (the
  runtime's PAI_CONTAINER_SSH_PORT / PAI_CURRENT_CONTAINER_PORT come from them).
"""

from __future__ import annotations

import copy
import math
import re
from decimal import Decimal
from typing import Any

from ..events import FieldIssue
from ..jobspec import REDACTED, EnvVar, JobSpec, PortSpec, Resources, RestartPolicy, RoleSpec
from ..limits import MAX_RENDERED, TooLong, bounded_sub, digits
from .fields import boolean_hint, mapping
from .registry import Dialect
from .translation import (
    INT_MAX,
    Issues,
    Translation,
    as_int,
    bounded_int,
    empty_spec,
    join,
    json_type,
    show,
)

DIALECT = "openpai_v2"

# OpenPAI v2's own rules (protocol.js): job names, task role names, port labels.
NAME_RE = re.compile(r"[a-zA-Z0-9_-]+")
NAME_RULE = r"^[a-zA-Z0-9_-]+$"
NAME_MAX = 255
IDENT_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
IDENT_RULE = r"^[a-zA-Z_][a-zA-Z0-9_]*$"

PREREQUISITE_TYPES = ("data", "script", "output", "dockerimage")
# The task role field that selects a prerequisite, by prerequisite type.
ROLE_REFERENCE = {
    "dockerimage": "dockerImage",
    "data": "data",
    "script": "script",
    "output": "output",
}

JOB_KEYS = frozenset(
    {
        "protocolVersion",
        "name",
        "type",
        "version",
        "contributor",
        "description",
        "prerequisites",
        "parameters",
        "secrets",
        "jobRetryCount",
        "taskRoles",
        "deployments",
        "defaults",
        "extras",
    }
)
ROLE_KEYS = frozenset(
    {
        "protocolVersion",
        "instances",
        "completion",
        "taskRetryCount",
        "prerequisites",
        "dockerImage",
        "data",
        "output",
        "script",
        "extraContainerOptions",
        "resourcePerInstance",
        "commands",
    }
)
PREREQUISITE_KEYS = frozenset(
    {
        "protocolVersion",
        "name",
        "type",
        "version",
        "contributor",
        "description",
        "auth",
        "uri",
        "plugin",
        "require",
        "failurePolicy",
        "callbacks",
    }
)
# The one prerequisite plugin OpenPAI documents: its taskStarts callbacks run before the
# task's commands (how-to-use-advanced-job-settings.md, "Use Prerequisites").
CMD_PLUGIN = "com.microsoft.pai.runtimeplugin.cmd"
# extras keys whose effect in OpenPAI this platform does not have: kept, and said so.
EXTRAS_NOT_APPLIED = {
    "com.microsoft.pai.runtimeplugin": "runtime plugins (ssh, storage, tensorboard, ...) "
    "are not run",
    "hivedscheduler": "HiveD scheduling hints are not used",
    "storages": "storage mounts are not made",
}

# k8s.js: the container's /dev/shm when extraContainerOptions.shmMB is not given.
DEFAULT_SHM_MB = 512
DEFAULT_PORTS = ("ssh", "http")

_REFERENCE = re.compile(r"<%\s*(.*?)\s*%>", re.DOTALL)
_INDEX = re.compile(r"\[(\d+)\]")

_CANONICAL_ROLE_FIELDS = {
    "replicas": "instances",
    "cpu": "resourcePerInstance.cpu",
    "memory_mb": "resourcePerInstance.memoryMB",
    "gpu": "resourcePerInstance.gpu",
    "shm_mb": "extraContainerOptions.shmMB",
    "ports": "resourcePerInstance.ports",
    "command": "commands",
    "image": "dockerImage",
    "min_failed": "completion.minFailedInstances",
    "min_succeeded": "completion.minSucceededInstances",
}
# HiveD's per-role hints: the SKU (GPU model) a role runs on is the one Trainyard applies,
# as the role's gpu_type; gpuType is its older spelling.
HIVED = "hivedScheduler"
HIVED_SKU_KEYS = ("skuType", "gpuType")

_CANONICAL_JOB_FIELDS = {
    "name": "name",
    "queue": "defaults.virtualCluster",
    "retry_limit": "jobRetryCount",
    "roles": "taskRoles",
    "secrets": "secrets",
}


def field_path(payload: Any, role: str | None, field: str) -> str:
    """Where a canonical field is written in a v2 payload: task roles are a map, so a
    role is ``$.taskRoles.<name>``."""
    if role is not None and field in ("gpu_type", "gpu_types"):
        return _sku_path(payload, role)
    if role is None or field == "queue":
        key = _CANONICAL_JOB_FIELDS.get(field)
        return f"$.{key}" if key else "$"
    path = join("$.taskRoles", role)
    key = _CANONICAL_ROLE_FIELDS.get(field)
    return f"{path}.{key}" if key else path


def _hived_roles(payload: Any) -> dict[str, Any]:
    extras = payload.get("extras") if isinstance(payload, dict) else None
    hived = extras.get(HIVED) if isinstance(extras, dict) else None
    roles = hived.get("taskRoles") if isinstance(hived, dict) else None
    return roles if isinstance(roles, dict) else {}


def hived_sku(payload: Any, role: str) -> tuple[str, str] | None:
    """The role's HiveD SKU type and the key it is written under, if it names one."""
    hints = _hived_roles(payload).get(role)
    for key in HIVED_SKU_KEYS:
        if isinstance(hints, dict) and isinstance(hints.get(key), str) and hints[key].strip():
            return hints[key], key
    return None


def _sku_path(payload: Any, role: str) -> str:
    found = hived_sku(payload, role)
    path = join(join(join("$.extras", HIVED), "taskRoles"), role)
    return join(path, found[1]) if found else join("$.taskRoles", role)


# ---------------------------------------------------------------------------- references


def _lookup(context: dict[str, Any], token: str) -> Any:
    """mustache's lookup of ``$parameters.a.b`` / ``$data.uri[0]``; None when absent."""
    value: Any = context
    for part in _INDEX.sub(r".\1", token).split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and digits(part) and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def js_number(value: float) -> str:
    """A number as JavaScript's String() writes it (ECMAScript's Number::toString): the
    shortest digits that read back, in plain notation from 1e-6 up to 1e21, else as
    1e-7 / 1.5e+21 (Python writes 1e-05 and 1e+16)."""
    if not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    shortest = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, shortest.digits))
    k = len(digits)
    n = k + int(shortest.exponent)  # the value is 0.digits x 10^n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    exponent = f"e{'+' if n > 0 else '-'}{abs(n - 1)}"
    return sign + (digits if k == 1 else digits[0] + "." + digits[1:]) + exponent


def _js_text(value: Any) -> str:
    # How the rest-server's JavaScript writes a value into a string.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return js_number(value)
    if isinstance(value, int) and abs(value) >= 2**53:
        # JavaScript has doubles only: a larger integer is one, written as one is.
        try:
            return js_number(float(value))
        except OverflowError:
            return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, list):
        return ",".join("" if v is None else _js_text(v) for v in value)
    if isinstance(value, dict):
        return "[object Object]"
    return str(value)


def render(
    template: str, context: dict[str, Any], limit: int = MAX_RENDERED
) -> tuple[str, list[str]]:
    """``template`` with every ``<% ref %>`` found in ``context`` replaced; the others
    are left as ``<% ref %>`` (as OpenPAI leaves them). Returns the text and the refs
    left unrendered; raises TooLong as soon as the text would pass ``limit`` characters
    (a value named many times), before it is built."""
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        token = match.group(1)
        value = _lookup(context, token)
        if value is None:
            missing.append(token)
            return f"<% {token} %>"
        return _js_text(value)

    return bounded_sub(_REFERENCE, template, replace, limit), missing


def flatten_secrets(secrets: Any, prefix: str = "") -> list[EnvVar]:
    """``secrets`` as name/value pairs, nested values under dotted names
    (``{"db": {"pw": "x"}}`` -> ``db.pw``; lists by index), which is how
    ``<% $secrets.db.pw %>`` / ``<% $secrets.list[0] %>`` name them."""
    pairs: list[EnvVar] = []
    if isinstance(secrets, dict):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in secrets.items()]
    elif isinstance(secrets, list):
        items = [(str(i), v) for i, v in enumerate(secrets)]
    else:
        return (
            [EnvVar(name=prefix, value=_js_text(secrets))] if prefix and secrets is not None else []
        )
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict | list):
            pairs.extend(flatten_secrets(value, name))
        elif value is not None:
            pairs.append(EnvVar(name=name, value=_js_text(value)))
    return pairs


# ------------------------------------------------------------------------------- checking


class _Walk:
    """One pass over a v2 payload: the errors and warnings, and what translation needs
    (prerequisites by type and name, the selected deployment)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.issues = Issues()
        self.prerequisites: dict[str, dict[str, dict[str, Any]]] = {
            t: {} for t in PREREQUISITE_TYPES
        }
        self.deployment: dict[str, Any] | None = None
        # What the rendered commands of all task roles together may still take.
        self.render_budget = MAX_RENDERED

    def run(self) -> None:
        p, issues = self.payload, self.issues
        version = p.get("protocolVersion")
        if "protocolVersion" not in p:
            issues.error("$.protocolVersion", "protocolVersion is required (2)", "required")
        elif version not in (2, "2") or isinstance(version, bool):
            issues.error(
                "$.protocolVersion", f"protocolVersion must be 2, not {show(version)}", "invalid"
            )
        name = issues.string(p, "name", "$", required=True, pattern=NAME_RE, rule=NAME_RULE)
        if name is not None and len(name) > NAME_MAX:
            issues.error("$.name", f"name must be at most {NAME_MAX} characters", "range")
        kind = issues.string(p, "type", "$", required=True)
        if kind is not None and kind != "job":
            issues.error("$.type", f"type must be 'job', not {show(kind)}", "invalid")
        for key in ("contributor", "description"):
            issues.string(p, key, "$", required=False)
        version_field = p.get("version")
        if version_field is not None and (
            isinstance(version_field, bool) or not isinstance(version_field, str | int | float)
        ):
            issues.error("$.version", "version must be a string or a number", "type")
        issues.integer(p, "jobRetryCount", "$", required=False, minimum=0)
        for key in ("parameters", "secrets", "extras", "defaults"):
            if p.get(key) is not None and not isinstance(p[key], dict):
                issues.error(
                    join("$", key), f"{key} must be an object, not {json_type(p[key])}", "type"
                )
        self._parameters()
        self._prerequisites()
        self._deployments()
        self._defaults()
        self._extras()
        for key in sorted((k for k in p if k not in JOB_KEYS), key=str):
            issues.warn(
                join("$", str(key)), f"unknown field {show(key)} is ignored", "unknown_field"
            )
        self._task_roles()

    def _parameters(self) -> None:
        params = self.payload.get("parameters")
        if isinstance(params, dict):
            for key, value in params.items():
                if isinstance(value, dict | list):
                    self.issues.warn(
                        join("$.parameters", str(key)),
                        f"parameter {show(key)} is {json_type(value)}; "
                        "reference its members (<% $parameters.a.b %>)",
                        "parameter_not_scalar",
                    )

    def _prerequisites(self) -> None:
        raw = self.payload.get("prerequisites")
        if raw is None:
            return
        issues = self.issues
        if not isinstance(raw, list):
            issues.error(
                "$.prerequisites", f"prerequisites must be a list, not {json_type(raw)}", "type"
            )
            return
        for i, item in enumerate(raw):
            path = f"$.prerequisites[{i}]"
            if not isinstance(item, dict):
                issues.error(
                    path, f"a prerequisite must be an object, not {json_type(item)}", "type"
                )
                continue
            name = issues.string(item, "name", path, required=True, non_blank=True)
            kind = issues.string(item, "type", path, required=True)
            if kind is not None and kind not in PREREQUISITE_TYPES:
                issues.error(
                    f"{path}.type",
                    f"type must be one of {', '.join(PREREQUISITE_TYPES)}, not {show(kind)}",
                    "invalid",
                )
                continue
            if kind == "dockerimage":
                issues.string(item, "uri", path, required=True, non_blank=True)
                auth = item.get("auth")
                if auth is not None:
                    if not isinstance(auth, dict):
                        issues.error(f"{path}.auth", "auth must be an object", "type")
                    else:
                        issues.warn(
                            f"{path}.auth",
                            "registry credentials are kept but not "
                            "used: images are pulled without them",
                            "auth_not_used",
                        )
            elif kind is not None:
                uri = item.get("uri")
                if (
                    kind == "data"
                    and uri is not None
                    and not (
                        isinstance(uri, str)
                        or isinstance(uri, list)
                        and all(isinstance(u, str) for u in uri)
                    )
                ):
                    issues.error(f"{path}.uri", "uri must be a string or a list of strings", "type")
                elif kind != "data" and uri is not None and not isinstance(uri, str):
                    issues.error(
                        f"{path}.uri", f"uri must be a string, not {json_type(uri)}", "type"
                    )
                if item.get("plugin") != CMD_PLUGIN:
                    issues.warn(
                        path,
                        f"{kind} prerequisite {show(name)} is kept and can be "
                        f"referenced as <% ${kind}.… %>, but nothing is fetched or "
                        "copied for it",
                        "prerequisite_not_fetched",
                    )
            if item.get("plugin") not in (None, CMD_PLUGIN):
                issues.warn(
                    f"{path}.plugin",
                    f"plugin {show(item.get('plugin'))} is not run; only {CMD_PLUGIN} is",
                    "plugin_not_applied",
                )
            self._callbacks(item, path)
            if name is not None and kind in self.prerequisites:
                if name in self.prerequisites[kind]:
                    issues.error(
                        f"{path}.name", f"duplicate {kind} prerequisite {show(name)}", "duplicate"
                    )
                else:
                    self.prerequisites[kind][name] = item
            for key in sorted((k for k in item if k not in PREREQUISITE_KEYS), key=str):
                issues.warn(
                    join(path, str(key)),
                    f"unknown prerequisite field {show(key)} is ignored",
                    "unknown_field",
                )

    def _callbacks(self, item: dict[str, Any], path: str) -> None:
        callbacks = item.get("callbacks")
        if callbacks is None:
            return
        cpath = f"{path}.callbacks"
        if not isinstance(callbacks, list):
            self.issues.error(cpath, "callbacks must be a list", "type")
            return
        for k, callback in enumerate(callbacks):
            if not isinstance(callback, dict):
                self.issues.error(f"{cpath}[{k}]", "a callback must be an object", "type")
                continue
            event = callback.get("event")
            self._string_list(callback, "commands", f"{cpath}[{k}]", required=True)
            if event != "taskStarts":
                self.issues.warn(
                    f"{cpath}[{k}].event",
                    f"callbacks on {show(event)} are not run; only taskStarts is",
                    "callback_not_applied",
                )

    def _deployments(self) -> None:
        raw = self.payload.get("deployments")
        if raw is None:
            return
        if not isinstance(raw, list):
            self.issues.error(
                "$.deployments", f"deployments must be a list, not {json_type(raw)}", "type"
            )
            return
        seen: set[str] = set()
        for i, item in enumerate(raw):
            path = f"$.deployments[{i}]"
            if not isinstance(item, dict):
                self.issues.error(path, "a deployment must be an object", "type")
                continue
            name = self.issues.string(item, "name", path, required=True, non_blank=True)
            if name is not None:
                if name in seen:
                    self.issues.error(
                        f"{path}.name", f"duplicate deployment {show(name)}", "duplicate"
                    )
                seen.add(name)
            roles = item.get("taskRoles")
            if not isinstance(roles, dict):
                self.issues.error(
                    f"{path}.taskRoles",
                    "taskRoles is required (an object of task role names)",
                    "required" if roles is None else "type",
                )
                continue
            for role, hooks in roles.items():
                rpath = join(f"{path}.taskRoles", str(role))
                if not isinstance(hooks, dict):
                    self.issues.error(
                        rpath, "must be an object with preCommands / postCommands", "type"
                    )
                    continue
                for key in ("preCommands", "postCommands"):
                    self._string_list(hooks, key, rpath, required=False)
                for key in sorted(
                    (k for k in hooks if k not in ("preCommands", "postCommands")), key=str
                ):
                    self.issues.warn(
                        join(rpath, str(key)),
                        f"unknown field {show(key)} is ignored",
                        "unknown_field",
                    )

    def _defaults(self) -> None:
        defaults = self.payload.get("defaults")
        if not isinstance(defaults, dict):
            return
        self.issues.string(defaults, "virtualCluster", "$.defaults", required=False)
        chosen = self.issues.string(defaults, "deployment", "$.defaults", required=False)
        if chosen is not None:
            deployments = self.payload.get("deployments")
            found = (
                [d for d in deployments if isinstance(d, dict) and d.get("name") == chosen]
                if isinstance(deployments, list)
                else []
            )
            if not found:
                self.issues.error(
                    "$.defaults.deployment",
                    f"deployment {show(chosen)} is not in deployments",
                    "reference",
                )
            else:
                self.deployment = found[0]

    def _extras(self) -> None:
        extras = self.payload.get("extras")
        if not isinstance(extras, dict):
            return
        for key, why in EXTRAS_NOT_APPLIED.items():
            if key in extras:
                self.issues.warn(join("$.extras", key), f"kept, but {why}", "extras_not_applied")
        if HIVED in extras:
            self._hived(extras[HIVED], join("$.extras", HIVED))
        gang = extras.get("gangAllocation")
        if gang is not None and not isinstance(gang, bool):
            self.issues.error(
                join("$.extras", "gangAllocation"),
                f"gangAllocation must be a boolean, not {json_type(gang)}{boolean_hint(gang)}",
                "type",
            )

    def _hived(self, hived: Any, path: str) -> None:
        """Warn of every HiveD hint but a role's SKU type, which is applied."""
        issues = self.issues
        if not isinstance(hived, dict):
            issues.error(path, f"{HIVED} must be an object, not {json_type(hived)}", "type")
            return
        for key in sorted(k for k in hived if k != "taskRoles"):
            issues.warn(
                join(path, key),
                "kept, but HiveD scheduling hints other than a role's skuType are not used",
                "extras_not_applied",
            )
        roles = hived.get("taskRoles")
        rpath = join(path, "taskRoles")
        if roles is None:
            return
        if not isinstance(roles, dict):
            issues.error(rpath, f"taskRoles must be an object, not {json_type(roles)}", "type")
            return
        declared = self.payload.get("taskRoles")
        declared = declared if isinstance(declared, dict) else {}
        for name, hints in roles.items():
            hpath = join(rpath, str(name))
            if name not in declared:
                issues.warn(
                    hpath,
                    f"names no task role ({show(name)}); kept but not used",
                    "unknown_reference",
                )
            if not isinstance(hints, dict):
                issues.error(
                    hpath, f"a role's HiveD hints must be an object, not {json_type(hints)}", "type"
                )
                continue
            for key in HIVED_SKU_KEYS:
                value = hints.get(key)
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    issues.error(
                        join(hpath, key),
                        f"{key} must be a GPU model name (a non-empty string)",
                        "type",
                    )
            for key in sorted(k for k in hints if k not in HIVED_SKU_KEYS):
                issues.warn(
                    join(hpath, key),
                    "kept, but HiveD scheduling hints other than skuType are not used",
                    "extras_not_applied",
                )

    def _string_list(
        self, obj: dict[str, Any], key: str, path: str, *, required: bool
    ) -> list[str] | None:
        where = join(path, key)
        value = obj.get(key)
        if value is None:
            if required:
                self.issues.error(where, f"{key} is required (a list of strings)", "required")
            return None
        if not isinstance(value, list) or not value:
            self.issues.error(where, f"{key} must be a non-empty list of strings", "type")
            return None
        good = True
        for j, item in enumerate(value):
            if not isinstance(item, str):
                self.issues.error(
                    f"{where}[{j}]", f"must be a string, not {json_type(item)}", "type"
                )
                good = False
        return value if good else None

    def _task_roles(self) -> None:
        issues = self.issues
        roles = self.payload.get("taskRoles")
        if roles is None:
            issues.error(
                "$.taskRoles",
                "taskRoles is required (an object with at least one task role)",
                "required",
            )
            return
        if not isinstance(roles, dict):
            issues.error(
                "$.taskRoles",
                f"taskRoles must be an object of task roles by name, not {json_type(roles)}",
                "type",
            )
            return
        if not roles:
            issues.error("$.taskRoles", "taskRoles must hold at least one task role", "required")
        for name, role in roles.items():
            path = join("$.taskRoles", str(name))
            if not isinstance(name, str) or not IDENT_RE.fullmatch(name):
                issues.error(
                    path, f"task role name {show(name)} must match {IDENT_RULE}", "pattern"
                )
            if not isinstance(role, dict):
                issues.error(path, f"a task role must be an object, not {json_type(role)}", "type")
                continue
            self._task_role(role, path)

    def _task_role(self, role: dict[str, Any], path: str) -> None:
        issues = self.issues
        instances = issues.integer(role, "instances", path, required=False, minimum=1)
        completion = role.get("completion")
        if completion is not None:
            cpath = f"{path}.completion"
            if not isinstance(completion, dict):
                issues.error(
                    cpath, f"completion must be an object, not {json_type(completion)}", "type"
                )
            else:
                for key in ("minFailedInstances", "minSucceededInstances"):
                    _completion_count(
                        completion.get(key), key in completion, key, cpath, instances, issues
                    )
                for key in sorted(
                    (
                        k
                        for k in completion
                        if k not in ("minFailedInstances", "minSucceededInstances")
                    ),
                    key=str,
                ):
                    issues.warn(
                        join(cpath, str(key)),
                        f"unknown completion field {show(key)} is ignored",
                        "unknown_field",
                    )
        retries = issues.integer(role, "taskRetryCount", path, required=False, minimum=0)
        if retries:
            issues.warn(
                f"{path}.taskRetryCount",
                "tasks are not retried one by one; the job is retried as a whole (jobRetryCount)",
                "task_retry_not_applied",
            )
        for kind, key in ROLE_REFERENCE.items():
            ref = issues.string(
                role, key, path, required=key == "dockerImage", non_blank=key == "dockerImage"
            )
            if ref is not None and ref not in self.prerequisites[kind]:
                issues.error(
                    join(path, key), f"{key} {show(ref)} names no {kind} prerequisite", "reference"
                )
        listed = role.get("prerequisites")
        if listed is not None:
            known = {n for by_name in self.prerequisites.values() for n in by_name}
            if not isinstance(listed, list):
                issues.error(
                    f"{path}.prerequisites",
                    "prerequisites must be a list of prerequisite names",
                    "type",
                )
            else:
                for j, ref in enumerate(listed):
                    if not isinstance(ref, str) or ref not in known:
                        issues.error(
                            f"{path}.prerequisites[{j}]",
                            f"prerequisite {show(ref)} does not exist",
                            "reference",
                        )
        options = role.get("extraContainerOptions")
        if options is not None:
            opath = f"{path}.extraContainerOptions"
            if not isinstance(options, dict):
                issues.error(opath, "extraContainerOptions must be an object", "type")
            else:
                issues.integer(options, "shmMB", opath, required=False, minimum=0)
                if options.get("infiniband") is not None and not isinstance(
                    options["infiniband"], bool
                ):
                    issues.error(
                        f"{opath}.infiniband",
                        f"infiniband must be a boolean{boolean_hint(options['infiniband'])}",
                        "type",
                    )
                elif options.get("infiniband"):
                    issues.warn(
                        f"{opath}.infiniband",
                        "InfiniBand devices are not given to tasks",
                        "infiniband_not_applied",
                    )
                for key in sorted(
                    (k for k in options if k not in ("shmMB", "infiniband")), key=str
                ):
                    issues.warn(
                        join(opath, str(key)),
                        f"unknown field {show(key)} is ignored",
                        "unknown_field",
                    )
        self._resources(role, path)
        commands = self._string_list(role, "commands", path, required=True)
        if commands is not None and not "".join(commands).strip():
            issues.error(f"{path}.commands", "commands must not all be empty", "required")
        for key in sorted((k for k in role if k not in ROLE_KEYS), key=str):
            issues.warn(
                join(path, str(key)),
                f"unknown task role field {show(key)} is ignored",
                "unknown_field",
            )

    def _resources(self, role: dict[str, Any], path: str) -> None:
        issues = self.issues
        res = role.get("resourcePerInstance")
        rpath = f"{path}.resourcePerInstance"
        if res is None:
            issues.error(rpath, "resourcePerInstance is required (cpu, memoryMB, gpu)", "required")
            return
        if not isinstance(res, dict):
            issues.error(
                rpath, f"resourcePerInstance must be an object, not {json_type(res)}", "type"
            )
            return
        issues.integer(res, "cpu", rpath, required=True, minimum=1)
        issues.integer(res, "memoryMB", rpath, required=True, minimum=100)
        issues.integer(res, "gpu", rpath, required=True, minimum=0)
        ports = res.get("ports")
        if ports is not None:
            ppath = f"{rpath}.ports"
            if not isinstance(ports, dict) or not ports:
                issues.error(
                    ppath,
                    "ports must be an object of port label: count with at least one label",
                    "type",
                )
            else:
                for label in ports:
                    if not isinstance(label, str) or not IDENT_RE.fullmatch(label):
                        issues.error(
                            join(ppath, str(label)),
                            f"port label {show(label)} must match {IDENT_RULE}",
                            "pattern",
                        )
                    else:
                        issues.integer(ports, label, ppath, required=True, minimum=1, maximum=65535)
        for key in sorted(
            (k for k in res if k not in ("cpu", "memoryMB", "gpu", "ports")), key=str
        ):
            issues.warn(
                join(rpath, str(key)), f"unknown resource {show(key)} is ignored", "unknown_field"
            )


def _completion_count(
    value: Any, present: bool, key: str, path: str, instances: int | None, issues: Issues
) -> None:
    where = f"{path}.{key}"
    if not present or value is None:
        return
    number = as_int(value)
    if number is None:
        issues.error(
            where, f"{key} must be an integer (-1 or at least 1), not {json_type(value)}", "type"
        )
    elif number < -1 or number > INT_MAX:
        # 0 is the schema's (any integer), and k8s.js reads it as unset (falsy).
        issues.error(
            where,
            f"{key} must be -1 (off), 0 (the default) or at least 1, got {show(number)}",
            "range",
        )
    elif instances is not None and number > instances:
        issues.warn(
            where,
            f"{key} ({number}) is larger than instances ({instances}); the rule can never trigger",
            "count_above_tasks",
        )


def check_openpai_v2(payload: Any) -> _Walk | Issues:
    if not isinstance(payload, dict):
        issues = Issues()
        issues.error("$", f"an OpenPAI v2 job must be an object, not {json_type(payload)}", "type")
        return issues
    walk = _Walk(payload)
    walk.run()
    return walk


def _issues(payload: Any) -> Issues:
    checked = check_openpai_v2(payload)
    return checked.issues if isinstance(checked, _Walk) else checked


def validate_openpai_v2(payload: Any) -> list[FieldIssue]:
    return _issues(payload).errors


def openpai_v2_warnings(payload: Any) -> list[FieldIssue]:
    return _issues(payload).warnings


# ---------------------------------------------------------------------------- translation


def _int(value: Any, default: int, minimum: int) -> int:
    return bounded_int(value, default, minimum)  # type: ignore[return-value]


def _min_count(completion: Any, key: str, default: int | None) -> int | None:
    value = completion.get(key) if isinstance(completion, dict) else None
    number = as_int(value)
    if number == -1:
        return None
    if number is None or not 1 <= number <= INT_MAX:
        return default  # absent, null or 0: OpenPAI's default (an invalid value is an error)
    return number


def _ports(res: dict[str, Any]) -> list[PortSpec]:
    raw = res.get("ports")
    ports = (
        [
            PortSpec(label=label, begin_at=0, count=_int(count, 1, 1))
            for label, count in raw.items()
            if isinstance(label, str) and IDENT_RE.fullmatch(label)
        ]
        if isinstance(raw, dict)
        else []
    )
    named = {p.label for p in ports}
    return ports + [PortSpec(label=label) for label in DEFAULT_PORTS if label not in named]


def _start_callbacks(walk: _Walk, role: dict[str, Any]) -> list[str]:
    """The taskStarts commands of the role's cmd-plugin prerequisites, in their order."""
    listed = role.get("prerequisites")
    by_name = {n: item for by_type in walk.prerequisites.values() for n, item in by_type.items()}
    commands: list[str] = []
    for ref in listed if isinstance(listed, list) else []:
        item = by_name.get(ref) if isinstance(ref, str) else None
        if (
            not item
            or item.get("plugin") != CMD_PLUGIN
            or not isinstance(item.get("callbacks"), list)
        ):
            continue
        for callback in item["callbacks"]:
            if (
                isinstance(callback, dict)
                and callback.get("event") == "taskStarts"
                and isinstance(callback.get("commands"), list)
            ):
                commands += [c for c in callback["commands"] if isinstance(c, str)]
    return commands


def _command(
    walk: _Walk,
    name: str,
    role: dict[str, Any],
    path: str,
    parameters: dict[str, Any],
    secret_names: set[str],
) -> str:
    commands = role.get("commands")
    commands = [c for c in commands if isinstance(c, str)] if isinstance(commands, list) else []
    hooks = walk.deployment.get("taskRoles") if walk.deployment else None
    hooks = hooks.get(name) if isinstance(hooks, dict) else None
    if isinstance(hooks, dict):
        pre, post = hooks.get("preCommands"), hooks.get("postCommands")
        commands = (
            ([c for c in pre if isinstance(c, str)] if isinstance(pre, list) else [])
            + commands
            + ([c for c in post if isinstance(c, str)] if isinstance(post, list) else [])
        )
    commands = _start_callbacks(walk, role) + commands
    script = "\n".join(c.strip() for c in commands)

    def selected(kind: str) -> Any:
        ref = role.get(ROLE_REFERENCE[kind])
        return walk.prerequisites[kind].get(ref) if isinstance(ref, str) else None

    context = {
        "$parameters": parameters,
        "$script": selected("script"),
        "$output": selected("output"),
        "$data": selected("data"),
    }
    try:
        rendered, missing = render(script, context, walk.render_budget)
    except TooLong:
        walk.issues.error(
            f"{path}.commands",
            f"the task roles' commands, their <% %> references rendered, come to more than "
            f"{MAX_RENDERED} characters (a value named many times: name it once, or put it "
            "in a file)",
            "too_large",
        )
        return ""
    walk.render_budget -= len(rendered)
    for token in dict.fromkeys(missing):
        if token.startswith("$secrets."):
            secret = _INDEX.sub(r".\1", token[len("$secrets.") :])
            if secret not in secret_names:
                walk.issues.warn(
                    f"{path}.commands",
                    f"<% {token} %> names no secret; it is left as written",
                    "unknown_reference",
                )
        else:
            walk.issues.warn(
                f"{path}.commands",
                f"<% {token} %> names nothing defined; it is left as written",
                "unknown_reference",
            )
    return rendered.strip()


def translate_openpai_v2(payload: Any, user: str = "") -> Translation:
    """Any input to a JobSpec plus the protocol's errors and warnings; never raises."""
    checked = check_openpai_v2(payload)
    if not isinstance(checked, _Walk):
        return Translation(empty_spec(user=user), DIALECT, checked.errors, checked.warnings)
    walk, p = checked, checked.payload
    parameters = mapping(p.get("parameters"))
    secrets = flatten_secrets(p.get("secrets")) if isinstance(p.get("secrets"), dict) else []
    secret_names = {s.name for s in secrets}
    images = walk.prerequisites["dockerimage"]
    roles: list[RoleSpec] = []
    raw_roles = p.get("taskRoles")
    for name, raw in raw_roles.items() if isinstance(raw_roles, dict) else []:
        if not isinstance(raw, dict):
            continue
        path = join("$.taskRoles", str(name))
        res = raw.get("resourcePerInstance")
        res = res if isinstance(res, dict) else {}
        options = raw.get("extraContainerOptions")
        options = options if isinstance(options, dict) else {}
        image_name = raw.get("dockerImage")
        image = images.get(image_name) if isinstance(image_name, str) else None
        uri = image.get("uri") if image else None
        replicas = _int(raw.get("instances"), 1, 1)
        roles.append(
            RoleSpec(
                name=str(name),
                replicas=replicas,
                image=uri if isinstance(uri, str) and uri else None,
                resources=Resources(
                    cpu=float(_int(res.get("cpu"), 1, 1)),
                    memory_mb=_int(res.get("memoryMB"), 1024, 100),
                    shm_mb=_int(options.get("shmMB"), DEFAULT_SHM_MB, 0),
                    gpu=float(_int(res.get("gpu"), 0, 0)),
                    gpu_type=sku[0] if (sku := hived_sku(p, str(name))) else None,
                ),
                command=_command(walk, str(name), raw, path, parameters, secret_names),
                ports=_ports(res),
                min_failed=_min_count(raw.get("completion"), "minFailedInstances", 1),
                min_succeeded=_min_count(raw.get("completion"), "minSucceededInstances", replicas),
                # jobRetryCount retries a failed command as v1's retryCount (docs/lifecycle.md).
                restart_policy=RestartPolicy.ON_FAILURE,
            )
        )
    defaults = mapping(p.get("defaults"))
    queue = defaults.get("virtualCluster")
    name = p.get("name")
    spec = JobSpec(
        name=name if isinstance(name, str) else "",
        user=user,
        queue=queue if isinstance(queue, str) and queue else "default",
        # One image for the job where every role uses the same one: views show it.
        image=roles[0].image if roles and len({r.image for r in roles}) == 1 else None,
        retry_limit=_int(p.get("jobRetryCount"), 0, 0),
        # extras.gangAllocation: false places the tasks one by one (OpenPAI's rest server
        # then drops the job's affinity group, and its runtime waits for no barrier).
        gang=mapping(p.get("extras")).get("gangAllocation") is not False,
        secrets=secrets,
        roles=roles,
    )
    issues = walk.issues
    return Translation(spec, DIALECT, issues.errors, issues.warnings, key=spec.name or None)


# ------------------------------------------------------------------------------- redaction


def _hide(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _hide(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide(v) for v in value]
    return REDACTED


def redact_openpai_v2(payload: Any) -> Any:
    """The payload as it may be shown back: every secret value hidden, and a registry
    password written literally (instead of as a secret reference) hidden too."""
    if not isinstance(payload, dict):
        return payload
    shown = copy.deepcopy(payload)
    if "secrets" in shown and shown["secrets"] is not None:
        shown["secrets"] = _hide(shown["secrets"])
    prerequisites = shown.get("prerequisites")
    for item in prerequisites if isinstance(prerequisites, list) else []:
        auth = item.get("auth") if isinstance(item, dict) else None
        if (
            isinstance(auth, dict)
            and "password" in auth
            and not (isinstance(auth["password"], str) and _REFERENCE.fullmatch(auth["password"]))
        ):
            auth["password"] = REDACTED
    return shown


def is_v2(payload: dict[str, Any]) -> bool:
    """A protocolVersion, or task roles as a map; a ``jobName`` marks a v1 job whose
    taskRoles is merely wrong (its errors are then v1's)."""
    if "protocolVersion" in payload:
        return True  # any version: the check then says it must be 2
    return isinstance(payload.get("taskRoles"), dict) and "jobName" not in payload


REGISTRATION = Dialect(
    name=DIALECT,
    signature="openpai_v2 (protocolVersion: 2, or taskRoles as a map without jobName)",
    looks_like=is_v2,
    translate=translate_openpai_v2,
    field_path=field_path,
    validate=lambda payload, spec: validate_openpai_v2(payload),
    warnings=lambda payload, spec: openpai_v2_warnings(payload),
    redact=redact_openpai_v2,
)
