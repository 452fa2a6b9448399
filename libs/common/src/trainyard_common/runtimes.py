"""What a cluster's runtime can run: the local backend runs tasks as processes on the
nodes, so it uses no image (said once per job, on submission and in validation) and
cannot run a container that relies on its image's entrypoint (refused, at the field)."""

from __future__ import annotations

from collections.abc import Callable

from .events import FieldIssue
from .jobspec import JobKind, JobSpec, RoleSpec

# Where a canonical field is written in the user's payload: (role name or None, field).
Locate = Callable[[str | None, str], str]


def runtime_errors(spec: JobSpec, runtime: str, locate: Locate) -> list[FieldIssue]:
    """What the cluster's runtime cannot run: on the local backend, a container that
    relies on its image's entrypoint (no image runs there)."""
    if runtime != "local":
        return []
    return [
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
    """Once per job: the images the local backend does not use."""
    if runtime != "local":
        return []
    images = sorted({image for image in [spec.image, *(r.image for r in spec.roles)] if image})
    if not images:
        return []
    named = ", ".join(images)
    return [
        FieldIssue(
            path=locate(None, "image"),
            code="image_not_used",
            message=(
                f"image {named} is not used: on this cluster tasks run as processes on the "
                "nodes (the local backend), with the nodes' own software, not in containers"
            ),
        )
    ]
