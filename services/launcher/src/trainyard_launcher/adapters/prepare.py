"""Carrying out a task's :class:`PreparePlan`, inside the task's own wrapper process.

Steps, in order, each logged to the task's ``stderr.log``: ``git clone`` (then
``git checkout <commit>``) of the code source into the task's directory; a check that
every data source exists; the job's virtualenv, created and installed once per job and
node under a lock; and finally making each mount path visible to the command.

Mount paths. A local process has no container, so a path such as ``/mnt/data`` would
have to be created on the machine itself, where it is shared by every job. Instead the
command runs in a mount namespace of its own (``python -m
trainyard_launcher.adapters.prepare enter PLAN -- COMMAND``): a private copy of the
machine's directory tree whose root, and any directory a mount path has to be created
in, is a tmpfs that re-binds the original entries; each source is bind-mounted at its
mount path there, then the command is ``chroot``-ed into that view. Nothing on the real
filesystem changes, and tasks of different jobs can use the same mount path. Without
root, a user namespace maps the task's own uid to itself (capabilities end at ``exec``).
When namespaces are not available the fallback is a symlink at the mount path, only
when that path is free and its directory writable (removed when the task ends);
otherwise the task fails with a reason naming the path.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from ..domain.prepare import (
    DEPENDENCY_FAILED,
    Checkout,
    Mount,
    PipInstall,
    PreparePlan,
)
from .identity import RunAs, as_user, demote, restored

# Written by ``enter`` when it cannot build the task's view; the wrapper turns it into
# the task's reason (taskwrap keeps the same name without importing this module).
FAILED_FILE = "prepare-failed"
ENTER_FAILED_EXIT = 125
# The command prefix that builds the task's view and runs the command in it; it becomes
# the task's user itself (after its mounts), so its caller must not.
ENTER_ARGV = [sys.executable, "-I", "-m", "trainyard_launcher.adapters.prepare", "enter"]


class PrepareFailed(Exception):
    """Preparation failed; ``str(exc)`` is the task's reason."""


def _say(log: IO[str], text: str) -> None:
    log.write(f"trainyard prepare: {text}\n")
    log.flush()


def _hide_credentials(url: str) -> str:
    return re.sub(r"//[^/@]+@", "//***@", url)


def _run(
    argv: list[str], log: IO[str], env: dict[str, str] | None = None, run_as: RunAs = None
) -> tuple[int, str]:
    """Run ``argv`` with its output in the task's log (as the task's user, with
    ``run_as``); returns the exit code and the last lines of its output (for the
    reason)."""
    _say(log, "$ " + " ".join(_hide_credentials(a) for a in argv))
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Run as the task's user: its environment whole (identity.restored).
            env=restored(env if env is not None else os.environ),
            text=True,
            errors="replace",
            preexec_fn=(lambda: demote(run_as)) if run_as is not None else None,
        )
    except OSError as exc:
        return 127, str(exc)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        tail = (tail + [line.rstrip()])[-5:]
    log.flush()
    return proc.wait(), " / ".join(t for t in tail if t.strip())[-500:]


# --- code source --------------------------------------------------------------------------


def clone(
    checkout: Checkout, log: IO[str], run_as: RunAs = None, task_dir: str | None = None
) -> None:
    dest = Path(checkout.dest)
    with as_user(run_as):
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    if run_as is not None:
        env["HOME"] = str(dest.parent)
        # The task's user clones a repository it may not own (a path on the machine):
        # what runs of it runs as that user, so git's ownership guard has nothing to
        # protect. git takes that only from a global configuration, so one of the
        # task's own (written here, by the wrapper, where the task can read it).
        env["GIT_CONFIG_GLOBAL"] = _git_config(Path(task_dir or dest.parent))
    repo = _hide_credentials(checkout.repo)
    argv = ["git", "clone", "--quiet"]
    if checkout.branch:
        argv += ["--branch", checkout.branch]
    code, output = _run([*argv, "--", checkout.repo, str(dest)], log, env, run_as)
    at = f" at branch {checkout.branch}" if checkout.branch else ""
    if code != 0:
        raise PrepareFailed(f"code source: git clone of {repo}{at} failed: {output}")
    if checkout.commit:
        code, output = _run(
            [
                "git",
                "-C",
                str(dest),
                "-c",
                "advice.detachedHead=false",
                "checkout",
                "--quiet",
                "--detach",
                checkout.commit,
            ],
            log,
            env,
            run_as,
        )
        if code != 0:
            raise PrepareFailed(
                f"code source: commit {checkout.commit} of {repo}{at} cannot be checked out: {output}"
            )


