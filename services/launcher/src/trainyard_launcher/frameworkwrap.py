"""The helpers a framework's tasks run around (or instead of) their command, inside the
task and as the task's user: ``python -I .../frameworkwrap.py MODE --dir FW ...`` (the
command a task gets from ``domain/frameworks.framework_command``). ``FW`` is the task's
own framework directory, ``<attempt>/<role>-<index>/fw``: the task's directory (its
records, the launcher's) is its parent and names the "host". Modes:

- ``xgboost-tracker``: rank 0 of an XGBoost job starts xgboost's ``RabitTracker`` with
  the task's own ``python`` (the job's virtualenv, where xgboost is installed), waits
  until it listens on MASTER_PORT, runs the command, then waits briefly for the tracker
  to see every worker finish. What Kubeflow's XGBoostJob leaves to the master's code.
- ``mpi-launcher``: writes the hostfile and the rsh agent into the framework directory
  and runs the command (which runs ``mpirun``); as root (only where the launcher runs
  tasks as root), with Open MPI's consent variables.
- ``mpi-worker``: writes the hostfile and this task's environment (``mpi-env.json``),
  then stays until the launcher task has ended: mpirun's ranks on this "host" are
  started through the agent, as sshd would start them in Kubeflow's worker pods.
- ``mpi-rsh HOST COMMAND...``: the agent mpirun calls instead of ssh. On the local
  backend every "host" is a task of the attempt; the remote command runs on this
  machine with that worker's environment and working directory.

The command a mode runs around comes in ``TRAINYARD_WRAPPED_COMMAND`` (not on the
command line, where ``ps`` would show its secrets to every user); it is written to a
private file in the task's directory and run with bash, as the task wrapper runs a
plain task's command. Kept free of pydantic and the rest of the service, so it starts
fast.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HOSTFILE = "hostfile"
AGENT = "mpi-agent"
ENV_FILE = "mpi-env.json"
EXIT_FILE = "exit.json"
COMMAND_VAR = "TRAINYARD_WRAPPED_COMMAND"
COMMAND_FILE = "framework-command.sh"
FILES_DIR = "fw"  # a task's framework directory, in its task directory
# How long mpirun's agent waits for a worker that is still preparing (its virtualenv).
WORKER_WAIT_S = 900.0
TRACKER_START_S = 120.0
TRACKER_GRACE_S = 30.0

TRACKER = """
import sys
from xgboost.tracker import RabitTracker
tracker = RabitTracker(n_workers=int(sys.argv[1]), host_ip=sys.argv[2], port=int(sys.argv[3]),
                       sortby="task")
tracker.start()
print("ready", flush=True)
tracker.wait_for()
"""


def say(text: str) -> None:
    print(f"trainyard: {text}", file=sys.stderr, flush=True)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _options(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs."""
    if len(argv) % 2 or any(not name.startswith("--") for name in argv[::2]):
        raise SystemExit(f"frameworkwrap: expected --name value pairs, got {argv}")
    return {name[2:]: value for name, value in zip(argv[::2], argv[1::2], strict=True)}


def _wrapped_command(files_dir: Path) -> list[str]:
    """The command this mode runs around, from its variable into a private file (and
    out of the environment the command itself sees)."""
    command = os.environ.pop(COMMAND_VAR, None)
    if command is None:
        raise SystemExit(f"frameworkwrap: no command in {COMMAND_VAR}")
    path = files_dir / COMMAND_FILE
    _write(path, command + "\n", 0o600)
    return [shutil.which("bash") or "/bin/bash", str(path)]


# --------------------------------------------------------------------------------- MPI


def _hosts(spec: str) -> list[tuple[str, int]]:
    return [
        (name, int(slots))
        for name, _, slots in (item.partition("=") for item in spec.split(",") if item)
    ]


def _host_of(files_dir: Path) -> str:
    # <attempt>/<role>-<index>/fw: the task's directory names the host.
    return files_dir.parent.name


def _mpi_files(files_dir: Path, hosts: list[tuple[str, int]], hydra: bool = False) -> None:
    # Open MPI's "host slots=N" lines, or Hydra's "host:N" (Intel MPI, MPICH).
    line = "{}:{}\n" if hydra else "{} slots={}\n"
    _write(files_dir / HOSTFILE, "".join(line.format(name, slots) for name, slots in hosts))
    if _host_of(files_dir) in {name for name, _ in hosts}:
        # What a rank started on this "host" runs with: this task's own environment.
        _write(
            files_dir / ENV_FILE, json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}), 0o600
        )


