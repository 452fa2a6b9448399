"""A task's mount paths are built by root in the task's own mount namespace; what is
mounted must be what the task's user could reach, at the moment it is mounted.

The preparation checks a data source's path as the user, then the view's builder (root)
mounts it: a user who turns that path into a symlink in between (a root-only file of
another user's task, the platform's own) must not get it mounted. The builder now opens
each source as the user and binds what it opened; these tests give it the state right
after such a swap and look at what the task sees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard_launcher.adapters.prepare import ENTER_ARGV, ENTER_FAILED_EXIT, FAILED_FILE
from trainyard_launcher.domain.prepare import Mount, PreparePlan

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the view is built by root for another uid"
)

USER = (200_777, 200_777)
SECRET = "only-root-may-read-this-4c1e"


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """A root-only directory holding a world-readable file (as a task's log sits in a
    directory its user alone may enter), and a directory of the user's own."""
    os.chmod(tmp_path, 0o755)
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "log").write_text(SECRET)
    os.chmod(hidden / "log", 0o644)
    own = tmp_path / "own"
    own.mkdir()
    (own / "data.txt").write_text("the user's own data\n")
    os.chmod(own / "data.txt", 0o644)
    os.chown(own, *USER)
    task = tmp_path / "task"
    (task / "work").mkdir(parents=True)
    os.chmod(task, 0o755)
    os.chown(task / "work", *USER)
    return {"hidden": hidden, "own": own, "task": task}


