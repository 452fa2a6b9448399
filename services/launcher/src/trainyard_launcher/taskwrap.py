"""The process that stands for one task: ``python -m trainyard_launcher.taskwrap
--dir TASKDIR -- COMMAND...``.

The launcher starts it in a session of its own, so the task outlives a launcher crash
and a restarted launcher can adopt it by the pid file. It writes ``pid`` first, runs the
command as a child in the child's own process group, forwards SIGTERM/SIGINT to that
group, and when the command ends kills what is left of the group (a container's end
takes every process with it) and writes ``exit.json`` atomically.
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

    try:
        child = subprocess.Popen(
            command, cwd=task_dir / "work", stdin=subprocess.DEVNULL, process_group=0,
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
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    killed_by = -returncode if returncode < 0 else None
    exit_code = 128 + killed_by if killed_by else returncode
    write_atomically(
        task_dir / "exit.json",
        json.dumps({"exit_code": exit_code, "signal": killed_by, "ended_at": time.time()}),
    )
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