def mpi_launcher(options: dict[str, str]) -> int:
    files_dir = Path(options["dir"])
    command = _wrapped_command(files_dir)
    _mpi_files(files_dir, _hosts(options["hosts"]), options.get("hostfile-format") == "hydra")
    # This very script, with the interpreter that runs it: both readable by the task.
    agent = [sys.executable, "-I", os.path.abspath(__file__), "mpi-rsh"]
    agent += ["--attempt-dir", options["attempt-dir"]]
    _write(files_dir / AGENT, f'#!/bin/sh\nexec {shlex.join(agent)} "$@"\n', 0o755)
    env = dict(os.environ)
    if os.geteuid() == 0:
        # Open MPI refuses to run as root without both.
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        say(f"cannot start {command[0]!r}: {exc}")
    return 127


def mpi_worker(options: dict[str, str]) -> int:
    files_dir = Path(options["dir"])
    # This "host"'s own base for Open MPI's session directories, in the environment its
    # ranks' daemon starts with (mpirun passes only its own MCA settings on): the workers
    # of one job on one machine otherwise all make <tmp>/ompi.<node>.<uid>/jf.<n> at the
    # same moment, and Open MPI 4 fails the one that loses ("mkdir ... File exists",
    # orte_session_dir). Each pod has its own /tmp on Kubernetes; this is that.
    session_base = tempfile.mkdtemp(prefix="trainyard-mpi-")
    os.environ["OMPI_MCA_orte_tmpdir_base"] = session_base
    os.environ["PRTE_MCA_prte_tmpdir_base"] = session_base
    try:
        hydra = options.get("hostfile-format") == "hydra"
        _mpi_files(files_dir, _hosts(options["hosts"]), hydra)
        until = Path(options["until"])
        say(
            f"MPI worker {_host_of(files_dir)}: ranks arrive through mpirun; waiting until "
            f"{until.parent.name} ends"
        )
        while not until.exists():
            time.sleep(0.2)
    finally:
        shutil.rmtree(session_base, ignore_errors=True)
    return 0


def mpi_rsh(argv: list[str]) -> int:
    options: dict[str, str] = {}
    while argv[:1] == ["--attempt-dir"]:
        options["attempt-dir"], argv = argv[1], argv[2:]
    # ssh-style options some launchers pass (Hydra's -x) come before the host.
    while argv and argv[0].startswith("-"):
        argv = argv[1:]
    if not argv:
        say("mpi agent: no host given")
        return 255
    host, words = argv[0], argv[1:]
    if not host or "/" in host or host in (".", ".."):
        # Hosts are task directory names of this attempt: nothing may reach outside it
        # (another job's saved environment holds its secrets).
        say(f"mpi agent: {host!r} is not a host of this job")
        return 255
    worker = Path(options["attempt-dir"]) / host
    deadline = time.monotonic() + WORKER_WAIT_S
    env_file = worker / FILES_DIR / ENV_FILE
    while not env_file.exists():
        if (worker / EXIT_FILE).exists() or time.monotonic() > deadline:
            say(f"mpi agent: host {host} is not a running task of this job ({worker})")
            return 255
        time.sleep(0.1)
    saved = json.loads(env_file.read_text())
    os.chdir(saved["cwd"])
    os.execve("/bin/sh", ["/bin/sh", "-c", " ".join(words)], saved["env"])
    return 127  # not reached


# ----------------------------------------------------------------------------- XGBoost


def xgboost_tracker(options: dict[str, str]) -> int:
    command = _wrapped_command(Path(options["dir"]))
    python = shutil.which("python", path=os.environ.get("PATH")) or "python3"
    tracker = subprocess.Popen(
        [python, "-c", TRACKER, options["workers"], options["host"], options["port"]],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert tracker.stdout is not None
    ready, _, _ = select.select([tracker.stdout], [], [], TRACKER_START_S)
    line = tracker.stdout.readline().strip() if ready else ""
    if line != "ready":
        tracker.kill()
        tracker.wait()
        say(
            f"the XGBoost tracker did not start with {python} on "
            f"{options['host']}:{options['port']} (is xgboost installed in the job's "
            "environment?)"
        )
        return 1
    say(f"XGBoost tracker for {options['workers']} workers on {options['host']}:{options['port']}")
    stdout = tracker.stdout
    threading.Thread(target=lambda: [sys.stdout.write(x) for x in stdout], daemon=True).start()
    try:
        code = subprocess.call(command)
    except OSError as exc:
        say(f"cannot start {command[0]!r}: {exc}")
        code = 127
    try:
        tracker.wait(timeout=TRACKER_GRACE_S)
    except subprocess.TimeoutExpired:
        tracker.kill()
        tracker.wait()
    return code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m trainyard_launcher.frameworkwrap MODE ...")
    mode, rest = args[0], args[1:]
    if mode == "mpi-rsh":
        return mpi_rsh(rest)
    options = _options(rest)
    if mode == "mpi-worker":
        return mpi_worker(options)
    if mode == "mpi-launcher":
        return mpi_launcher(options)
    if mode == "xgboost-tracker":
        return xgboost_tracker(options)
    raise SystemExit(f"frameworkwrap: unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main())
