"""``trainyard-stack``: run the platform on this machine.

- ``run``: start everything, submit the example job, show it until it ends, then keep the
  platform up until Ctrl-C (``make run``).
- ``serve``: start everything and keep it up until SIGTERM or Ctrl-C.
- ``kube-up`` / ``kube-down``: the project's own Kubernetes control plane with KWOK
  nodes (``make kube-up``), its kubeconfig in ``<data>/kube/kubeconfig``; with
  ``YARD_LAUNCHER=kubernetes`` the platform then runs its tasks as pods there.
- ``up`` / ``down``: ``serve`` in the background, returning once every service answers
  its health check / stopping it cleanly (``make up`` / ``make down``). ``down`` stops
  the jobs' tasks first (they run again at the next start, no retry spent); with
  ``--keep-tasks`` it leaves them running for the next start to adopt.
- ``migrate-store``: copy the data of an earlier version's embedded FerretDB (or of a
  MongoDB, ``--from URL``) into the embedded SQLite store (``make migrate-store``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from trainyard_common.cluster import NodeSpec, load_cluster
from trainyard_common.config import default_data_dir
from trainyard_common.docstore import SqliteClient
from trainyard_common.storage import mongo_client

from .components import ComponentError, FerretDB, ensure_ferretdb_binary, repo_root
from .kube import KubeCluster
from .metrics import Prometheus
from .migrate import copy_databases
from .platform import Platform, PlatformConfig, ensure_admin_token, stop_tasks

TERMINAL = {"REJECTED", "SUCCEEDED", "FAILED", "STOPPED"}


def _config(args: argparse.Namespace) -> PlatformConfig:
    cluster = args.cluster or os.environ.get("YARD_CLUSTER")
    return PlatformConfig(
        data_dir=Path(args.data_dir),
        cluster_file=Path(cluster) if cluster else None,
        log_level=args.log_level,
    )


class Stopper:
    """Turns SIGINT, SIGTERM and SIGHUP (a closed terminal) into one flag, installed
    before anything starts so that a Ctrl-C at any moment still stops everything in
    order instead of leaving services behind."""

    def __init__(self) -> None:
        self.received: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: self.received.append(signum))

    def wait(self) -> None:
        while not self.received:
            time.sleep(0.2)


def say(text: str) -> None:
    """Print, but never fail: the terminal or pipe may be gone while we shut down."""
    with contextlib.suppress(OSError, ValueError):
        print(text, flush=True)


def _usage(platform: Platform) -> str:
    token_note = (
        "YARD_TOKEN (as you set it)"
        if os.environ.get("YARD_TOKEN")
        else f"the admin token in {platform.data_dir / 'admin-token'} (the CLI finds it)"
    )
    return (
        f"\nTrainyard is up at {platform.url}\n"
        f"  web:   {platform.url}/ (the console: sign in with the token)\n"
        f"  auth:  Bearer {token_note}\n"
        f"  try:   .venv/bin/yard ls\n"
        f"         .venv/bin/yard submit examples/openpai-pi.json --wait\n"
        f"         .venv/bin/yard get <ID>    .venv/bin/yard logs <ID> --role worker --index 0\n"
        f"  kube:  {platform.kube_url} (the Kubernetes API: "
        ".venv/bin/yard kubeconfig -f kubeconfig; kubectl --kubeconfig kubeconfig get pytorchjobs)\n"
        f"  logs:  {platform.logs}/\n"
        "  metrics: /metrics on every service; with `make up`, `make metrics` runs "
        "Prometheus on them\n"
    )


def show_job(platform: Platform, job_id: str, stopper: Stopper, timeout: float = 300.0) -> str:
    """Print each change of the job and its tasks until it ends; return its state."""
    headers = {"Authorization": f"Bearer {platform.token}"}
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    state = "SUBMITTED"
    while time.monotonic() < deadline and not stopper.received:
        job = httpx.get(f"{platform.url}/v1/jobs/{job_id}", headers=headers, timeout=10)
        if job.status_code == 200:
            view = job.json()
            state = view["state"]
            lines = {
                "job": f"job {view['name']}: {state}"
                + (f" ({view['reason']})" if view.get("reason") else "")
            }
            for task in view["tasks"]:
                key = f"{task['role']}-{task['index']}"
                exit_note = (
                    f" exit {task['exit_code']}" if task.get("exit_code") is not None else ""
                )
                lines[key] = f"  task {key} on {task.get('node')}: {task['state']}{exit_note}"
            for key, line in lines.items():
                if seen.get(key) != line:
                    say(line)
                    seen[key] = line
            if state in TERMINAL:
                return state
        time.sleep(0.3)
    return state


def cmd_run(args: argparse.Namespace) -> int:
    stopper = Stopper()
    platform = Platform(_config(args))
    state = "not started"
    try:
        say(f"starting NATS, the store and the services (data in {platform.data_dir}) ...")
        platform.start()
        example = json.loads((repo_root() / "examples" / "openpai-pi.json").read_text())
        # OpenPAI job names are unique per user: suffix it, as the seed's own examples do.
        example["jobName"] = f"{example['jobName']}_{secrets.token_hex(4)}"
        answer = httpx.post(
            f"{platform.url}/v1/jobs",
            json=example,
            headers={"Authorization": f"Bearer {platform.token}"},
            timeout=30,
        )
        answer.raise_for_status()
        job_id = answer.json()["id"]
        say(f"submitted the example job {example['jobName']} as {job_id}")
        state = show_job(platform, job_id, stopper)
        for index in range(2):
            logs = httpx.get(
                f"{platform.url}/v1/jobs/{job_id}/logs",
                params={"role": "worker", "index": index},
                headers={"Authorization": f"Bearer {platform.token}"},
                timeout=10,
            )
            if logs.status_code == 200 and logs.text.strip():
                say(f"  worker-{index} says: {logs.text.strip()}")
        say(_usage(platform))
        say("Press Ctrl-C to stop everything.")
        stopper.wait()
        return 0 if state == "SUCCEEDED" else 1
    except ComponentError as exc:
        say(f"failed to start: {exc}")
        return 1
    finally:
        say("stopping ...")
        platform.stop()
        say("stopped.")


def cmd_serve(args: argparse.Namespace) -> int:
    stopper = Stopper()
    platform = Platform(_config(args)).start()
    try:
        say(_usage(platform))
        stopper.wait()
    finally:
        # `down` has stopped the tasks (or chose to keep them): leave them as they are.
        platform.stop(keep_tasks=True)
    return 0


def _state_file(data_dir: Path) -> Path:
    return data_dir / "run" / "platform.json"


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    if _state_file(data_dir).exists():
        print(f"already up ({_state_file(data_dir)}); `make down` first", file=sys.stderr)
        return 1
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "logs" / "supervisor.log", "ab")  # noqa: SIM115
    command = [
        sys.executable,
        "-m",
        "trainyard_stack.cli",
        "serve",
        "--data-dir",
        str(data_dir),
        "--log-level",
        args.log_level,
    ]
    if args.cluster:
        command += ["--cluster", str(Path(args.cluster).resolve())]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"the platform failed to start; see {data_dir / 'logs'}", file=sys.stderr)
            return 1
        if _state_file(data_dir).exists():
            url = json.loads(_state_file(data_dir).read_text())["url"]
            try:
                if httpx.get(f"{url}/healthz/all", timeout=2).status_code == 200:
                    print(
                        f"Trainyard is up at {url} (supervisor pid {proc.pid}); `make down` stops it"
                    )
                    return 0
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    print("the platform did not become healthy in time", file=sys.stderr)
    proc.terminate()
    return 1


def cmd_down(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    state = _state_file(data_dir)
    if not state.exists():
        print("not running")
        return 0
    running = json.loads(state.read_text())
    pid = running["supervisor_pid"]
    if args.keep_tasks:
        print("leaving the jobs' tasks running: the next start adopts them")
    else:
        jobs, left = stop_tasks(running["url"], ensure_admin_token(data_dir))
        if left == 0:
            print(f"stopped the tasks of {jobs} job(s); they run again at the next start")
        else:
            print("could not confirm that every task stopped (the platform did not answer)")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        state.unlink(missing_ok=True)
        print("not running (stale state removed)")
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("stopped")
            return 0
        time.sleep(0.2)
    print(f"supervisor {pid} did not stop in time", file=sys.stderr)
    return 1


# The test cluster's nodes when no cluster file names them: one with GPUs, one without.
DEFAULT_KUBE_NODES = [
    NodeSpec(name="kwok-gpu-0", cpu=16, memory_mb=65536, gpus=4, gpu_type="A100",
             port_range=(31000, 31999)),
    NodeSpec(name="kwok-cpu-0", cpu=16, memory_mb=65536, port_range=(32000, 32999)),
]  # fmt: skip


def _kube_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir).resolve() / "kube"


def cmd_kube_up(args: argparse.Namespace) -> int:
    directory = _kube_dir(args)
    if (directory / "cluster.json").exists():
        print(f"already up ({directory / 'cluster.json'}); `make kube-down` first", file=sys.stderr)
        return 1
    cluster_file = args.cluster or os.environ.get("YARD_CLUSTER")
    nodes = load_cluster(cluster_file).nodes if cluster_file else DEFAULT_KUBE_NODES
    try:
        cluster = KubeCluster(directory, nodes=list(nodes)).start()
    except ComponentError as exc:
        print(f"the cluster failed to start: {exc}", file=sys.stderr)
        return 1
    print(
        f"Kubernetes {cluster.url} with {len(nodes)} KWOK node(s) is up\n"
        f"  kubeconfig: {cluster.kubeconfig}\n"
        f"  try:        .cache/bin/trainyard-kube kubectl --kubeconfig {cluster.kubeconfig} get nodes\n"
        f"  Trainyard on it: YARD_LAUNCHER=kubernetes make up"
    )
    return 0


def cmd_kube_down(args: argparse.Namespace) -> int:
    state = _kube_dir(args) / "cluster.json"
    if not state.exists():
        print("not running")
        return 0
    pids = list(json.loads(state.read_text())["pids"].values())
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    state.unlink(missing_ok=True)
    print("stopped")
    return 0


def cmd_migrate_store(args: argparse.Namespace) -> int:
    """Copy the platform's data from a MongoDB-wire store into the embedded SQLite store:
    ``--from URL``, else the embedded FerretDB of earlier versions under <data>/ferretdb
    (started here for the copy)."""
    data_dir = Path(args.data_dir).resolve()
    if (data_dir / "run" / "platform.json").exists():
        print("the platform is running: stop it first (make down)", file=sys.stderr)
        return 1
    server: FerretDB | None = None
    url = args.source
    if not url:
        if not (data_dir / "ferretdb").exists():
            print(f"no FerretDB store under {data_dir} and no --from URL", file=sys.stderr)
            return 1
        ensure_ferretdb_binary()
        server = FerretDB(data_dir / "ferretdb").start()
        url = server.url

    async def copy() -> dict[str, tuple[int, int]]:
        source = mongo_client(url)
        target = SqliteClient(data_dir / "store")
        try:
            return await copy_databases(source, target, args.db_prefix)
        finally:
            await source.close()
            await target.close()

    try:
        report = asyncio.run(copy())
    finally:
        if server is not None:
            server.stop()
    for name, (read, written) in report.items():
        print(f"{name}: {read} documents, {written} copied now")
    print(f"done: {sum(w for _, w in report.values())} documents copied into {data_dir / 'store'}")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    """Prometheus for the platform `make up` started, until Ctrl-C."""
    data_dir = Path(args.data_dir).resolve()
    state = _state_file(data_dir)
    if not state.exists():
        print("the platform is not up: `make up` first", file=sys.stderr)
        return 1
    urls = json.loads(state.read_text()).get("urls")
    if not urls:
        print("the platform was started by an older version: `make down; make up`", file=sys.stderr)
        return 1
    stopper = Stopper()
    try:
        prometheus = Prometheus(data_dir / "prometheus", urls, port=args.port).start()
    except ComponentError as exc:
        print(exc, file=sys.stderr)
        return 1
    say(
        f"Prometheus at {prometheus.url} scrapes {len(urls)} processes every 15 s, with "
        "Trainyard's alert rules (docs/observability.md has the queries of the dashboard); "
        "Ctrl-C stops it"
    )
    try:
        stopper.wait()
    finally:
        prometheus.stop()
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=str(default_data_dir()))
    common.add_argument("--cluster", default=None, help="cluster YAML (default: this machine)")
    common.add_argument("--log-level", default=os.environ.get("YARD_LOG_LEVEL", "INFO"))
    common.add_argument("--timeout", type=float, default=120.0)
    parser = argparse.ArgumentParser(
        prog="trainyard-stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "serve", "up", "down", "kube-up", "kube-down", "migrate-store", "metrics"):
        command = sub.add_parser(name, parents=[common])
        if name == "metrics":
            command.add_argument("--port", type=int, default=9090)
        if name == "migrate-store":
            command.add_argument("--from", dest="source", default=None, help="a MongoDB URL")
            command.add_argument(
                "--db-prefix", default=os.environ.get("YARD_DB_PREFIX", "trainyard")
            )
        if name == "down":
            command.add_argument(
                "--keep-tasks",
                action="store_true",
                help="leave the jobs' tasks running for the next start to adopt",
            )
    args = parser.parse_args(argv)
    commands = {
        "run": cmd_run,
        "serve": cmd_serve,
        "up": cmd_up,
        "down": cmd_down,
        "kube-up": cmd_kube_up,
        "kube-down": cmd_kube_down,
        "migrate-store": cmd_migrate_store,
        "metrics": cmd_metrics,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
