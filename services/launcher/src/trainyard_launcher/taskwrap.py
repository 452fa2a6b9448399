"""The process that stands for one task: ``python -m trainyard_launcher.taskwrap
--dir TASKDIR -- COMMAND...``.

The launcher starts it in a session of its own, so the task outlives a launcher crash
and a restarted launcher can adopt it by the pid file. It writes ``pid`` first, runs the
command as a child in the child's own process group, forwards SIGTERM/SIGINT to that
group, and when the command ends kills what is left of the group (a container's end
takes every process with it) and writes ``exit.json`` atomically.

With ``--prepare PLAN`` it first carries out the task's preparation (code checkout, data
sources, the job's virtualenv, mount paths: :mod:`trainyard_launcher.adapters.prepare`),
here in the task's own process so a slow install never holds the launcher up. A failed
preparation ends the task without running the command, with ``reason`` in ``exit.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from trainyard_launcher.adapters.procfs import start_ticks

# Written by the preparation when it cannot build the task's view (adapters/prepare.py).
FAILED_FILE = "prepare-failed"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainyard_launcher.taskwrap")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--prepare", type=Path, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    task_dir: Path = args.dir
    if not command:
        parser.error("no command after --")

    write_atomically(task_dir / "pid", f"{os.getpid()} {start_ticks(os.getpid())}\n")

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

    child_env: dict[str, str] | None = None
    links: list[tuple[str, str]] = []
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
            command, links = run_preparation(plan, args.prepare, command, sys.stderr)
        except PrepareFailed as exc:
            print(f"trainyard: {exc}", file=sys.stderr, flush=True)
            return _end_unstarted(task_dir, pending, str(exc))
        child_env = prepared_env(dict(os.environ), plan)
        if pending:
            # Stopped while preparing: the command never starts.
            remove_links(links)
            return _end_unstarted(task_dir, pending, None)

    try:
        child = subprocess.Popen(
            command, cwd=task_dir / "work", stdin=subprocess.DEVNULL, process_group=0,
            env=child_env,
        )
    except OSError as exc:
        print(f"trainyard: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_atomically(
            task_dir / "exit.json",
            json.dumps({"exit_code": 127, "signal": None, "ended_at": time.time()}),
        )
        return 127
    for signum in pending:
        forward(signum, None)

    returncode = child.wait()
    if links:
        from trainyard_launcher.adapters.prepare import remove_links

        remove_links(links)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    killed_by = -returncode if returncode < 0 else None
    exit_code = 128 + killed_by if killed_by else returncode
    ended: dict[str, object] = {"exit_code": exit_code, "signal": killed_by, "ended_at": time.time()}
    if (failed := task_dir / FAILED_FILE).exists():
        ended["reason"] = failed.read_text().strip()
    write_atomically(task_dir / "exit.json", json.dumps(ended))
    return exit_code


def _end_unstarted(task_dir: Path, pending: list[int], reason: str | None) -> int:
    killed_by = pending[0] if pending else None
    # No exit code when the command never ran: the reason says what happened instead.
    exit_code = 128 + killed_by if killed_by else None
    ended: dict[str, object] = {"exit_code": exit_code, "signal": killed_by, "ended_at": time.time()}
    if reason is not None and not killed_by:
        ended["reason"] = reason
    write_atomically(task_dir / "exit.json", json.dumps(ended))
    return exit_code or 1


if __name__ == "__main__":
    sys.exit(main())