def _git_config(task_dir: Path) -> str:
    path = task_dir / "gitconfig"
    path.write_text("[safe]\n\tdirectory = *\n")
    os.chmod(path, 0o644)
    return str(path)


# --- the job's virtualenv -------------------------------------------------------------------


def _state_path(pip: PipInstall) -> Path:
    return Path(pip.lock).with_suffix(".json")


def install(pip: PipInstall, log: IO[str], created_by: str, run_as: RunAs = None) -> None:
    """Create the job's virtualenv and install into it, once: the lock makes the other
    tasks of the job wait, and the state file tells them it is done (or how it failed,
    so an attempt's tasks do not all repeat a failing install)."""
    venv = Path(pip.venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(pip.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state_path = _state_path(pip)
        try:
            state = json.loads(state_path.read_text())
        except (FileNotFoundError, ValueError):
            state = {}
        if state.get("digest") == pip.digest:
            if state.get("ok"):
                _say(
                    log, f"the job's virtualenv {venv} is ready (made by {state.get('created_by')})"
                )
                return
            if state.get("attempt") == pip.attempt:
                raise PrepareFailed(state["reason"])
        reason = _install_locked(pip, venv, log, run_as)
        state = {
            "digest": pip.digest,
            "ok": reason is None,
            "reason": reason,
            "attempt": pip.attempt,
            "created_by": created_by,
        }
        tmp = state_path.with_name(f".{state_path.name}.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, state_path)
        if reason is not None:
            raise PrepareFailed(reason)


def _install_locked(pip: PipInstall, venv: Path, log: IO[str], run_as: RunAs) -> str | None:
    python = venv / "bin" / "python"
    # As the task's user: a package's build runs its own code.
    env = {**os.environ, "HOME": str(venv)} if run_as is not None else None
    if not python.exists():
        _say(log, f"creating the job's virtualenv {venv}")
        # The launcher's own interpreter (or one the task's user may run): one known to
        # have venv and ensurepip, which a distribution's python3 may lack.
        maker = pip.python or sys.executable
        code, output = _run(
            [maker, "-m", "venv", "--system-site-packages", str(venv)], log, env, run_as
        )
        if code != 0:
            return f"{DEPENDENCY_FAILED}: cannot create the virtualenv {venv}: {output}"
    argv = [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        *pip.pip_args,
        *pip.packages,
    ]
    if pip.requirements:
        with as_user(run_as):  # a path of the job's: what its user may see of it
            found = os.path.isfile(pip.requirements)
        if not found:
            return f"{DEPENDENCY_FAILED}: no requirements file at {pip.requirements}"
        argv += ["-r", pip.requirements]
    code, output = _run(argv, log, env, run_as)
    if code != 0:
        what = " ".join(pip.packages) or pip.requirements
        return f"{DEPENDENCY_FAILED}: pip install of {what} exited with code {code}: {output}"
    return None


# --- mount paths --------------------------------------------------------------------------

Link = tuple[str, str]  # (path, target)


def _link(mount: Mount, task_dir: str, why_no_namespace: str | None) -> Link:
    view = Path(mount.view)
    inside = view == Path(task_dir) or Path(task_dir) in view.parents
    if os.path.lexists(view):
        raise PrepareFailed(
            f"{mount.what}: mount path {view} already exists on this machine, and the local "
            f"backend cannot mount over it without a mount namespace ({why_no_namespace})"
        )
    if inside:
        view.parent.mkdir(parents=True, exist_ok=True)
    elif not view.parent.is_dir() or not os.access(view.parent, os.W_OK):
        raise PrepareFailed(
            f"{mount.what}: mount path {view} cannot be made: {view.parent} is not a writable "
            f"directory, and mount namespaces are not available ({why_no_namespace})"
        )
    os.symlink(mount.host, view)
    return str(view), mount.host


def remove_links(links: list[Link], run_as: RunAs) -> None:
    """Remove the mount paths' symlinks, as the task's user: the directories above them
    are theirs, and the task may have swapped one for a link elsewhere while it ran
    (work/x -> /lib64): as root, this removed any link of the machine that pointed
    where a mount's did (/lib64/ld-linux-x86-64.so.2, and nothing dynamic ran after)."""
    with as_user(run_as):
        for path, target in links:
            try:
                if os.readlink(path) == target:
                    os.unlink(path)
            except OSError:
                pass


def run_preparation(
    plan: PreparePlan, plan_file: Path, command: list[str], log: IO[str]
) -> tuple[list[str], list[Link]]:
    """Carry out ``plan``; returns the argv that runs ``command`` in the task's view and
    the symlinks to remove when it ends. Raises :class:`PrepareFailed`."""
    hostname = socket.gethostname()
    if plan.checkout is not None:
        clone(plan.checkout, log, plan.run_as, plan.task_dir)
    with as_user(plan.run_as):
        for mount in plan.mounts:
            if not os.path.exists(mount.host):
                raise PrepareFailed(f"{mount.what}: {mount.host} does not exist on {hostname}")
    if plan.pip is not None:
        install(plan.pip, log, created_by=plan.task_dir, run_as=plan.run_as)

    links: list[Link] = []
    outside = plan.outside_mounts
    with as_user(plan.run_as):
        for mount in plan.mounts:
            if mount not in outside and mount.host != mount.view:
                links.append(_link(mount, plan.task_dir, None))
    if not outside:
        return command, links
    problem = namespace_problem()
    if problem is None:
        _say(
            log,
            "mount paths "
            + ", ".join(m.view for m in outside)
            + " in the task's own mount namespace",
        )
        return [*ENTER_ARGV, str(plan_file), "--", *command], links
    if plan.run_as is not None:
        # A symlink on the machine would be made for another user's task: no.
        raise PrepareFailed(
            "mount paths " + ", ".join(m.view for m in outside) + " need a mount namespace "
            f"of the task's own, which this machine does not give ({problem})"
        )
    _say(log, f"no mount namespace ({problem}); symlinks at the mount paths instead")
    try:
        for mount in outside:
            links.append(_link(mount, plan.task_dir, problem))
    except PrepareFailed:
        remove_links(links, plan.run_as)
        raise
    return command, links


def namespace_problem() -> str | None:
    """None when this machine lets a task have its own mount namespace, else why not."""
    proc = subprocess.run(
        [sys.executable, "-I", "-m", "trainyard_launcher.adapters.prepare", "probe"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return (
        None if proc.returncode == 0 else (proc.stderr.strip() or f"probe exited {proc.returncode}")
    )


# --- inside the namespace -----------------------------------------------------------------

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY = 1
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else os.fsencode(value)

    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {source or fstype} on {target}",
    )


def _own_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    user = uid != 0
    _check(_libc.unshare(_CLONE_NEWNS | (_CLONE_NEWUSER if user else 0)), "unshare")
    if user:
        # The task keeps its own uid; the capabilities the namespace gives end at exec.
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    # Nothing done here may reach the machine's own mount table.
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)


def _open_as(run_as: RunAs, path: str, flags: int, dir_fd: int | None = None) -> int:
    """``path`` opened as the task's user would open it: every step of its resolution
    (each directory searched, each symlink followed) with that user's rights."""
    with as_user(run_as):
        return os.open(path, flags | os.O_CLOEXEC, dir_fd=dir_fd)


def _bind(fd: int, target: str) -> None:
    """Bind what ``fd`` is onto ``target``: the object opened, not whatever its path
    names by now (the user may change the path between the opening and the mount)."""
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)


def _tmpfs_bound(size_mb: int | None, shown: int = 0) -> str:
    """A tmpfs's mount options for at most ``size_mb``: never more than the kernel's own
    default (half the machine's memory), and files counted too (each empty one is
    kernel memory its size does not count): 64 a MiB, 1,024 at least, besides the
    ``shown`` entries of the directory it covers (each takes one)."""
    if not size_mb:
        return ""
    half = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (2 * 1024 * 1024)
    size_mb = max(1, min(size_mb, half))
    return f",size={size_mb}m,nr_inodes={max(1024, size_mb * 64) + shown}"


def _shadow(
    target: str,
    original: str,
    run_as: RunAs,
    size_mb: int | None = None,
    keep: tuple[str, ...] = (),
) -> None:
    """Cover ``target`` with a tmpfs that shows ``original``'s entries (each bound from
    the original), so new entries can be made there without touching the original;
    the tmpfs has the original's owner and mode (so /tmp stays writable to the task, in
    the tmpfs), passable by all (a mount path inside must be reached: PAI-DLC's
    /root/data). ``original`` is reached, listed and each entry opened as the task's
    user: what the user may not reach shows nothing, a directory it may pass but not
    read (0711, the launcher's jobs) shows nothing and stays unreadable but for the
    entries on the way to ``keep`` (the task's own directories, whose names the task
    knows: without them its working directory was gone from its view), and a path
    changed meanwhile binds only what the user could reach anyway. ``size_mb`` bounds
    what the tmpfs holds."""
    try:
        reached = _open_as(run_as, original, os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno not in _UNREACHABLE:
            raise
        _mount("tmpfs", target, "tmpfs", 0, "mode=755" + _tmpfs_bound(size_mb))
        return
    try:
        info = os.fstat(reached)
        # The directory reached, opened again for its listing (not found again by name)
        # as the user: listed as root, a directory the user may pass but not read (the
        # launcher's jobs, 0711) showed every entry, each user's job ids.
        try:
            directory = _open_as(run_as, ".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=reached)
        except OSError as exc:
            if exc.errno not in _UNREACHABLE:
                raise
            directory = -1  # not the user's to list: only what is on the way to keep
        try:
            names = os.listdir(directory) if directory >= 0 else _on_the_way(original, keep)
            # Its mode, passable at least (a mount path inside /root, as PAI-DLC has
            # them, must be reached) but never more readable than it was; writable by
            # whom the original is.
            mode = stat.S_IMODE(info.st_mode) | 0o111
            size = _tmpfs_bound(size_mb, shown=len(names))
            _mount(
                "tmpfs",
                target,
                "tmpfs",
                0,
                f"mode={mode:o},uid={info.st_uid},gid={info.st_gid}{size}",
            )
            for name in names:
                try:
                    fd = _open_as(run_as, name, os.O_PATH | os.O_NOFOLLOW, dir_fd=reached)
                except OSError as exc:
                    if exc.errno in _UNREACHABLE:
                        continue  # not the user's to reach, or gone meanwhile
                    raise
                try:
                    _shadow_entry(fd, os.path.join(target, name))
                finally:
                    os.close(fd)
        finally:
            if directory >= 0:
                os.close(directory)
    finally:
        os.close(reached)


def _on_the_way(directory: str, paths: tuple[str, ...]) -> list[str]:
    """The names in ``directory`` that ``paths`` (of the machine) go through."""
    names: list[str] = []
    base = os.path.normpath(directory)
    for path in paths:
        relative = os.path.relpath(os.path.normpath(path), base)
        name = relative.split(os.sep, 1)[0]
        if relative != "." and name != ".." and name not in names:
            names.append(name)
    return names


# What an entry the user may not reach, or one gone meanwhile, raises.
_UNREACHABLE = (errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _shadow_entry(fd: int, path: str) -> None:
    mode = os.fstat(fd).st_mode
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink("", dir_fd=fd), path)
        return
    if stat.S_ISDIR(mode):
        os.mkdir(path)
    else:
        open(path, "w").close()
    try:
        _bind(fd, path)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.ENOENT):
            raise


def _fixed(directory: str) -> bool:
    """Whether only root may change ``directory``'s entries (root's, written by nobody
    else): a name looked up there is what it was a moment ago."""
    info = os.stat(directory)
    return info.st_uid == 0 and not info.st_mode & 0o022


class _View:
    """The task's view under ``root``, built by root. Every entry is made in a
    directory of ours (a tmpfs only this namespace sees), and every name is looked up
    there or in a directory only root may change: any other directory of the view (a
    bound source, a bound directory of the machine a user may write) is first covered
    by a tmpfs that shows its entries (_shadow, each opened as the user), so no path
    root follows passes through a name a user can change meanwhile. Where tasks run as
    this process's own user (``run_as`` None) only a directory an entry must be made
    in is covered."""

    def __init__(
        self, root: str, run_as: RunAs, size_mb: int | None = None, keep: tuple[str, ...] = ()
    ) -> None:
        self.root = root
        self.run_as = run_as
        self.size_mb = size_mb  # what each of its tmpfs may hold
        # Paths of the machine the task needs (its own directories): a directory it may
        # not list still shows the entries on their way (_shadow).
        self.keep = keep
        self.own = {root}  # directories of the view that are tmpfs of ours (or in one)
        # What each bound view path shows (a mount's source); below it, the same path.
        self.sources: dict[str, str] = {"/": "/"}

    def at(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def origin(self, path: str) -> str:
        """The path of the machine that ``path`` of the view shows."""
        if path in self.sources:
            return self.sources[path]
        parent, name = os.path.split(path)
        return os.path.join(self.origin(parent), name)

    def make(self, path: str, is_dir: bool) -> str:
        """``path`` in the view, created (as a directory or an empty file) if missing."""
        parts = [p for p in path.split("/") if p]
        current = "/"
        for i, part in enumerate(parts):
            parent, current = current, os.path.join(current, part)
            here = self.at(current)
            if self.at(parent) not in self.own and (
                (self.run_as is not None and not _fixed(self.at(parent)))
                or not os.path.lexists(here)
            ):
                # A name to look up where a user may change it, or an entry to make on
                # the machine: in a tmpfs of ours instead.
                _shadow(self.at(parent), self.origin(parent), self.run_as, self.size_mb, self.keep)
                self.own.add(self.at(parent))
            if os.path.islink(here):
                raise OSError(errno.ELOOP, f"mount path {path} goes through the symlink {current}")
            if os.path.lexists(here):
                continue
            if i < len(parts) - 1 or is_dir:
                os.mkdir(here)
            else:
                os.close(os.open(here, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
            self.own.add(here)
        return self.at(path)

    def bound(self, path: str, source: str) -> None:
        """``source`` was bound at ``path``: no longer a directory of ours."""
        self.own.discard(self.at(path))
        self.sources[path] = source


def enter(plan: PreparePlan, command: list[str]) -> None:
    """Build the task's view and exec ``command`` in it (does not return). Each mount's
    source is opened as the task's user, and what was opened is bound: the check the
    preparation made as that user cannot be raced by changing a path to a symlink
    before the mount."""
    root = os.path.join(plan.task_dir, "root")
    os.makedirs(root, exist_ok=True)
    cwd = os.getcwd()
    _own_namespace()
    keep = (plan.task_dir, cwd)
    view = _View(root, plan.run_as, plan.tmpfs_mb, keep)
    _shadow(root, "/", plan.run_as, plan.tmpfs_mb, keep)
    for mount in sorted(plan.outside_mounts, key=lambda m: m.view.count("/")):
        fd = _open_as(plan.run_as, mount.host, os.O_PATH)
        try:
            target = view.make(mount.view, stat.S_ISDIR(os.fstat(fd).st_mode))
            _bind(fd, target)
            view.bound(os.path.normpath(mount.view), mount.host)
        finally:
            os.close(fd)
    os.chroot(root)
    os.chdir(cwd)
    demote(plan.run_as)
    # The task's user now: the job's loader variables (for_root kept them from this
    # root process) are the command's again.
    os.execvpe(command[0], command, restored(os.environ))


def _probe() -> int:
    try:
        _own_namespace()
        # What ``enter`` needs: a tmpfs and a bind mount, seen by this process only.
        _mount("tmpfs", tempfile.gettempdir(), "tmpfs", 0, "mode=755")
        _mount("/", tempfile.gettempdir(), None, _MS_BIND)
    except OSError as exc:
        print(f"mount namespace unavailable: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["probe"]:
        return _probe()
    if args[:1] == ["enter"] and len(args) >= 4 and args[2] == "--":
        plan_file = Path(args[1])
        plan = PreparePlan.from_json(plan_file.read_text())
        # Opened before the view exists: a failure is written there, the platform's
        # own directory, never through a path of the view (which its user shapes).
        task_dir = os.open(plan.task_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            enter(plan, args[3:])
        except OSError as exc:
            reason = f"the task's mount paths cannot be made: {exc.strerror or exc}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(FAILED_FILE, flags, 0o644, dir_fd=task_dir), "w") as out:
                out.write(reason)
            print(f"trainyard prepare: {reason}", file=sys.stderr, flush=True)
            return ENTER_FAILED_EXIT
    print(
        "usage: python -m trainyard_launcher.adapters.prepare probe | enter PLAN -- COMMAND...",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
