"""What a ``yard exec`` command runs under on the local backend: nothing it starts
outlives it.

    python -I -m trainyard_launcher.execwrap ARGV...

Started by the launcher (as root where tasks run as their users, so the command's user
cannot kill it) with the environment ARGV gets. It becomes a child subreaper, runs ARGV
(``setpriv``/``nsenter``: the task's user in the task's view) in a process group of its
own, and when ARGV ends, or on SIGTERM (the exec's timeout, the task's stop), kills that
group and then every process still below it: a process that left the command's group
and session (``setsid``) lost its parent and is this process's child by then. Without
it such a process outlived the exec and the task, running for a user whose job had
ended (docs/security.md). Exits with ARGV's status (128 + the signal that ended it).

Standard library only, and the task wrapper's two helpers: it starts for every exec.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from trainyard_launcher.taskwrap import become_subreaper, sweep_children


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    if not argv:
        os.write(2, b"trainyard: execwrap: no command\n")
        return 2
    become_subreaper()
    # A SIGTERM before the handler is set waits for it (and would otherwise end this
    # process first, leaving the command to run on).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = os.fork()
    if child == 0:
        try:
            os.setpgid(0, 0)
            # Python ignores these two at its start, and an exec keeps an ignored
            # signal ignored: a writer to a closed pipe would not die of SIGPIPE.
            for ignored in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(ignored, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"trainyard: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)
    try:
        os.setpgid(child, child)  # as the child does: whichever runs first
    except OSError:
        pass

    def end(_signum: int, _frame: FrameType | None) -> None:
        _kill_group(child)

    signal.signal(signal.SIGTERM, end)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    status: int | None = None
    while status is None:
        try:
            pid, waited = os.waitpid(-1, 0)  # orphans that end meanwhile are reaped too
        except ChildProcessError:
            break
        if pid == child:
            status = waited
    _kill_group(child)  # what it left running in its group (`sleep 100 &`)
    sweep_children(child)  # and what left the group, our children by now
    if status is None:
        return 127
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
