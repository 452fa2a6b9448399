"""What a cluster's runtime can run: the local backend runs tasks as processes on the
nodes, so it uses no image (said once per job, on submission and in validation) and
cannot run a container that relies on its image's entrypoint (refused, at the field).
Neither backend fetches data from elsewhere: a data source either can mount is a path
of the nodes or, on Kubernetes, a PersistentVolumeClaim; any other (a TI cos:// package,
a PAI-DLC NAS or OSS source, a relative path) is refused at the field on submission,
where every task used to fail at its start."""

from __future__ import annotations

from collections.abc import Callable

from .cluster import ClusterSpec
from .events import FieldIssue
from .jobspec import JobKind, JobSpec, RoleSpec
from .sources import mount_problem, shown

# Where a canonical field is written in the user's payload: (role name or None, field).
Locate = Callable[[str | None, str], str]


def runtime_errors(spec: JobSpec, cluster: ClusterSpec, locate: Locate) -> list[FieldIssue]:
    """What the cluster's runtime cannot run: a data source it cannot mount; on the
    local backend, a container that relies on its image's entrypoint (no image runs
    there)."""
    sources = data_source_errors(spec, cluster, locate)
    if cluster.runtime != "local":
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


def data_source_errors(spec: JobSpec, cluster: ClusterSpec, locate: Locate) -> list[FieldIssue]:
    """Each data source the cluster's backend can never mount, at its place in the
    payload (sources.mount_problem: the rule the launcher mounts them by)."""
    if not spec.data_sources:
        return []  # most jobs: no path to look up (locate reads the payload)
    where = locate(None, "data_sources")
    return [
        FieldIssue(
            path=f"{where}[{i}]",
            code="unsupported_source",
            message=f"data source {shown(source.source)!r}: {problem}",
        )
        for i, source in enumerate(spec.data_sources)
        if (problem := mount_problem(source.source, cluster.runtime, cluster.host_paths))
        is not None
    ]