def enter(
    task: Path, source: Path, command: list[str], *more: Mount, tmpfs_mb: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The view's builder, as the task's wrapper runs it, with one data source at /data
    (and ``more``)."""
    plan = PreparePlan(
        task_dir=str(task),
        mounts=(Mount(view="/data/x", host=str(source), what="data_sources[0]"), *more),
        run_as=USER,
        tmpfs_mb=tmpfs_mb,
    )
    plan_file = task / "plan.json"
    plan_file.write_text(plan.to_json())
    return subprocess.run(
        [*ENTER_ARGV, str(plan_file), "--", *command],
        cwd=task / "work",
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_source_the_user_may_reach_is_mounted(places: dict[str, Path]) -> None:
    link = places["own"] / "link"
    link.symlink_to(places["own"] / "data.txt")
    os.lchown(link, *USER)
    done = enter(places["task"], link, ["cat", "/data/x"])
    assert (done.returncode, done.stdout) == (0, "the user's own data\n"), done.stderr


def test_a_source_swapped_for_a_link_to_a_root_only_place_is_not_mounted(
    places: dict[str, Path],
) -> None:
    # The preparation found the user's own file here; by the mount it is a link into a
    # directory only root may enter.
    link = places["own"] / "link"
    link.symlink_to(places["hidden"] / "log")
    os.lchown(link, *USER)
    done = enter(places["task"], link, ["cat", "/data/x"])
    assert SECRET not in done.stdout
    assert done.returncode == ENTER_FAILED_EXIT, (done.returncode, done.stdout, done.stderr)
    assert "Permission denied" in (places["task"] / FAILED_FILE).read_text()


def test_a_directory_shown_around_a_mount_path_is_listed_as_the_user(
    places: dict[str, Path],
) -> None:
    # A mount path inside a directory of the machine covers that directory with one that
    # shows its entries. Listed and opened as root, a directory the user may not enter
    # (or a link swapped in for one) would have shown root-only entries, each readable.
    hidden = places["hidden"]
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import os, sys\n"
            "from trainyard_launcher.adapters import prepare\n"
            "from trainyard_launcher.adapters.identity import demote\n"
            "target = sys.argv[1]\n"
            "prepare._own_namespace()\n"
            f"prepare._shadow(target, sys.argv[2], {USER!r})\n"
            f"demote({USER!r})\n"
            "try:\n"
            "    print(sorted(os.listdir(target)))\n"
            "except PermissionError:\n"
            "    print('not listed')\n"
            "print(os.path.exists(os.path.join(target, 'log')))\n",
            str(places["own"]),
            str(hidden),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # Not listable (it was not to the user), and nothing of it there.
    assert done.stdout == "not listed\nFalse\n"


def shadowed_as_the_user(target: Path, original: Path, *names: str) -> str:
    """``original`` shown at ``target`` (_shadow), then, as the task's user: the
    listing of ``target`` (or "not listed"), its mode, and whether each of ``names``
    is there and whether a mount path inside it may be reached."""
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import os, sys\n"
            "from trainyard_launcher.adapters import prepare\n"
            "from trainyard_launcher.adapters.identity import demote\n"
            "target, original, *names = sys.argv[1:]\n"
            "prepare._own_namespace()\n"
            f"prepare._shadow(target, original, {USER!r})\n"
            "os.mkdir(os.path.join(target, 'zz'))  # a mount path the view makes there\n"
            f"demote({USER!r})\n"
            "try:\n"
            "    print(sorted(os.listdir(target)))\n"
            "except PermissionError:\n"
            "    print('not listed')\n"
            "print(oct(os.stat(target).st_mode & 0o7777))\n"
            "print([os.path.exists(os.path.join(target, n)) for n in names])\n"
            "print(os.access(os.path.join(target, 'zz'), os.X_OK))\n",
            str(target),
            str(original),
            *names,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_traverse_only_directory_around_a_mount_path_stays_unlistable(
    places: dict[str, Path], tmp_path: Path
) -> None:
    # The launcher's jobs directory is 0711: every user passes through to their own
    # job, none may list the others' ids. A mount path inside it (<data>/launcher/jobs/zz)
    # covered it with a tmpfs listed as root and made 0755: every job id was shown.
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o711)
    os.chmod(jobs, 0o711)
    for job in ("job-of-alice", "job-of-bob"):
        (jobs / job).mkdir(mode=0o710)
    out = shadowed_as_the_user(places["own"], jobs, "job-of-alice", "job-of-bob")
    # Not listed, its mode kept, none of its entries there; the mount path reached.
    assert out == "not listed\n0o711\n[False, False]\nTrue\n", out
    # A directory the user may list is still shown, its entries as the user reaches them.
    listed = tmp_path / "listed"
    listed.mkdir(mode=0o755)
    os.chmod(listed, 0o755)
    (listed / "a").write_text("a")
    os.chmod(listed / "a", 0o644)
    out = shadowed_as_the_user(places["own"], listed, "a")
    assert out == "['a', 'zz']\n0o755\n[True]\nTrue\n", out
    # One the user may not even pass: passable now (the mount path must be reached, as
    # PAI-DLC's /root/data), still not listable, nothing of it shown.
    out = shadowed_as_the_user(places["own"], places["hidden"], "log")
    assert out == "not listed\n0o711\n[False]\nTrue\n", out


def test_a_mount_path_in_the_jobs_directory_shows_no_job_ids(
    places: dict[str, Path], tmp_path: Path
) -> None:
    # The audit's case, as the task's wrapper builds the view: a data source mounted at
    # <data>/launcher/jobs/zz listed every user's job ids.
    # The task's own directory is in there too, as the launcher's are: it stays (the
    # builder knows its name), the others' do not.
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o711)
    os.chmod(jobs, 0o711)
    (jobs / "job-of-bob").mkdir(mode=0o710)
    task = jobs / "job-of-alice" / "task"
    (task / "work").mkdir(parents=True)
    os.chmod(jobs / "job-of-alice", 0o711)
    os.chmod(task, 0o755)
    os.chown(task / "work", *USER)
    own = places["own"]
    done = enter(
        task,
        own / "data.txt",
        ["sh", "-c", f"cat {jobs}/zz; pwd; ls {jobs} 2>&1; ls -d {jobs}/job-of-bob 2>&1; true"],
        Mount(view=str(jobs / "zz"), host=str(own / "data.txt"), what="data_sources[1]"),
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith(f"the user's own data\n{task / 'work'}\n"), done.stdout
    assert "job-of-bob" not in done.stdout.replace(f"{jobs}/job-of-bob", ""), done.stdout
    assert "Permission denied" in done.stdout and "No such file" in done.stdout, done.stdout


def test_a_mount_inside_another_makes_nothing_in_its_source(places: dict[str, Path]) -> None:
    # /data/x is the user's directory, /data/x/sub/y one more source inside it. Root
    # made sub in the user's own directory on the machine, then followed it by name:
    # a user who swapped it for a link meanwhile had root create (or truncate) any file
    # anywhere. Now what is made is made in a tmpfs of the view's, and the user's
    # directory is shown around it.
    own = places["own"]
    done = enter(
        places["task"],
        own,
        ["sh", "-c", "cat /data/x/sub/y; ls /data/x"],
        Mount(view="/data/x/sub/y", host=str(own / "data.txt"), what="data_sources[1]"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the user's own data\ndata.txt\nsub\n"
    assert sorted(os.listdir(own)) == ["data.txt"]  # nothing made on the machine


def test_a_directory_shown_around_a_mount_path_stays_writable_to_its_owner(
    places: dict[str, Path],
) -> None:
    # Covered by a tmpfs (the user may change the directory), it keeps its owner: the
    # user still writes there (into the tmpfs, not the machine's directory).
    own = places["own"]
    done = enter(
        places["task"],
        own / "data.txt",
        ["sh", "-c", f"touch {own}/made && ls {own}"],
        Mount(view=str(own / "seen"), host=str(own / "data.txt"), what="data_sources[1]"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["data.txt", "made", "seen"]
    assert sorted(os.listdir(own)) == ["data.txt"]


def test_what_a_task_writes_to_a_covered_directory_is_bounded_by_its_memory(
    places: dict[str, Path],
) -> None:
    # The tmpfs covering a directory (a /tmp around a mount path) is memory no cgroup
    # may charge to the task: it holds at most the task's memory, not all the machine's.
    own = places["own"]
    fill = f"dd if=/dev/zero of={own}/big bs=1M count=3 2>&1; echo status=$?"
    mounted = Mount(view=str(own / "seen"), host=str(own / "data.txt"), what="data_sources[1]")
    unbounded = enter(places["task"], own / "data.txt", ["sh", "-c", fill], mounted)
    assert "status=0" in unbounded.stdout, unbounded.stdout + unbounded.stderr
    bounded = enter(places["task"], own / "data.txt", ["sh", "-c", fill], mounted, tmpfs_mb=1)
    assert "No space left on device" in bounded.stdout and "status=1" in bounded.stdout, (
        bounded.stdout + bounded.stderr
    )
    assert sorted(os.listdir(own)) == ["data.txt"]  # in the tmpfs, never the machine's
    # Files are counted too: empty ones are memory the size does not count.
    files = f"i=0; while [ $i -lt 5000 ]; do touch {own}/f$i 2>/dev/null || break; i=$((i+1)); done; echo made=$i"
    made = enter(places["task"], own / "data.txt", ["sh", "-c", files], mounted, tmpfs_mb=1)
    assert "made=" in made.stdout, (made.returncode, made.stdout, made.stderr)
    count = int(made.stdout.split("made=")[1])
    assert 900 < count < 1024, made.stdout + made.stderr
    # What the covered directory shows is not taken from that: each entry takes a file
    # of the tmpfs, and a directory of 1,500 entries is still covered and shown.
    for i in range(1500):
        (own / f"entry-{i}").touch()
    shown = enter(
        places["task"], own / "data.txt", ["sh", "-c", f"ls {own} | wc -l"], mounted, tmpfs_mb=1
    )
    assert shown.returncode == 0 and int(shown.stdout) == 1502, shown.stdout + shown.stderr


def test_a_mount_links_directory_swapped_for_another_keeps_that_ones_links(
    tmp_path: Path,
) -> None:
    # Without a mount namespace a mount path in the task's directory is a symlink the
    # wrapper removes when the command ends. The command may have swapped the directory
    # above it for a link elsewhere (work/x -> /lib64): root removed the link it found
    # there if it pointed where the mount's did (/lib64/ld-linux-x86-64.so.2).
    from trainyard_launcher.adapters.prepare import remove_links

    os.chmod(tmp_path, 0o755)
    target = "/usr/lib/some-library.so"
    victim = tmp_path / "victim"  # root's, as /lib64 is
    victim.mkdir(mode=0o755)
    (victim / "lib.so").symlink_to(target)
    work = tmp_path / "task" / "work"
    work.mkdir(parents=True)
    os.chown(work, *USER)
    ours = work / "ours"
    ours.mkdir()
    (ours / "lib.so").symlink_to(target)
    os.lchown(ours / "lib.so", *USER)
    os.chown(ours, *USER)
    (work / "x").symlink_to(victim)  # the swap: what was the mount's directory
    os.lchown(work / "x", *USER)

    remove_links([(str(work / "x" / "lib.so"), target), (str(ours / "lib.so"), target)], USER)

    assert os.readlink(victim / "lib.so") == target  # not the task's to remove
    assert not os.path.lexists(ours / "lib.so")  # the task's own link is still removed
