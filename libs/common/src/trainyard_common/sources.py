"""Where a job's data source points, read once for everyone: submission refuses what the
cluster's backend cannot mount (runtimes.data_source_errors), and the launcher's
backends mount what is left (the local backend's domain/prepare.local_path, the pods'
domain/pods.data_volume). One reading, so what is accepted is what is mounted: the
three used to read a source each in their own way (``PVC://`` and ``file://localhost/``
passed submission and failed every pod at its start).

A source is a path of the nodes (``/path``, ``file:///path``, ``file://localhost/path``),
a PersistentVolumeClaim (``pvc://<claim>[/<sub path>]``), or somewhere neither backend
fetches from (``oss://``, ``nas://``, ``cos://``, another host's ``file://``, a relative
path, a registered data source's id). Schemes are read in any case (RFC 3986 §3.1).
Pure: no I/O; whether a node path exists or a claim is bound is for the launcher to
find at the start.

A pod mounts a node path only under a directory the operator lists
(``YARD_K8S_HOST_PATHS=/datasets,/scratch``, read by ``read_host_paths``), compared by
whole components after ``normal_path`` (``/datasets2`` is not under ``/datasets``), and
never inside the nodes' own trees (``SYSTEM_TREES``: ``/``, the kubelet's directory with
every pod's Secrets, the runtime's socket under ``/run``), whatever the operator lists:
read-only stops neither reading a file nor connecting to a socket.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

# A PersistentVolumeClaim's name, as the API server takes it: an RFC 1123 DNS subdomain
# (at most 253 characters, dot-separated lowercase labels). Matched whole.
CLAIM_NAME_RE = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


@dataclass(frozen=True)
class NodePath:
    """A path of the nodes, absolute and without ``.`` or ``..`` (read lexically)."""

    path: str


@dataclass(frozen=True)
class Claim:
    """A PersistentVolumeClaim by name ("" when the source names none) and the path
    inside it ("" for its root)."""

    name: str
    sub_path: str = ""


@dataclass(frozen=True)
class Elsewhere:
    """Nothing either backend mounts: ``scheme`` is the source's (lower case), None
    where it has none (a relative path or an id); ``host`` another machine's name."""

    scheme: str | None
    host: str = ""


Source = NodePath | Claim | Elsewhere


def normal_path(path: str) -> str:
    """An absolute path with ``.`` and ``..`` read lexically (``..`` at the root stays
    there), as a mount sees it."""
    parts: list[str] = []
    for part in PurePosixPath(path).parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return str(PurePosixPath("/", *parts))


# The nodes' own trees: no pod mounts a path in one (nor one holding one: ``/``, ``/var``),
# whatever the operator lists. The kubelet's directory holds every pod's Secrets and
# service account tokens; /run and /var/run the container runtime's socket (connect()
# to it is the node, read-only or not); /etc, /root and /var/lib/etcd the node's and
# the cluster's credentials; /proc, /sys and /dev the kernel's; /var/log every pod's
# output.
SYSTEM_TREES = (
    "/boot", "/dev", "/etc", "/proc", "/root", "/run", "/sys", "/var/lib/cni",
    "/var/lib/containerd", "/var/lib/containers", "/var/lib/docker", "/var/lib/etcd",
    "/var/lib/kubelet", "/var/lib/rancher", "/var/log", "/var/run",
)  # fmt: skip

HOST_PATHS_ENV = "YARD_K8S_HOST_PATHS"


