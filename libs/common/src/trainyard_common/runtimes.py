"""What a cluster's runtime can run: the local backend runs tasks as processes on the
nodes, so it uses no image (said once per job, on submission and in validation) and
cannot run a container that relies on its image's entrypoint (refused, at the field).
Neither backend fetches data from elsewhere: a data source either can mount is a path
of the nodes or, on Kubernetes, a PersistentVolumeClaim; any other (a TI cos:// package,
a PAI-DLC NAS or OSS source, a relative path) is refused at the field on submission,
where every task used to fail at its start."""

from __future__ import annotations

import re
from collections.abc import Callable

from .events import FieldIssue
from .jobspec import JobKind, JobSpec, RoleSpec

# Where a canonical field is written in the user's payload: (role name or None, field).
Locate = Callable[[str | None, str], str]


def runtime_errors(spec: JobSpec, runtime: str, locate: Locate) -> list[FieldIssue]:
    """What the cluster's runtime cannot run: a data source it cannot mount; on the
    local backend, a container that relies on its image's entrypoint (no image runs
    there)."""
    sources = data_source_errors(spec, runtime, locate)
    if runtime != "local":
        return sources + mount_clashes(spec, locate)
    return sources + [
        FieldIssue(
            path=locate(role.name, "command"),
            code="needs_image",
            message=(
                f"role {role.name!r}: the container has no command of its own, so it "
                f"would run the entrypoint of its image {_image_of(spec, role)}; tasks run "
                "as processes on this cluster's nodes (the local backend) and no image is "
                "run: give the container a command, or run Trainyard on Kubernetes"
            ),
        )
        for role in spec.roles
        if needs_image(spec, role)
    ]


def needs_image(spec: JobSpec, role: RoleSpec) -> bool:
    """The role would run its image's entrypoint: a container with no command of its
    own, except an MPI job's worker (the launcher's mpirun starts its ranks)."""
    return role.uses_image_entrypoint and not _mpi_worker(spec, role)


# The role that runs mpirun in an MPI job (Kubeflow's Launcher, Volcano's master).
MPI_LAUNCHERS = ("launcher", "master")


def _mpi_worker(spec: JobSpec, role: RoleSpec) -> bool:
    """A worker of an MPI job with a launcher runs no command of its own: its ranks are
    started by the launcher's mpirun (over ssh in an image, through the launcher's agent
    on the local backend), so its image's entrypoint (sshd) is not needed."""
    names = {r.name.lower() for r in spec.roles}
    return (
        spec.kind is JobKind.MPI
        and role.name.lower() not in MPI_LAUNCHERS
        and any(n in names for n in MPI_LAUNCHERS)
    )


def _image_of(spec: JobSpec, role: RoleSpec) -> str:
    return repr(role.image or spec.image) if role.image or spec.image else "(none named)"


def runtime_warnings(spec: JobSpec, runtime: str, locate: Locate) -> list[FieldIssue]:
    """Once per job: the images the local backend does not use; once per role, the
    claims its pod template mounts, which the local backend does not."""
    if runtime != "local":
        return []
    unmounted = [
        FieldIssue(
            path=f"{locate(role.name, 'volumes')}.volumeMounts",
            code="not_applied",
            message=(
                f"role {role.name!r}: "
                f"{', '.join(f'{v.source} at {v.mount_path}' for v in role.volumes)} "
                "not mounted: tasks here run as processes on the nodes and see the nodes' "
                "files (a PersistentVolumeClaim is mounted on Kubernetes)"
            ),
        )
        for role in spec.roles
        if role.volumes
    ]
    images = sorted({image for image in [spec.image, *(r.image for r in spec.roles)] if image})
    if not images:
        return unmounted
    named = ", ".join(images)
    return unmounted + [
        FieldIssue(
            path=locate(None, "image"),
            code="image_not_used",
            message=(
                f"image {named} is not used: on this cluster tasks run as processes on the "
                "nodes (the local backend), with the nodes' own software, not in containers"
            ),
        )
    ]


def mount_clashes(spec: JobSpec, locate: Locate) -> list[FieldIssue]:
    """On Kubernetes, a role's claims (its pod template's) at a path the job's code or
    data already takes, or twice: the API server refuses such a pod (422, a duplicate
    mountPath), so every task failed at its start."""
    taken = [s.mount_path for s in spec.data_sources]
    if spec.code_source is not None:
        taken.append(spec.code_source.mount_path)
    issues = []
    for role in spec.roles:
        seen = list(taken)
        for volume in role.volumes:
            path = volume.mount_path.rstrip("/") or "/"
            if path in (p.rstrip("/") or "/" for p in seen):
                issues.append(FieldIssue(
                    path=f"{locate(role.name, 'volumes')}.volumeMounts", code="duplicate",
                    message=f"role {role.name!r}: {volume.mount_path} is mounted twice (a "
                    "pod cannot mount two volumes at one path)",
                ))  # fmt: skip
            seen.append(volume.mount_path)
    return issues


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def _shown(source: str) -> str:
    """A source as an error may show it: without a user:password@ part, and short."""
    return _USERINFO.sub(r"\1***@", source)[:200]


def data_source_errors(spec: JobSpec, runtime: str, locate: Locate) -> list[FieldIssue]:
    """Each data source the runtime can never mount, at its place in the payload."""
    if not spec.data_sources:
        return []  # most jobs: no path to look up (locate reads the payload)
    where = locate(None, "data_sources")
    return [
        FieldIssue(
            path=f"{where}[{i}]",
            code="unsupported_source",
            message=f"data source {_shown(source.source)!r}: {problem}",
        )
        for i, source in enumerate(spec.data_sources)
        if (problem := source_problem(source.source, runtime)) is not None
    ]


def source_problem(source: str, runtime: str) -> str | None:
    """Why ``runtime`` cannot mount ``source`` (None: it can, as far as the platform
    knows; the launcher still finds a path missing or a claim absent at the start).
    The launcher reads them so: domain/prepare.local_path, domain/pods.data_volume."""
    found = _SCHEME.match(source)
    # Pods take pvc:// and file:// as written (domain/pods.data_volume); the local
    # backend reads a scheme in any case (domain/prepare.local_path).
    scheme = (
        (found.group(1) if runtime == "kubernetes" else found.group(1).lower()) if found else None
    )
    rest = source[found.end() :] if found else source
    if runtime == "kubernetes":
        if scheme == "pvc":
            return None if rest.partition("/")[0] else "pvc:// names no claim (pvc://<claim>)"
        if (scheme is None or scheme == "file") and rest.startswith("/"):
            return None  # a node path, where the operator lets pods mount them
        return (
            "pods here mount a PersistentVolumeClaim (pvc://<claim>[/<path>]) or, where "
            "the operator allows it, a path of the node (/path); nothing is fetched from "
            "elsewhere"
        )
    if scheme == "file" and rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    if (scheme is None or scheme == "file") and rest.startswith("/"):
        return None
    return (
        "tasks here run as processes on the nodes and see the nodes' files: name an "
        "absolute path (/path or file:///path); nothing is fetched from elsewhere"
    )
