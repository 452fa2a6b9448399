"""Tasks are someone else's code: on the local backend, run as root, each user's tasks
run under the user's own uid and reach nothing of the platform's nor of another user's
jobs. Each attack is a real job on the real platform; what it could read is in its log.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trainyard_stack.platform import Platform

from ..e2e.conftest import Api, start_platform

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="tasks run under their users' uids only when the launcher is root"
)

SECRET = "s3cr3t-of-alice-7f1d"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(tmp_path_factory.mktemp("isolation"))
    yield platform
    platform.stop()


@pytest.fixture(scope="module")
def admin(platform: Platform) -> Api:
    return Api(platform.url, platform.token)


def user_api(admin: Api, user: str) -> Api:
    answer = admin.http.post("/v1/tokens", json={"user": user})
    assert answer.status_code in (200, 201), answer.text
    return admin.as_token(answer.json()["token"])


def run(
    api: Api, name: str, command: str, secrets: dict[str, str] | None = None
) -> tuple[str, str]:
    """Run ``command`` as a one-task job; its stdout once it ended, and its id."""
    job = {
        "name": name,
        "roles": [{"name": "main", "command": command, "resources": {"cpu": 1, "memory_mb": 256}}],
        "secrets": [{"name": k, "value": v} for k, v in (secrets or {}).items()],
    }
    job_id = api.submit(job)
    view = api.wait(job_id, timeout=90)
    assert view["state"] in ("SUCCEEDED", "FAILED"), view
    return api.http.get(f"/v1/jobs/{job_id}/logs").text, job_id


def probe(path: str) -> str:
    """A shell line that prints whether ``path`` could be read (never its content)."""
    quoted = shlex.quote(path)
    return (
        f"if cat {quoted} >/dev/null 2>&1; then echo 'READ {path}'; else echo 'DENIED {path}'; fi"
    )


def test_a_task_runs_as_its_users_own_uid_never_root(admin: Api) -> None:
    alice, bob = user_api(admin, "alice-iso"), user_api(admin, "bob-iso")
    out_alice, _ = run(alice, "whoami-a", "id -u; id -G")
    out_bob, _ = run(bob, "whoami-b", "id -u; id -G")
    uid_alice, groups_alice = out_alice.split("\n")[:2]
    uid_bob, _ = out_bob.split("\n")[:2]
    assert int(uid_alice) >= 1000 and int(uid_bob) >= 1000
    assert uid_alice != uid_bob
    assert int(uid_alice) != os.geteuid()
    # No supplementary group of the services (nor root's) comes along.
    assert groups_alice.split() == [uid_alice]


def test_a_task_reads_nothing_of_the_platform(platform: Platform, admin: Api) -> None:
    mallory = user_api(admin, "mallory-iso")
    launcher = platform.procs["launcher"].pid
    data = platform.data_dir
    targets = [
        str(data / "admin-token"),
        f"/proc/{launcher}/environ",
        f"/proc/{os.getpid()}/environ",
        str(data / "logs" / "launcher.log"),
        str(data / "nats" / "jetstream"),
    ]
    command = "; ".join(probe(t) for t in targets)
    command += f"; ls {shlex.quote(str(data))} >/dev/null 2>&1 && echo LISTED || echo NOT-LISTED"
    command += f"; ls {shlex.quote(str(data / 'launcher' / 'jobs'))} >/dev/null 2>&1"
    command += " && echo JOBS-LISTED || echo JOBS-NOT-LISTED"
    # The services' settings are not in the task's environment either.
    command += "; env | grep -c -E '^(YARD_|NATS_URL|MONGO_URL)' || true"
    out, _ = run(mallory, "read-platform", command)
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("READ ")] == []
    assert len([line for line in lines if line.startswith("DENIED ")]) == len(targets)
    assert "NOT-LISTED" in lines and "JOBS-NOT-LISTED" in lines
    assert lines[-1] == "0"


def test_a_task_reads_nothing_of_another_users_job(platform: Platform, admin: Api) -> None:
    alice, eve = user_api(admin, "alice-iso2"), user_api(admin, "eve-iso2")
    # Alice's job keeps a secret in its command (substituted) and in a file of its own.
    keep = "echo <% $secrets.token %> > mine.txt; echo done"
    out, alice_job = run(alice, "alice-secret", keep, secrets={"token": SECRET})
    assert out.strip() == "done"
    task = platform.data_dir / "launcher" / "jobs" / alice_job / "attempt-1" / "main-0"
    assert (task / "work" / "mine.txt").read_text().strip() == SECRET  # it is there
    targets = [
        str(task / "command.sh"),
        str(task / "work" / "mine.txt"),
        str(task / "stdout.log"),
        str(task / "prepare.json"),
    ]
    command = "; ".join(probe(t) for t in targets)
    # Nowhere it can look: the data directory, any process's environment or arguments.
    data = shlex.quote(str(platform.data_dir))
    command += f"; grep -r -s -l {shlex.quote(SECRET)} {data} /proc/*/environ /proc/*/cmdline"
    command += " 2>/dev/null | head -5"
    out, _ = run(eve, "eve-snoops", command)
    assert SECRET not in out
    assert [line for line in out.splitlines() if line.startswith("READ ")] == []


def test_the_tasks_own_files_are_its_users(platform: Platform, admin: Api) -> None:
    carol = user_api(admin, "carol-iso")
    out, job_id = run(carol, "own-files", "echo hi > here.txt && cat here.txt && pwd")
    assert out.splitlines()[0] == "hi"
    work = Path(out.splitlines()[1])
    assert work.stat().st_uid != 0 and work.stat().st_mode & 0o777 == 0o700
    with pytest.raises(httpx.HTTPStatusError):
        # And another user cannot read its logs through the API either.
        user_api(admin, "dave-iso").http.get(f"/v1/jobs/{job_id}/logs").raise_for_status()


def test_an_exec_runs_nothing_of_the_tasks_view_as_root(platform: Platform, admin: Api) -> None:
    # A task's view is the user's to shape: a data source may be mounted over any path
    # in it, /usr/bin/setpriv and /usr/bin/timeout included. `yard exec` enters the
    # view as root: nothing found there may run before it is the task's user.
    erin = user_api(admin, "erin-iso")
    place = Path(tempfile.mkdtemp(prefix="yard-fake-"))
    try:
        os.chmod(place, 0o755)
        fake = place / "fake"
        fake.write_text('#!/bin/sh\necho "ran-as $(id -u)"\n')
        os.chmod(fake, 0o755)
        covered = {os.path.realpath(shutil.which(n) or f"/usr/bin/{n}") for n in NAMES}
        job_id = erin.submit({
            "name": "fake-tools",
            "roles": [{"name": "main", "command": "touch ready; sleep 600",
                       "resources": {"cpu": 1, "memory_mb": 256}}],
            "data_sources": [{"source": str(fake), "mount_path": p} for p in sorted(covered)],
        })  # fmt: skip
        command_running(platform, erin, job_id)
        answer = erin.http.post(
            f"/v1/jobs/{job_id}/tasks/main/0/exec",
            json={"command": ["id", "-u"]},
        )
        assert answer.status_code == 200, answer.text
        ran = answer.json()["stdout"]
        # The view's own timeout ran (the exec is in the view), as the task's user.
        assert ran.startswith("ran-as ") and int(ran.split()[1]) >= 1000, answer.json()
        erin.http.post(f"/v1/jobs/{job_id}/stop").raise_for_status()
    finally:
        shutil.rmtree(place)


def command_running(platform: Platform, api: Api, job_id: str) -> None:
    """Until the job's command runs and has touched ``ready`` in its working directory
    (RUNNING comes while its view may still be being built)."""
    api.wait(job_id, states={"RUNNING"}, timeout=90)
    work = platform.data_dir / "launcher" / "jobs" / job_id / "attempt-1" / "main-0" / "work"
    deadline = time.monotonic() + 30
    while not (work / "ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)


# The programs an exec runs on its way into the task (after nsenter, which is the host's).
NAMES = ("setpriv", "timeout")


def test_an_exec_enters_a_namespace_the_task_made_as_its_user(
    platform: Platform, admin: Api
) -> None:
    # A task that made its own user and mount namespace (unshare -Urm, its only process)
    # is root there: an exec joins that namespace as the task's user, never as root
    # (root of the machine, in a namespace the task controls, until nsenter dropped it).
    frank = user_api(admin, "frank-iso")
    job_id = frank.submit({
        "name": "own-namespace",
        "roles": [{"name": "main", "resources": {"cpu": 1, "memory_mb": 256},
                   "command": "exec unshare -Urm sh -c 'mount -t tmpfs none /mnt && "
                              "echo inside > /mnt/marker && touch ready && exec sleep 600'"}],
    })  # fmt: skip
    command_running(platform, frank, job_id)
    token = shlex.quote(str(platform.data_dir / "admin-token"))
    answer = frank.http.post(
        f"/v1/jobs/{job_id}/tasks/main/0/exec",
        json={
            "command": f"cat /mnt/marker; cat {token} >/dev/null 2>&1 && echo READ || echo denied"
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "inside\ndenied\n", answer.json()
    frank.http.post(f"/v1/jobs/{job_id}/stop").raise_for_status()


def test_root_runs_nothing_with_the_jobs_loader_variables(platform: Platform, admin: Api) -> None:
    # LD_PRELOAD=/tmp/mine.so in a job's env ran the library as root in every program
    # root started with the task's environment (the view's builder, setpriv and nsenter
    # for yard exec). The loader writes LD_DEBUG's trace to LD_DEBUG_OUTPUT.<pid> as the
    # process that obeys it: no such file may be root's, and the task's own are there.
    grace = user_api(admin, "grace-iso")
    traces = Path(tempfile.mkdtemp(prefix="yard-ld-"))
    try:
        os.chmod(traces, 0o1777)
        job_id = grace.submit({
            "name": "loader-vars",
            "roles": [{"name": "main", "command": "touch ready; sleep 600",
                       "resources": {"cpu": 1, "memory_mb": 256}}],
            "env": [{"name": "LD_DEBUG", "value": "files"},
                    {"name": "LD_DEBUG_OUTPUT", "value": str(traces / "trace")}],
            # A mount path outside the task's directory: root builds a view for it.
            "data_sources": [{"source": str(traces), "mount_path": "/opt/yard-ld-data"}],
        })  # fmt: skip
        command_running(platform, grace, job_id)
        answer = grace.http.post(f"/v1/jobs/{job_id}/tasks/main/0/exec", json={"command": "true"})
        assert answer.status_code == 200 and answer.json()["exit_code"] == 0, answer.text
        grace.http.post(f"/v1/jobs/{job_id}/stop").raise_for_status()
        owners = {path.name: path.stat().st_uid for path in traces.glob("trace.*")}
        assert owners and 0 not in owners.values(), owners
    finally:
        shutil.rmtree(traces)


def test_a_requirements_file_is_looked_for_as_the_user(platform: Platform, admin: Api) -> None:
    # Looked for as root, a requirements file in a directory the user may not enter
    # was "Permission denied" for pip, and one nowhere "no requirements file": the
    # answer told whether the file was there.
    heidi = user_api(admin, "heidi-iso")
    hidden = Path(tempfile.mkdtemp(prefix="yard-req-"))  # root's, 0700
    try:
        (hidden / "requirements.txt").write_text("nothing-to-install\n")
        reasons = []
        for place in (hidden, hidden.with_name(hidden.name + "-absent")):
            job_id = heidi.submit({
                "name": f"req-{place.name}",
                "roles": [{"name": "main", "command": "true",
                           "resources": {"cpu": 1, "memory_mb": 256}}],
                "pip_requirements_dir": str(place),
            })  # fmt: skip
            view = heidi.wait(job_id, timeout=90)
            reasons.append((view["state"], (view.get("reason") or "").replace(str(place), "P")))
        assert reasons[0] == reasons[1], reasons
        assert "no requirements file at P" in reasons[0][1], reasons
    finally:
        shutil.rmtree(hidden)
