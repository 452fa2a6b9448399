"""Signalling what /proc found (procfs.py): every process below one, however deep, and
never a process that is no longer where the walk found it, as when its pid went to a
stranger between the walk and the signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from trainyard_launcher.adapters import procfs
from trainyard_launcher.adapters.procfs import proc_stat, signal_below, signal_held, tree

# A shell that starts a chain of nested shells, each waiting on the next, the last on
# a sleep; the top one waits too, so the chain hangs below it.
CHAIN = 'sh -c \'sh -c "sh -c \\"sleep 60\\""\' & wait'


def _alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def _settled(root: int, count: int) -> list[int]:
    deadline = time.monotonic() + 10
    while len(found := tree(root)) < count:
        assert time.monotonic() < deadline, found
        time.sleep(0.02)
    return found


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _stopped(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while not all((stat := proc_stat(pid)) is not None and stat.state == "T" for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_every_process_below_is_signalled_and_the_root_spared() -> None:
    root = subprocess.Popen(["sh", "-c", CHAIN])
    try:
        below = _settled(root.pid, 4)
        # A stop first: a stopped process ends by nothing else, so each must have been
        # sent its own (a killed shell's parent may end by itself before its signal,
        # on a loaded machine: then it is not among those sent).
        assert sorted(signal_below(root.pid, signal.SIGSTOP)) == sorted(below)
        assert _stopped(below)
        assert proc_stat(root.pid).state != "T"  # type: ignore[union-attr]
        sent = signal_below(root.pid, signal.SIGKILL)
        assert sorted(sent) == sorted(below)  # stopped: none ended before its signal
        assert _gone(below)
        assert root.wait(10) != -signal.SIGKILL  # the root ends by itself, its wait over
    finally:
        root.kill()
        root.wait()


def test_a_pid_no_longer_below_is_not_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk reported a pid that, by the time of the signal, names a process
    elsewhere (here a sibling of the root, not below it): it is left alone."""
    root = subprocess.Popen(["sleep", "60"])
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        monkeypatch.setattr(procfs, "tree", lambda pid: [stranger.pid] if pid == root.pid else [])
        assert signal_below(root.pid, signal.SIGKILL) == []
        time.sleep(0.1)
        assert stranger.poll() is None
        assert root.poll() is None
    finally:
        for proc in (root, stranger):
            proc.kill()
            proc.wait()


def test_a_process_that_is_not_the_one_meant_or_gone_is_not_signalled() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = proc_stat(proc.pid)
        assert started is not None
        assert not signal_held(
            proc.pid, signal.SIGKILL, lambda s: s.start_ticks != started.start_ticks
        )
        time.sleep(0.1)
        assert proc.poll() is None
        assert signal_held(proc.pid, signal.SIGKILL, lambda s: s.start_ticks == started.start_ticks)
        assert proc.wait(10) == -signal.SIGKILL
        # Collected: nothing to hold (a reused pid would not have its start time).
        assert not signal_held(
            proc.pid, signal.SIGKILL, lambda s: s.start_ticks == started.start_ticks
        )
    finally:
        proc.kill()
        proc.wait()


# In a child interpreter with few descriptors: more processes below than it could hold
# pidfds for at once (the launcher's and the wrapper's soft limit is often 1024).
MANY = """
import resource, signal, subprocess, sys, time
from trainyard_launcher.adapters.procfs import signal_below, tree
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
root = subprocess.Popen(["sh", "-c", "for i in $(seq 300); do sleep 60 & done; wait"])
deadline = time.monotonic() + 30
while len(tree(root.pid)) < 300 and time.monotonic() < deadline:
    time.sleep(0.05)
found = len(tree(root.pid))
sent = signal_below(root.pid, signal.SIGKILL)
print(found, len(sent), root.wait(30))
"""


def test_more_processes_than_descriptors_are_all_signalled() -> None:
    """Each process is held by a descriptor; all at once, 300 processes under a limit
    of 128 raised EMFILE and none was signalled."""
    done = subprocess.run([sys.executable, "-c", MANY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found, sent, root_code = done.stdout.split()
    # The shell's wait ends when its children do: all 300 were killed.
    assert (found, sent, root_code) == ("300", "300", "0")


def test_a_root_that_is_not_the_one_that_started_then_has_nothing_signalled() -> None:
    root = subprocess.Popen(["sh", "-c", CHAIN])
    try:
        below = _settled(root.pid, 4)
        started = proc_stat(root.pid)
        assert started is not None
        assert signal_below(root.pid, signal.SIGKILL, started.start_ticks + 1) == []
        time.sleep(0.1)
        assert all(_alive(pid) for pid in below)
        stopped = signal_below(root.pid, signal.SIGSTOP, started.start_ticks)
        assert sorted(stopped) == sorted(below) and _stopped(below)
        assert sorted(signal_below(root.pid, signal.SIGKILL, started.start_ticks)) == sorted(below)
        assert _gone(below)
    finally:
        root.kill()
        root.wait()