def is_under(path: str, directory: str) -> bool:
    """Whether normal ``path`` is ``directory`` or inside it, by whole components."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def system_tree(path: str) -> str | None:
    """The system tree (SYSTEM_TREES) normal ``path`` is, is in or holds; None if none."""
    return next(
        (tree for tree in SYSTEM_TREES if is_under(path, tree) or is_under(tree, path)), None
    )


def read_host_paths(text: str) -> tuple[str, ...]:
    """``YARD_K8S_HOST_PATHS``: the directories of the nodes pods may mount (read-only)
    as data sources, comma-separated absolute paths; "" (or "0"): none. ValueError
    naming the variable for anything else, so no service starts on a setting it would
    read otherwise than the others: ``1`` (formerly any path of the nodes, ``/``
    included), a relative path, or one that is, is inside or holds a system tree."""
    where = HOST_PATHS_ENV
    if text.strip() in ("", "0"):
        return ()
    if text.strip() == "1":
        raise ValueError(
            f"{where}=1 (any path of the nodes, / and the kubelet's Secrets included) is "
            "no longer taken: list the directories pods may mount, comma-separated "
            f"(e.g. {where}=/datasets,/scratch)"
        )
    allowed: list[str] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if not entry.startswith("/"):
            raise ValueError(
                f"{where}: {entry[:80]!r} is not an absolute path (list the directories "
                "pods may mount, comma-separated, e.g. /datasets,/scratch)"
            )
        path = normal_path(entry)
        tree = system_tree(path)
        if tree is not None:
            raise ValueError(
                f"{where}: {path[:80]!r} "
                + ("is" if is_under(path, tree) else "holds")
                + f" {tree}, a directory of the node's own that no pod mounts"
            )
        if path not in allowed:
            allowed.append(path)
    return tuple(allowed)


def read_source(source: str) -> Source:
    """What ``source`` names (see the module's docstring)."""
    found = _SCHEME.match(source)
    if found is None:
        return NodePath(normal_path(source)) if source.startswith("/") else Elsewhere(None)
    scheme = found.group(1).lower()
    rest = source[found.end() :]
    if scheme == "pvc":
        name, _, sub = rest.partition("/")
        return Claim(name, sub.strip("/"))
    if scheme == "file":
        # file://host/path is another machine's; file:///path and file://localhost/path
        # are the nodes' own.
        if rest[: len("localhost/")].lower() == "localhost/":
            rest = rest[len("localhost") :]
        if rest.startswith("/"):
            return NodePath(normal_path(rest))
        return Elsewhere("file", host=rest.partition("/")[0])
    return Elsewhere(scheme)


def shown(source: str) -> str:
    """A source as an error may show it: without a user:password@ part, and short."""
    return _USERINFO.sub(r"\1***@", source)[:200]


def mount_problem(source: str, runtime: str, host_paths: Sequence[str] = ()) -> str | None:
    """Why ``runtime`` ("local" or "kubernetes") cannot mount ``source``; None where it
    can. ``host_paths``: on Kubernetes, the directories of the nodes the operator lets
    pods mount (read_host_paths of YARD_K8S_HOST_PATHS); a system tree never."""
    where = read_source(source)
    if runtime == "kubernetes":
        if isinstance(where, Claim):
            if not where.name:
                return "pvc:// names no claim (pvc://<claim>[/<path>])"
            if not CLAIM_NAME_RE.fullmatch(where.name):
                return (
                    f"{where.name[:80]!r} is not a claim's name (a lowercase RFC 1123 "
                    "subdomain: a pod naming it is refused)"
                )
            if ".." in where.sub_path.split("/"):
                return "a path inside a claim may not hold '..' (a pod refuses it)"
            return None
        if isinstance(where, NodePath):
            if not host_paths:
                return (
                    "a path of the nodes, which this cluster does not mount into pods; use "
                    "a PersistentVolumeClaim (pvc://<claim>[/<path>])"
                )
            tree = system_tree(where.path)
            if tree is not None:
                return (
                    f"{where.path[:80]} "
                    + ("is in" if is_under(where.path, tree) else "holds")
                    + f" {tree}, a directory of the node's own that no pod mounts"
                )
            if not any(is_under(where.path, allowed) for allowed in host_paths):
                return (
                    "a path of the nodes outside the directories pods here may mount ("
                    + ", ".join(host_paths)
                    + "); or use a PersistentVolumeClaim (pvc://<claim>[/<path>])"
                )
            return None
        return (
            "pods here mount a PersistentVolumeClaim (pvc://<claim>[/<path>])"
            + (f" or a path of the nodes under {', '.join(host_paths)}" if host_paths else "")
            + f"; {_nothing_fetched(where)}"
        )
    if isinstance(where, NodePath):
        return None
    if isinstance(where, Claim):
        return (
            "a PersistentVolumeClaim is mounted on Kubernetes only; tasks here run as "
            "processes on the nodes and see the nodes' files: name an absolute path "
            "(/path or file:///path)"
        )
    return (
        "tasks here run as processes on the nodes and see the nodes' files: name an "
        f"absolute path (/path or file:///path); {_nothing_fetched(where)}"
    )


def _nothing_fetched(where: Elsewhere) -> str:
    if where.host:
        return f"{where.host} is another machine, and nothing is fetched from elsewhere"
    if where.scheme is None:
        return "not a path (a relative path or a data source's id), and nothing is fetched"
    return f"nothing is fetched from elsewhere ({where.scheme}://)"
