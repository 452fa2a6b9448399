"""Holding a task to its resources on this machine (see domain/limits.py for what is
enforced how): finding what the machine allows, a task's cgroup v2 directory, and the
limits the command's process enters before it runs. Standard library only: the task
wrapper imports this.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..domain.limits import CGROUP_CONTROLLERS, MIB, LimitPlan, Mechanisms

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


# --- what this machine allows --------------------------------------------------------


def _cgroup2_mount() -> str | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[0] == "cgroup2":
            return fields[0].split()[4]
    return None


def _own_cgroup() -> str | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        return None
    return None


def find_cgroup(configured: str | None = None) -> tuple[str | None, frozenset[str], str]:
    """A cgroup v2 directory whose children may get memory/cpu/pids limits, the
    controllers they get, or why there is none. ``configured`` (YARD_CGROUP_ROOT) names
    a directory delegated to the launcher; else the launcher's own cgroup is tried,
    which works only where it is the root of its hierarchy (a container's namespace):
    a cgroup holding processes cannot hand controllers to children."""
    mount = _cgroup2_mount()
    if configured:
        base = Path(configured)
    else:
        if mount is None:
            return None, frozenset(), "no cgroup v2 hierarchy is mounted"
        own = _own_cgroup()
        if own is None:
            return None, frozenset(), "this process is in no cgroup v2 group"
        base = Path(mount) / own.lstrip("/")
        if own not in ("", "/"):
            return (
                None,
                frozenset(),
                (
                    f"the launcher's cgroup {base} holds processes, so its children get no "
                    "controllers; set YARD_CGROUP_ROOT to a cgroup v2 directory delegated to it"
                ),
            )
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return (
            None,
            frozenset(),
            f"cgroup v2 directory {base} cannot be read: {exc.strerror or exc}",
        )
    wanted = [c for c in CGROUP_CONTROLLERS if c in available]
    if "memory" not in wanted:
        return (
            None,
            frozenset(),
            (
                f"cgroup v2 at {base} offers no memory controller "
                f"(it has: {' '.join(sorted(available)) or 'none'})"
            ),
        )
    control = base / "cgroup.subtree_control"
    try:
        enabled = set(control.read_text().split())
        missing = [c for c in wanted if c not in enabled]
        if missing:
            control.write_text(" ".join(f"+{c}" for c in missing))
            enabled = set(control.read_text().split())
    except OSError as exc:
        return (
            None,
            frozenset(),
            (
                f"cannot enable {', '.join(wanted)} for the children of {base}: "
                f"{exc.strerror or exc}"
            ),
        )
    if not os.access(base, os.W_OK):
        return None, frozenset(), f"cgroup v2 directory {base} is not writable"
    return str(base), frozenset(c for c in wanted if c in enabled), ""


def shm_problem() -> str | None:
    """None when a task can get its own tmpfs at /dev/shm (a private mount namespace,
    which needs root here), else why not."""
    if os.geteuid() != 0:
        return "a private mount namespace for it needs root"
    proc = subprocess.run(
        [sys.executable, "-I", "-m", "trainyard_launcher.adapters.limits", "probe-shm"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return (
        None if proc.returncode == 0 else (proc.stderr.strip() or f"probe exited {proc.returncode}")
    )


def find_mechanisms(cgroup_root: str | None = None) -> Mechanisms:
    base, controllers, why = find_cgroup(cgroup_root)
    no_shm = shm_problem()
    return Mechanisms(
        cgroup=base,
        controllers=controllers,
        why_no_cgroup=why,
        shm_namespace=no_shm is None,
        why_no_shm=no_shm or "",
    )


# --- a task's cgroup --------------------------------------------------------------------


def make_cgroup(plan: LimitPlan) -> str | None:
    """The task's cgroup with its limits written; None (and why, on stderr) when it
    cannot be made."""
    if plan.cgroup is None:
        return None
    path = Path(plan.cgroup)
    try:
        path.mkdir(exist_ok=True)
        if plan.memory_by == "cgroup" and plan.memory_mb:
            (path / "memory.max").write_text(str(plan.memory_mb * MIB))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        if plan.cpu_max:
            (path / "cpu.max").write_text(plan.cpu_max)
        if plan.pids_max:
            (path / "pids.max").write_text(str(plan.pids_max))
    except OSError as exc:
        print(
            f"trainyard: the task's cgroup {path} cannot be used ({exc.strerror or exc}); "
            "its memory is limited per process instead",
            file=sys.stderr,
            flush=True,
        )
        return None
    return str(path)


def oom_kills(cgroup: str) -> int:
    try:
        for line in Path(cgroup, "memory.events").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def remove_cgroup(cgroup: str) -> None:
    """Kill whatever is left in the task's cgroup (a process that left the session
    too) and remove it."""
    path = Path(cgroup)
    kill = path / "cgroup.kill"
    for _ in range(50):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        try:
            if kill.exists():
                kill.write_text("1")
            else:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.02)
    try:
        path.rmdir()
    except OSError:
        pass


# --- in the command's process, before exec -------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _say(text: str) -> None:
    # In a forked child: raw writes only (its stderr is the task's log pipe).
    try:
        os.write(2, f"trainyard: {text}\n".encode())
    except OSError:
        pass


def _mount_shm(size_mb: int) -> None:
    """A tmpfs of ``size_mb`` at /dev/shm in a mount namespace of the task's own; for
    0 an empty read-only one (a tmpfs of size=0 would have no limit at all)."""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if _libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        raise OSError(ctypes.get_errno(), "making / private")
    flags = _MS_NOSUID | _MS_NODEV
    if size_mb > 0:
        data = f"size={size_mb}m,mode=1777".encode()
    else:
        flags |= _MS_RDONLY
        data = b"size=4k,nr_inodes=16,mode=555"
    if _libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", ctypes.c_ulong(flags), data) != 0:
        raise OSError(ctypes.get_errno(), "mounting a tmpfs at /dev/shm")


def enter_limits(plan: LimitPlan, cgroup: str | None) -> None:
    """Run in the command's process between fork and exec (so every process it starts
    inherits them). A limit that cannot be set is reported in the task's stderr, not
    fatal: the task runs as it would have without it."""
    if cgroup is not None:
        try:
            fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError as exc:
            _say(f"could not join the task's cgroup: {os.strerror(exc.errno or 0)}")
    if plan.memory_by == "rlimit" or (plan.memory_by == "cgroup" and cgroup is None):
        if plan.memory_mb:
            limit = plan.memory_mb * MIB
            try:
                resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            except (OSError, ValueError) as exc:
                _say(f"could not limit memory: {exc}")
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        files = plan.nofile if hard == resource.RLIM_INFINITY else min(plan.nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        resource.setrlimit(resource.RLIMIT_CORE, (plan.core, plan.core))
    except (OSError, ValueError) as exc:
        _say(f"could not set file limits: {exc}")
    if plan.shm_mb is not None:
        try:
            _mount_shm(plan.shm_mb)
        except OSError as exc:
            _say(
                f"/dev/shm is the machine's, not limited to {plan.shm_mb} MiB: "
                f"{exc.strerror or os.strerror(exc.errno or 0)}"
            )


def _probe_shm() -> int:
    import tempfile  # here only: the task wrapper imports this module and starts fast

    try:
        if _libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        if _libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        if (
            _libc.mount(
                b"tmpfs", tempfile.gettempdir().encode(), b"tmpfs", ctypes.c_ulong(0), b"size=1m"
            )
            != 0
        ):
            raise OSError(ctypes.get_errno(), "mount tmpfs")
    except OSError as exc:
        print(
            f"no private mount namespace: {exc.args[1]}: {os.strerror(exc.args[0])}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["probe-shm"]:
        sys.exit(_probe_shm())
    sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'limits'} probe-shm")
