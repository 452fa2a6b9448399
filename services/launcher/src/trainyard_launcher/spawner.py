"""A warm process that starts the task wrappers by forking itself.

Each task's wrapper (:mod:`trainyard_launcher.taskwrap`) was a fresh interpreter: on two
cores its start (the interpreter, then the wrapper's imports) was about half of a
one-task job's CPU. The local backend starts this process once instead, with the
wrapper and what it imports already loaded, and asks it for each task: it forks, and
the child becomes exactly what a fresh ``python -I -m trainyard_launcher.taskwrap``
would have been for that task (its own session, working directory, environment,
stdin from /dev/null, stdout and stderr to the task's logs, no other descriptor, a
fresh interpreter's signal dispositions) and runs the wrapper's ``main``.

One request per line on stdin, exactly one answer per line on stdout, JSON:
``{"id", "args", "cwd", "env", "stdout", "stderr"}`` -> ``{"id", "pid", "start_ticks"}``
or ``{"id", "error"}``; the answer comes once the child is in its session and
directory. An answer out of step, or none, and the launcher stops this spawner and
starts another; a request it may have acted on is never sent again to anyone (the
wrapper's pid file says whether it started: local.py). It runs in a session of its
own (a Ctrl-C to the launcher's group must not kill it mid-request) and ends when its
stdin does (the launcher went): the wrappers it started live on in their sessions, as
ever. It reaps its children itself, so their CPU time counts in its own and then the
launcher's, as the wrappers' did.

It is started with an empty environment: a forked wrapper's ``/proc/<pid>/environ``
shows the environment its process image started with, which is this process's, and
that must not be the launcher's. Standard library only, as the wrapper.
"""

from __future__ import annotations

import errno
import json
import os
import select
import subprocess
import sys
import traceback
from typing import IO, Any

from trainyard_launcher.adapters.procfs import start_ticks

_REAP_EVERY_S = 0.5
_MAX_LINE = 64 * 1024 * 1024  # a request carries the task's environment (bounded: local.py)


class SpawnerGone(Exception):
    """The spawner was not there to take the request: no wrapper was started for it
    (the caller starts one itself)."""


class SpawnerLost(Exception):
    """The spawner took the request and gave no answer (it died, or answered another
    request): a wrapper may or may not have started; its pid file says."""


class Spawner:
    """The launcher's side: starts the spawner process and asks it for wrappers."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._sent = 0

    def spawn(
        self, args: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str
    ) -> tuple[int, int | None]:
        """The pid and start ticks of a new wrapper run with ``args`` (taskwrap's
        arguments). OSError when it cannot be started (what Popen would raise);
        SpawnerGone or SpawnerLost when the spawner cannot say (see each)."""
        proc = self._running()
        self._sent += 1
        request = {"id": self._sent, "args": args, "cwd": cwd, "env": env,
                   "stdout": stdout, "stderr": stderr}  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
        except OSError as exc:  # it ended before it had the whole request
            self._forget()
            raise SpawnerGone(str(exc)) from exc
        try:
            line = proc.stdout.readline()
            answer = json.loads(line) if line else {}
        except (OSError, ValueError) as exc:
            self._forget()
            raise SpawnerLost(repr(exc)) from exc
        if answer.get("id") != self._sent:
            self._forget()  # out of step: nothing it says can be trusted now
            raise SpawnerLost("the spawner ended" if not line else f"answer out of step: {line!r}")
        if "error" in answer:
            raise OSError(answer.get("errno") or 0, answer["error"])
        return int(answer["pid"]), answer.get("start_ticks")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            proc.stdout.close()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._forget()
        try:
            self._proc = subprocess.Popen(
                [self.python, "-I", "-m", "trainyard_launcher.spawner"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={},
                close_fds=True,
                # Out of the launcher's process group: a Ctrl-C or a group's SIGINT
                # stops the launcher gracefully, and must not kill this mid-request.
                start_new_session=True,
            )
        except OSError as exc:
            raise SpawnerGone(f"cannot start the spawner: {exc}") from exc
        return self._proc

    def _forget(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# --- the spawner process ------------------------------------------------------------------


def serve(requests: int = 0, answers: int = 1) -> None:
    """Answer requests on fd ``requests`` until it ends, reaping children meanwhile:
    exactly one answer per request line, with the request's id."""
    pending = b""
    skipping = False  # inside a line that was too long, answered already
    while True:
        ready, _, _ = select.select([requests], [], [], _REAP_EVERY_S)
        _reap()
        if not ready:
            continue
        chunk = os.read(requests, 65536)
        if not chunk:
            _reap()
            return
        pending += chunk
        while True:
            if skipping:  # inside a line too long, answered already: drop to its end
                if b"\n" not in pending:
                    pending = b""
                    break
                pending, skipping = pending.split(b"\n", 1)[1], False
                continue
            if b"\n" not in pending:
                if len(pending) > _MAX_LINE:
                    # Its id is in what is dropped: the launcher finds this answer out
                    # of step and starts another spawner.
                    _answer(answers, {"id": None, "error": "request too long"})
                    pending, skipping = b"", True
                break
            line, pending = pending.split(b"\n", 1)
            _answer(answers, _handle(line))


