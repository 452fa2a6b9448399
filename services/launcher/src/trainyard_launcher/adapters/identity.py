"""Becoming a task's user: small and standard-library only, because the task wrapper
imports it on every task's start (``trainyard_launcher.taskwrap``), where each import
is paid once per task."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

RunAs = tuple[int, int] | None
_PR_SET_NO_NEW_PRIVS = 38


def demote(run_as: RunAs) -> None:
    """Become the task's user for good (between fork and exec, or before exec): no
    supplementary groups, and no setuid program can raise it again."""
    if run_as is None:
        return
    uid, gid = run_as
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


@contextlib.contextmanager
def as_user(run_as: RunAs) -> Iterator[None]:
    """Act as the task's user for a while (file operations in what it controls: a path
    in a checkout it cloned may be a symlink anywhere), then be the wrapper again."""
    if run_as is None:
        yield
        return
    # Without the wrapper's supplementary groups (root's): a directory of group root
    # that its group may enter is not the task's user's to enter.
    groups = os.getgroups()
    os.setgroups([])
    os.setegid(run_as[1])
    os.seteuid(run_as[0])
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)
