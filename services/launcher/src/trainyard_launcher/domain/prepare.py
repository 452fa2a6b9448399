"""What a task needs before its command runs, decided from the spec alone.

``plan_preparation`` turns a job's ``code_source``, ``data_sources``, ``pip_packages`` and
``pip_requirements_dir`` into a :class:`PreparePlan`: plain data the task's own wrapper
carries out (``adapters/prepare.py``), so a slow clone or install never blocks the
launcher's consumer. Problems that the spec alone shows (a data source scheme the local
backend cannot reach) come back as a :class:`PlanProblem` and fail the task before it is
spawned.

The run deadline (``max_running_minutes``) and the debug environment dump
(``keep_failed_for_debug``) are decided here too: both are pure readings of the spec and
of stored times.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from trainyard_common.jobspec import REDACTED, JobSpec
from trainyard_common.sources import NodePath, mount_problem, normal_path, read_source, shown

CODE_DIR_VAR = "TRAINYARD_CODE_DIR"
VENV_VAR = "VIRTUAL_ENV"

DEPENDENCY_FAILED = "dependency install failed"

# Environment variable names whose values a debug dump hides even when the spec does
# not list them as secrets (tokens and passwords handed in through jobEnvs).
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|(^|_)KEY($|_)|ACCESS_?KEY", re.IGNORECASE
)


@dataclass(frozen=True)
class Mount:
    """``host`` (a directory or file on this machine) shown to the task at ``view``."""

    view: str
    host: str
    what: str  # "code source" or "data_sources[i]", for reasons a person reads


@dataclass(frozen=True)
class Checkout:
    repo: str
    dest: str
    branch: str | None = None
    commit: str | None = None


@dataclass(frozen=True)
class PipInstall:
    """One install per job and node: the first task of the job does it under ``lock``,
    the others find ``venv`` ready (or the same failure) by ``digest``."""

    venv: str
    lock: str
    packages: tuple[str, ...] = ()
    requirements: str | None = None
    pip_args: tuple[str, ...] = ()
    attempt: int = 1
    # The interpreter the virtualenv is made from ("": the wrapper's own).
    python: str = ""

    @property
    def digest(self) -> str:
        what = json.dumps([self.packages, self.requirements, self.pip_args])
        return hashlib.sha256(what.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PreparePlan:
    task_dir: str
    checkout: Checkout | None = None
    mounts: tuple[Mount, ...] = ()
    pip: PipInstall | None = None
    env: tuple[tuple[str, str], ...] = ()
    # The (uid, gid) the task runs as: every step that touches what the user supplied
    # (a clone, an install, a mount path) runs as that user, never as the wrapper.
    run_as: tuple[int, int] | None = None
    # What each tmpfs of the task's view may hold, in MiB (the task's memory): where no
    # cgroup charges a tmpfs's pages to the task, nothing else bounds what it writes to
    # a covered directory (a /tmp around a mount path), which is kept in memory.
    tmpfs_mb: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> PreparePlan:
        data: dict[str, Any] = json.loads(text)
        return cls(
            task_dir=data["task_dir"],
            checkout=Checkout(**data["checkout"]) if data.get("checkout") else None,
            mounts=tuple(Mount(**m) for m in data.get("mounts") or ()),
            pip=(
                PipInstall(
                    **{
                        **data["pip"],
                        "packages": tuple(data["pip"]["packages"]),
                        "pip_args": tuple(data["pip"]["pip_args"]),
                    }
                )
                if data.get("pip")
                else None
            ),
            env=tuple((k, v) for k, v in data.get("env") or ()),
            run_as=(int(data["run_as"][0]), int(data["run_as"][1])) if data.get("run_as") else None,
            tmpfs_mb=int(data["tmpfs_mb"]) if data.get("tmpfs_mb") else None,
        )

    @property
    def outside_mounts(self) -> tuple[Mount, ...]:
        """Mounts whose view lies outside the task's own directory: only these need a
        mount namespace (or a symlink on the machine)."""
        return tuple(m for m in self.mounts if not _under(m.view, self.task_dir))


@dataclass(frozen=True)
class PlanProblem:
    """The task cannot run on this backend; ``reason`` names the field and the value."""

    reason: str


@dataclass(frozen=True)
class _Paths:
    task_dir: PurePosixPath
    job_dir: PurePosixPath

    @property
    def work(self) -> PurePosixPath:
        return self.task_dir / "work"

    def view(self, mount_path: str) -> PurePosixPath:
        # A relative mount path is read from the task's working directory, the way a
        # relative path in its command would be.
        path = PurePosixPath(mount_path)
        return _normal(path if path.is_absolute() else self.work / path)

    def staging(self, view: PurePosixPath) -> PurePosixPath:
        # Inside the task's own directory the checkout can simply live at its view.
        if _under(str(view), str(self.task_dir)):
            return view
        return self.task_dir / "mounts" / view.relative_to("/")


def _normal(path: PurePosixPath) -> PurePosixPath:
    return PurePosixPath(normal_path(str(path)))


def _under(path: str, directory: str) -> bool:
    return (
        PurePosixPath(path) == PurePosixPath(directory)
        or PurePosixPath(directory) in PurePosixPath(path).parents
    )


def local_path(source: str) -> str | PlanProblem:
    """The path on this machine a data source names, or why it names none: the reading
    submission refuses sources by (trainyard_common.sources)."""
    where = read_source(source)
    if isinstance(where, NodePath):
        return where.path
    return PlanProblem(f"data source {shown(source)!r}: {mount_problem(source, 'local')}")


def needs_preparation(spec: JobSpec) -> bool:
    return bool(
        spec.code_source or spec.data_sources or spec.pip_packages or spec.pip_requirements_dir
    )


def plan_preparation(
    spec: JobSpec,
    task_dir: str,
    job_dir: str,
    attempt: int = 1,
    pip_args: tuple[str, ...] = (),
    python: str = "",
    tmpfs_mb: int | None = None,
) -> PreparePlan | PlanProblem | None:
    """The preparation of one task of ``spec``; None when there is nothing to prepare.
    ``tmpfs_mb``: what each tmpfs of its view may hold (PreparePlan)."""
    paths = _Paths(PurePosixPath(task_dir), PurePosixPath(job_dir))
    mounts: list[Mount] = []
    env: list[tuple[str, str]] = []
    checkout = None
    if (code := spec.code_source) is not None:
        view = paths.view(code.mount_path)
        dest = paths.staging(view)
        checkout = Checkout(repo=code.repo, dest=str(dest), branch=code.branch, commit=code.commit)
        mounts.append(Mount(str(view), str(dest), "code source"))
        env.append((CODE_DIR_VAR, str(view)))
    for i, data in enumerate(spec.data_sources):
        host = local_path(data.source)
        if isinstance(host, PlanProblem):
            return PlanProblem(f"data_sources[{i}].source: {host.reason}")
        mounts.append(Mount(str(paths.view(data.mount_path)), host, f"data_sources[{i}]"))

    views = [m.view for m in mounts]
    for i, mounted in enumerate(views):
        if _under(task_dir, mounted):
            # It would hide the task's own directory (its command, its records) in the
            # task's view behind what the user mounts there.
            return PlanProblem(
                f"{mounts[i].what}: the mount path {mounted} would cover the task's own "
                f"directory {task_dir}"
            )
        if mounted in views[:i]:
            return PlanProblem(
                f"two sources are mounted at {mounted} ({mounts[i].what} and "
                f"{mounts[views.index(mounted)].what})"
            )

    pip = None
    if spec.pip_packages or spec.pip_requirements_dir:
        requirements = None
        if spec.pip_requirements_dir:
            requirements = str(
                _host_path(paths, mounts, spec.pip_requirements_dir) / "requirements.txt"
            )
        venv = paths.job_dir / "venv"
        pip = PipInstall(
            venv=str(venv),
            lock=str(paths.job_dir / "venv.lock"),
            packages=tuple(spec.pip_packages),
            requirements=requirements,
            pip_args=tuple(pip_args),
            attempt=attempt,
            python=python,
        )
        env.append((VENV_VAR, str(venv)))

    if checkout is None and not mounts and pip is None:
        return None
    return PreparePlan(
        task_dir=task_dir, checkout=checkout, mounts=tuple(mounts), pip=pip, env=tuple(env),
        tmpfs_mb=tmpfs_mb,
    )  # fmt: skip


def _host_path(paths: _Paths, mounts: list[Mount], directory: str) -> PurePosixPath:
    """Where ``directory`` (as the task sees it) is on this machine: inside a mount it
    is read from the mount's source, since installs run before the task's view exists."""
    view = paths.view(directory)
    for mount in sorted(mounts, key=lambda m: len(m.view), reverse=True):
        if _under(str(view), mount.view):
            return PurePosixPath(mount.host) / view.relative_to(mount.view)
    return view


def prepared_env(env: dict[str, str], plan: PreparePlan | None) -> dict[str, str]:
    """The task's environment once prepared: the plan's variables, and the job's
    virtualenv first on PATH so its ``python`` and ``pip`` are the ones found."""
    if plan is None:
        return dict(env)
    result = {**env, **dict(plan.env)}
    if plan.pip is not None:
        bin_dir = f"{plan.pip.venv}/bin"
        path = env.get("PATH", "")
        result["PATH"] = f"{bin_dir}:{path}" if path else bin_dir
    return result


# --- the run deadline ---------------------------------------------------------------------


def run_deadline(
    max_running_minutes: int | None, first_started: datetime | None, minute_s: float = 60.0
) -> datetime | None:
    """When the job has run too long: ``max_running_minutes`` after its first task
    started. ``minute_s`` shortens a minute for tests."""
    if not max_running_minutes or first_started is None:
        return None
    return first_started + timedelta(seconds=max_running_minutes * minute_s)


def deadline_reason(max_running_minutes: int) -> str:
    unit = "minute" if max_running_minutes == 1 else "minutes"
    return f"exceeded its maximum running time of {max_running_minutes} {unit}"


# --- debugging a failed task ----------------------------------------------------------------


def debug_env_text(env: dict[str, str], secret_values: list[str]) -> str:
    """``env`` as a file a person can read and ``source`` to re-run the task, with the
    job's secrets and secret-looking variables hidden."""
    hidden = sorted((v for v in secret_values if v), key=len, reverse=True)
    lines = ["# The environment of a failed task (secrets masked); `source` it to re-run."]
    for name in sorted(env):
        value = env[name]
        if _SECRET_NAME.search(name):
            value = REDACTED
        else:
            for secret in hidden:
                value = value.replace(secret, REDACTED)
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def debug_reason(reason: str | None, task_dir: str, env_file: str) -> str:
    kept = f"kept for debugging: task directory {task_dir}, environment {env_file}"
    return f"{reason}; {kept}" if reason else kept


__all__ = [
    "CODE_DIR_VAR",
    "DEPENDENCY_FAILED",
    "Checkout",
    "Mount",
    "PipInstall",
    "PlanProblem",
    "PreparePlan",
    "debug_env_text",
    "debug_reason",
    "deadline_reason",
    "local_path",
    "needs_preparation",
    "plan_preparation",
    "prepared_env",
    "run_deadline",
]
