"""What Linux's /proc says about a process: its start time, state and session.

A pid alone does not name a process for long (pids are reused), so the launcher keeps
(pid, start time) and checks both. Standard library only: the task wrapper imports this.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcStat(NamedTuple):  # not a dataclass: importing dataclasses costs every task 5 ms
    pid: int
    state: str
    pgid: int
    session: int
    start_ticks: int


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
