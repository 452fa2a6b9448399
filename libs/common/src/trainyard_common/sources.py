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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

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


def mount_problem(source: str, runtime: str, host_paths: bool = False) -> str | None:
    """Why ``runtime`` ("local" or "kubernetes") cannot mount ``source``; None where it
    can. ``host_paths``: on Kubernetes, whether the operator lets pods mount the nodes'
    paths (YARD_K8S_HOST_PATHS)."""
    where = read_source(source)
    if runtime == "kubernetes":
        if isinstance(where, Claim):
            if not where.name:
                return "pvc:// names no claim (pvc://<claim>[/<path>])"
            if ".." in where.sub_path.split("/"):
                return "a path inside a claim may not hold '..' (a pod refuses it)"
            return None
        if isinstance(where, NodePath):
            if host_paths:
                return None
            return (
                "a path of the nodes, which this cluster does not mount into pods; use a "
                "PersistentVolumeClaim (pvc://<claim>[/<path>])"
            )
        return (
            "pods here mount a PersistentVolumeClaim (pvc://<claim>[/<path>])"
            + (" or a path of the nodes (/path)" if host_paths else "")
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
