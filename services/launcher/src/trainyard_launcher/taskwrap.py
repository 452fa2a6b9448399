"""The process that stands for one task: ``python -m trainyard_launcher.taskwrap
--dir TASKDIR [--prepare PLAN] [--options OPTIONS] -- COMMAND...``.

The launcher starts it in a session of its own, so the task outlives a launcher crash
and a restarted launcher can adopt it by the pid file. It writes ``pid`` first, runs the
command as a child in the child's own process group, forwards SIGTERM/SIGINT to that
group, and when the command ends kills what is left of the group — and, as the task's
child subreaper, every process the command left behind even outside its group or
session (a container's end takes every process with it) — and writes ``exit.json``
atomically.

With ``--prepare PLAN`` it first carries out the task's preparation (code checkout, data
sources, the job's virtualenv, mount paths: :mod:`trainyard_launcher.adapters.prepare`),
here in the task's own process so a slow install never holds the launcher up. A failed
preparation ends the task without running the command, with ``reason`` in ``exit.json``.

``--options`` (JSON): ``debug`` runs a keep-alive in place of the command (T9k's debug
mode: everything prepared, nothing run); ``limits`` is the task's
:class:`~trainyard_launcher.domain.limits.LimitPlan`, entered by the command's process
before it runs; ``log_max_bytes`` caps each log stream (:mod:`trainyard_launcher.logs`):
the command's output reaches its log through a pipe the wrapper copies. ``started`` is
written once the command (or the keep-alive) runs, for the launcher's start deadline.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

from trainyard_launcher.adapters.identity import for_root, restored
from trainyard_launcher.adapters.procfs import pss_bytes, signal_below, start_ticks, tree

if TYPE_CHECKING:
    from trainyard_launcher.logs import CappedLog

# Written by the preparation when it cannot build the task's view (adapters/prepare.py).
FAILED_FILE = "prepare-failed"
# Written when the command (or the debug keep-alive) has started.
STARTED_FILE = "started"
OUT_OF_MEMORY = "out_of_memory"  # domain.failure.EndKind.OUT_OF_MEMORY
_PR_SET_CHILD_SUBREAPER = 36
_CHUNK = 64 * 1024


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LogText:
    """A text stream over a capped log, for the preparation's and the wrapper's words."""

    def __init__(self, log: CappedLog) -> None:
        self.log = log

    def write(self, text: str) -> int:
        self.log.write(text.encode(errors="replace"))
        return len(text)

    def flush(self) -> None:
        return None


class Args(NamedTuple):
    dir: Path
    prepare: Path | None
    options: Path | None
    command: list[str]


USAGE = (
    "usage: trainyard_launcher.taskwrap --dir DIR [--prepare PLAN] [--options FILE] -- COMMAND..."
)


def parse_args(argv: list[str]) -> Args:
    """``--dir DIR [--prepare PLAN] [--options FILE] -- COMMAND...`` (by hand: argparse
    costs every task's start 5 ms); exits with the usage on anything else."""
    paths: dict[str, Path] = {}
    rest = list(argv)
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if flag not in ("--dir", "--prepare", "--options") or not rest or flag in paths:
            sys.exit(f"{USAGE}\nbad argument: {flag!r}")
        paths[flag] = Path(rest.pop(0))
    command = rest[1:]
    if "--dir" not in paths or not command:
        sys.exit(f"{USAGE}\n{'no --dir' if '--dir' not in paths else 'no command after --'}")
    return Args(paths["--dir"], paths.get("--prepare"), paths.get("--options"), command)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command
    task_dir = args.dir

    write_atomically(task_dir / "pid", f"{os.getpid()} {start_ticks(os.getpid())}\n")
    # What this wrapper runs as root (a probe, the view's builder) never sees the
    # loader's variables the job set; the command gets them back as the task's user.
    task_env = for_root(os.environ)
    os.environ.clear()
    os.environ.update(task_env)

    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    become_subreaper()

    # Imported only now (it loads asyncio): the pid file and the handlers come first.
    from trainyard_launcher.logs import CappedLog

    options = json.loads(args.options.read_text()) if args.options is not None else {}
    cap = int(options.get("log_max_bytes") or 0)
    out_log = CappedLog(task_dir / "stdout.log", cap)
    err_log = CappedLog(task_dir / "stderr.log", cap)
    say = LogText(err_log)
    if options.get("debug"):
        # T9k's debug mode: the task is made ready, but a keep-alive runs, not the command.
        command = [shutil.which("sleep") or "/bin/sleep", "infinity"]
        say.write(
            "trainyard: debug mode: the command is not run; this task stays up until "
            "the job is stopped (`yard exec` runs commands in it)\n"
        )

    child_env: dict[str, str] | None = None
    links: list[tuple[str, str]] = []
    links_owner: tuple[int, int] | None = None
    if args.prepare is not None:
        # Imported only now: they load pydantic, and the pid file must come first and fast.
        from trainyard_launcher.adapters.prepare import (
            PrepareFailed,
            remove_links,
            run_preparation,
        )
        from trainyard_launcher.domain.prepare import PreparePlan, prepared_env

        plan = PreparePlan.from_json(args.prepare.read_text())
        try:
            command, links = run_preparation(plan, args.prepare, command, say)  # type: ignore[arg-type]
        except PrepareFailed as exc:
            say.write(f"trainyard: {exc}\n")
            return _end_unstarted(task_dir, pending, str(exc))
        child_env = prepared_env(dict(os.environ), plan)
        links_owner = plan.run_as
        if pending:
            # Stopped while preparing: the command never starts.
            remove_links(links, links_owner)
            return _end_unstarted(task_dir, pending, None)

    limits = None
    cgroup: str | None = None
    run_as = tuple(options["run_as"]) if options.get("run_as") else None
    if run_as is not None and args.prepare is not None and _enters(command):
        run_as = None  # the view's builder becomes the task's user after its mounts
    if options.get("limits"):
        from trainyard_launcher.adapters.limits import make_cgroup
        from trainyard_launcher.domain.limits import LimitPlan

        limits = LimitPlan(**options["limits"])
        cgroup = make_cgroup(limits)
    memory = _MemoryWatch(limits, cgroup) if limits is not None else None

    # Imported before the fork (the child between fork and exec only calls), and only
    # when needed: a plain task's command starts without loading them.
    enter = _importer("trainyard_launcher.adapters.limits", "enter_limits") if limits else None
    demote = _importer("trainyard_launcher.adapters.identity", "demote") if run_as else None

    def preexec() -> None:
        # The limits first (a cgroup and /dev/shm need the wrapper's rights), then the
        # task's own user for good.
        if enter is not None:
            enter(limits, cgroup)
        if demote is not None and run_as is not None:
            demote((int(run_as[0]), int(run_as[1])))

    if child_env is None:
        child_env = dict(os.environ)
    if args.prepare is None or not _enters(command):
        # Run as the task's user (preexec): the job's own variables, all of them. The
        # view's builder (root) gives them back itself once it is the user. (Only a
        # prepared task may enter a view: a plain one never imports prepare.py.)
        child_env = restored(child_env)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = subprocess.Popen(
            command,
            cwd=task_dir / "work",
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            process_group=0,
            env=child_env,
            preexec_fn=preexec if limits is not None or run_as is not None else None,
        )
    except OSError as exc:
        say.write(f"trainyard: cannot start {command[0]!r}: {exc}\n")
        write_atomically(
            task_dir / "exit.json",
            json.dumps({"exit_code": 127, "signal": None, "ended_at": time.time()}),
        )
        return 127
    finally:
        os.close(out_w)
        os.close(err_w)
    write_atomically(task_dir / STARTED_FILE, f"{time.time()}\n")
    for signum in pending:
        forward(signum, None)

    pipes = {out_r: out_log, err_r: err_log}
    returncode = _pump(child, pipes, memory)
    if links:
        from trainyard_launcher.adapters.prepare import remove_links

        remove_links(links, links_owner)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    sweep_children(child.pid)
    _drain(pipes)
    killed_by = -returncode if returncode < 0 else None
    exit_code = 128 + killed_by if killed_by else returncode
    ended: dict[str, object] = {
        "exit_code": exit_code,
        "signal": killed_by,
        "ended_at": time.time(),
    }
    if (failed := task_dir / FAILED_FILE).exists():
        ended["reason"] = failed.read_text().strip()
    elif limits is not None and memory is not None and memory.held is not None:
        from trainyard_launcher.domain.limits import out_of_memory_note

        ended.update(end_kind=OUT_OF_MEMORY, reason=out_of_memory_note(limits, memory.held))
    elif limits is not None and exit_code != 0 and _out_of_memory(limits, cgroup, err_log):
        from trainyard_launcher.domain.limits import out_of_memory_note

        ended.update(end_kind=OUT_OF_MEMORY, reason=out_of_memory_note(limits))
    if cgroup is not None:
        from trainyard_launcher.adapters.limits import remove_cgroup

        remove_cgroup(cgroup)
    out_log.close()
    err_log.close()
    write_atomically(task_dir / "exit.json", json.dumps(ended))
    return exit_code


class _MemoryWatch:
    """The task's memory, sampled, where no cgroup holds its total (domain/limits.py,
    sampled_memory_limit): ``held`` is set to what its processes held together once
    that went past the limit."""

    def __init__(self, limits: Any, cgroup: str | None) -> None:
        from trainyard_launcher.domain.limits import sampled_memory_limit

        self.limit = sampled_memory_limit(limits, cgroup)
        self.held: int | None = None
        self._next = time.monotonic() + 1.0

    def over(self) -> bool:
        """Whether the task held more than its limit, looked at once a second."""
        if self.limit is None or self.held is not None:
            return self.held is not None
        if (now := time.monotonic()) < self._next:
            return False
        self._next = now + 1.0
        held = sum(pss_bytes(pid) for pid in tree(os.getpid()))
        if held > self.limit:
            self.held = held
        return self.held is not None


def _pump(
    child: subprocess.Popen[bytes], logs: dict[int, CappedLog], memory: _MemoryWatch | None
) -> int:
    """Copy the command's output to its logs until it exits; its exit status. Every
    second the task's memory is looked at (``memory``): past its limit, every process
    of the task is killed."""
    rounds = 0
    while True:
        if logs:
            ready, _, _ = select.select(list(logs), [], [], 0.2)
            for fd in ready:
                _copy(fd, logs)
        elif memory is None or memory.limit is None:
            return child.wait()
        else:
            time.sleep(0.2)  # outputs closed: still looked at
        if (code := child.poll()) is not None:
            return code
        rounds += 1
        if rounds % 25 == 0:
            _reap_orphans(child.pid)
        if memory is not None and memory.over():
            # Everything below first, the command last (children before parents): a
            # process whose parent died first could slip out of the walk.
            signal_below(os.getpid(), signal.SIGKILL)
            child.kill()  # not yet collected: its pid is still its own
            return child.wait()


def _copy(fd: int, logs: dict[int, CappedLog]) -> bool:
    """One read from ``fd`` into its log; False (and the pipe closed) at its end."""
    data = os.read(fd, _CHUNK)
    if data:
        logs[fd].write(data)
        return True
    os.close(fd)
    del logs[fd]
    return False


def _drain(logs: dict[int, CappedLog], quiet_s: float = 1.0) -> None:
    """What is left in the pipes once every writer is gone (or silent for quiet_s)."""
    while logs:
        ready, _, _ = select.select(list(logs), [], [], quiet_s)
        if not ready:
            break
        for fd in ready:
            _copy(fd, logs)
    for fd in list(logs):
        os.close(fd)
        del logs[fd]


def become_subreaper() -> None:
    # Orphans of the command (a daemon that left its group and session) become our
    # children instead of init's, so the task's end can find and end them.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _children() -> list[tuple[int, str]]:
    """This process's children and their states. The kernel lists them
    (``/proc/<pid>/task/<pid>/children``: the wrapper has one thread); only where it
    does not is every process's stat read, which on a busy node is hundreds of files."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            names = f.read().split()
    except OSError:
        names = [name.encode() for name in os.listdir("/proc") if name.isdigit()]
    found = []
    for name in names:
        try:
            with open(b"/proc/" + name + b"/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2 :].split()
        if len(rest) > 1 and int(rest[1]) == me:
            found.append((int(name), rest[0]))
    return found


def _reap_orphans(child_pid: int) -> None:
    for pid, state in _children():
        if state == "Z" and pid != child_pid:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def sweep_children(child_pid: int) -> None:
    """End every process the command left behind: each pass kills every process below
    this one, however deep (killing only our children, the orphans, left a chain of
    processes one level a pass: a chain deeper than the passes outlived the sweep), and
    reaps what became ours (as subreaper, what a killed process left); until none is
    left."""
    me = os.getpid()
    for _ in range(100):
        children = _children()
        for pid, state in children:
            if state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        if not any(state != "Z" for _, state in children):
            return
        signal_below(me, signal.SIGKILL)
        time.sleep(0.02)


def _out_of_memory(limits: object, cgroup: str | None, err_log: CappedLog) -> bool:
    from trainyard_launcher.adapters.limits import oom_kills
    from trainyard_launcher.domain.limits import LimitPlan, memory_exhausted

    assert isinstance(limits, LimitPlan)
    if not limits.memory_mb:
        return False
    if cgroup is not None and limits.memory_by == "cgroup":
        return oom_kills(cgroup) > 0
    try:
        with open(err_log.path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 16 * 1024, 0))
            tail = f.read().decode(errors="replace")
    except OSError:
        return False
    return memory_exhausted(tail)


def _importer(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _enters(command: list[str]) -> bool:
    from trainyard_launcher.adapters.prepare import ENTER_ARGV

    return command[: len(ENTER_ARGV)] == ENTER_ARGV


def _end_unstarted(task_dir: Path, pending: list[int], reason: str | None) -> int:
    killed_by = pending[0] if pending else None
    # No exit code when the command never ran: the reason says what happened instead.
    exit_code = 128 + killed_by if killed_by else None
    ended: dict[str, object] = {
        "exit_code": exit_code,
        "signal": killed_by,
        "ended_at": time.time(),
    }
    if reason is not None and not killed_by:
        ended["reason"] = reason
    write_atomically(task_dir / "exit.json", json.dumps(ended))
    return exit_code or 1


if __name__ == "__main__":
    sys.exit(main())