def _handle(line: bytes) -> dict[str, Any]:
    request_id = None
    try:
        request = json.loads(line)
        request_id = request.get("id")
        pid, ticks = start(request)
        return {"id": request_id, "pid": pid, "start_ticks": ticks}
    except OSError as exc:
        why = exc.strerror or str(exc)
        return {"id": request_id, "errno": exc.errno,
                "error": f"{why}: {exc.filename}" if exc.filename else why}  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return {"id": request_id, "error": f"bad request: {exc!r}"}


def _answer(fd: int, answer: dict[str, Any]) -> None:
    data = json.dumps(answer).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def start(request: dict[str, Any]) -> tuple[int, int | None]:
    """Fork a wrapper for ``request``; its pid and start ticks (read before this
    process can reap it). What Popen would refuse (no working directory, a log that
    cannot be opened) raises OSError here, in the spawner."""
    args = [str(a) for a in request["args"]]
    cwd = str(request["cwd"])
    env = {str(k): str(v) for k, v in request["env"].items()}
    if not os.path.isdir(cwd):
        raise FileNotFoundError(errno.ENOENT, "no such directory", cwd)
    fds = [os.open(os.devnull, os.O_RDONLY)]
    try:
        for path in (request["stdout"], request["stderr"]):
            fds.append(os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        ready_r, ready_w = os.pipe()
        fds.append(ready_r)
        try:
            pid = os.fork()
        except OSError:
            os.close(ready_w)
            raise
        if pid == 0:  # pragma: no cover - the child; its end is os._exit
            _become_wrapper(args, cwd, env, fds[:3], ready_w)
        os.close(ready_w)
        # As Popen: the answer comes once the child is in its session and directory,
        # or says why it could not get there.
        why = b""
        while chunk := os.read(ready_r, 4096):
            why += chunk
        if why:
            raise OSError(errno.EIO, why.decode(errors="replace"))
        return pid, start_ticks(pid)
    finally:
        for fd in fds:
            os.close(fd)


def _become_wrapper(
    args: list[str], cwd: str, env: dict[str, str], fds: list[int], ready: int
) -> None:
    code = 1
    try:
        try:
            os.setsid()
            os.chdir(cwd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.environ.clear()
            os.environ.update(env)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in a variable
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            os.write(ready, f"{why}: {cwd}".encode())
            os._exit(1)  # refused through the answer: nothing for the task's log
        os.close(ready)  # ready: the spawner answers with this pid
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        # Signal dispositions: this process never changes Python's, so they are a
        # fresh interpreter's already.
        sys.argv = ["trainyard_launcher.taskwrap", *args]
        from trainyard_launcher import taskwrap  # loaded already: _warm()

        code = taskwrap.main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child must end here, whatever happened
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            _flush(stream)
        os._exit(code)


def _flush(stream: IO[str] | None) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):
        pass


def _warm() -> None:
    """What a wrapper may import, loaded once here instead of in every task."""
    import trainyard_launcher.adapters.identity  # noqa: F401
    import trainyard_launcher.adapters.limits  # noqa: F401
    import trainyard_launcher.logs  # noqa: F401
    import trainyard_launcher.taskwrap  # noqa: F401


if __name__ == "__main__":
    # Forked wrappers must not keep the spawner's pipes: they are 0 and 1 here, which
    # every child replaces at once; nothing else is open.
    _warm()
    serve()
