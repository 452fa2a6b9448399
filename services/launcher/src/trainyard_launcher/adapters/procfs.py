"""What Linux's /proc says about a process: its start time, state and session.

A pid alone does not name a process for long (pids are reused), so the launcher keeps
(pid, start time) and checks both. Standard library only: the task wrapper imports this.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Literal, NamedTuple


class ProcStat(NamedTuple):  # not a dataclass: importing dataclasses costs every task 5 ms
    pid: int
    state: str
    pgid: int
    session: int
    start_ticks: int
    cpu_ticks: int = 0  # user and system time
    rss_pages: int = 0
    ppid: int = 0


def proc_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return ProcStat(
        pid=pid,
        state=rest[0],
        pgid=int(rest[2]),
        session=int(rest[3]),
        start_ticks=int(rest[19]),
        cpu_ticks=int(rest[11]) + int(rest[12]),
        rss_pages=int(rest[21]),
        ppid=int(rest[1]),
    )


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat.start_ticks if stat else None


def is_alive(pid: int, started: int | None) -> bool:
    """True while the process that had ``pid`` at ``started`` still runs (a zombie has
    ended: it only waits for its parent to collect the exit status)."""
    stat = proc_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    return started is None or stat.start_ticks == started


def session_usage(session: int) -> tuple[int, int]:
    """CPU time (clock ticks) and resident memory (bytes) of a session's live processes."""
    members = session_members(session)
    page = os.sysconf("SC_PAGE_SIZE")
    return sum(m.cpu_ticks for m in members), sum(m.rss_pages for m in members) * page


def session_members(session: int) -> list[ProcStat]:
    """Every live process of a session. A session id stays unique while any member
    lives, so this cannot pick up strangers even after the leader is gone."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = proc_stat(int(name))
        if stat is not None and stat.session == session and stat.state not in ("Z", "X"):
            members.append(stat)
    return members


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (its children, theirs, and so on). A task's
    wrapper is its command's subreaper: a process that left the command's session
    (``setsid``) and lost its parent is still the wrapper's child."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode(errors="replace")
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2 :].split()
        if len(rest) > 1 and rest[0] not in ("Z", "X"):
            children.setdefault(int(rest[1]), []).append(int(name))
    found: list[int] = []
    below = list(children.get(pid, ()))
    while below:
        child = below.pop()
        found.append(child)
        below.extend(children.get(child, ()))
    return found


def tree(pid: int) -> list[int]:
    """``pid``'s descendants, as the kernel lists each process's children (no scan of
    every process; every thread's list, since a thread forks too). Where the kernel
    does not list them, ``descendants``."""
    found: list[int] = []
    below = [pid]
    while below:
        parent = below.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children", "rb") as f:
                    children = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if parent == pid and thread == str(pid):
                    return descendants(pid)  # no children lists on this kernel
                continue
            except OSError:
                continue
            found.extend(children)
            below.extend(children)
    return found


# Processes held (one pidfd each) at a time: a task of thousands of processes must not
# take every descriptor its signaller has left.
HOLD_AT_ONCE = 64


def signal_below(root: int, signum: int, started: int | None = None) -> list[int]:
    """Send ``signum`` to every process below ``root``; the pids that got it.

    Finding a process and signalling it are two steps: between them it could end, be
    collected, and its pid go to a stranger, whom a root launcher would then kill. So
    each pid found is first held (a pidfd names one process, never a later one with its
    number), then checked to be still below ``root`` (its parent is ``root`` or was
    found below it), and only then signalled through what holds it. Children go before
    their parents, a batch of ``HOLD_AT_ONCE`` at a time, each batch all checked before
    any of it is signalled: a process signalled never gives one still to be checked
    another parent (init, where ``root`` is no subreaper). ``root`` is held too and
    must be uncollected when each batch goes, and with ``started`` be the process that
    started then: the parents checked are then its processes, not those of a later
    holder of its number."""
    root_fd = _hold(root)
    if root_fd is False:
        return []
    try:
        if started is not None and not _is(root, lambda s: s.start_ticks == started):
            return []
        found = tree(root)
        parents = {root, *found}
        order = found[::-1]  # tree lists a parent before its children
        sent: list[int] = []
        for at in range(0, len(order), HOLD_AT_ONCE):
            if root_fd is not None and not _send(root, root_fd, 0):
                break  # root was collected: its number may be someone else's now
            sent += _signal_checked(order[at : at + HOLD_AT_ONCE], signum, parents)
        return sent
    finally:
        if root_fd is not None:
            os.close(root_fd)


def signal_held(pid: int, signum: int, still: Callable[[ProcStat], bool]) -> bool:
    """Send ``signum`` to the process with ``pid`` if, once held, it is ``still`` the one
    meant; whether it was sent. The check reads /proc by number: it reads the held
    process because that process was not yet collected when the signal went (a
    collected one refuses it), so it had the number all along. Where the kernel has no
    pidfds (before 5.3, or a sandbox refusing them), checked, then signalled by pid."""
    fd = _hold(pid)
    if fd is False:
        return False
    try:
        return _is(pid, still) and _send(pid, fd, signum)
    finally:
        if fd is not None:
            os.close(fd)


def _signal_checked(pids: list[int], signum: int, parents: set[int]) -> list[int]:
    held = [(pid, fd) for pid in pids if (fd := _hold(pid)) is not False]
    try:
        meant = [(pid, fd) for pid, fd in held if _is(pid, lambda s: s.ppid in parents)]
        return [pid for pid, fd in meant if _send(pid, fd, signum)]
    finally:
        for _, fd in held:
            if fd is not None:
                os.close(fd)


def _hold(pid: int) -> int | None | Literal[False]:
    """A pidfd of ``pid``; None where pidfds are refused; False when it is gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        return None


def _is(pid: int, still: Callable[[ProcStat], bool]) -> bool:
    stat = proc_stat(pid)
    return stat is not None and still(stat)


def _send(pid: int, fd: int | None, signum: int) -> bool:
    try:
        if fd is None:
            os.kill(pid, signum)
        else:
            signal.pidfd_send_signal(fd, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def pss_bytes(pid: int) -> int:
    """The process's proportional set size of anonymous and shared memory (its own
    pages, and its share of each page it shares; a file's pages, its libraries and
    mapped data, are the page cache's, as RLIMIT_DATA never counted them). All of its
    proportional set size where the kernel does not tell them apart; its resident size
    where it has no ``smaps_rollup``; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            fields = {}
            for line in f:
                name, _, rest = line.partition(b":")
                if name in (b"Pss", b"Pss_Anon", b"Pss_Shmem"):
                    fields[name] = int(rest.split()[0]) * 1024
    except FileNotFoundError:
        stat = proc_stat(pid)
        return stat.rss_pages * os.sysconf("SC_PAGE_SIZE") if stat is not None else 0
    except (OSError, ValueError, IndexError):
        return 0
    if b"Pss_Anon" in fields:
        return fields[b"Pss_Anon"] + fields.get(b"Pss_Shmem", 0)
    return fields.get(b"Pss", 0)
