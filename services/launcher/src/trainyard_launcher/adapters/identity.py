"""Becoming a task's user: small and standard-library only, because the task wrapper
imports it on every task's start (``trainyard_launcher.taskwrap``), where each import
is paid once per task."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator, Mapping

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
    try:
        os.setgroups([])
        os.setegid(run_as[1])
        os.seteuid(run_as[0])
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


# What glibc's loader and libc take from the environment to load or read code and data
# of the caller's choosing (its list of variables it ignores for a setuid program, and
# GLIBC_TUNABLES): a job sets them for its own command, and a program root runs with
# the task's environment would obey them (LD_PRELOAD=/tmp/mine.so runs as root). Root
# runs nothing with them: they travel renamed (for_root) and are given back to what
# runs as the task's user (restored, or RESTORE_SH in a shell before the command).
LOADER_VARIABLES = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LD_AUDIT", "LD_DEBUG",
    "LD_DEBUG_OUTPUT", "LD_DYNAMIC_WEAK", "LD_HWCAP_MASK", "LD_LIBRARY_PATH",
    "LD_ORIGIN_PATH", "LD_PRELOAD", "LD_PROFILE", "LD_SHOW_AUXV", "LD_USE_LOAD_BIAS",
    "LOCALDOMAIN", "LOCPATH", "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_PERTURB_",
    "MALLOC_TOP_PAD_", "MALLOC_TRACE", "MALLOC_TRIM_THRESHOLD_", "NIS_PATH", "NLSPATH",
    "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZDIR",
})  # fmt: skip
KEPT = "TRAINYARD_KEPT_"


def for_root(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a program root runs on a task's behalf: the loader's variables
    renamed (``TRAINYARD_KEPT_<name>``), so neither the loader nor libc reads them.
    Renaming again changes nothing."""
    return {
        (KEPT + name if name in LOADER_VARIABLES else name): value for name, value in env.items()
    }


def restored(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as the task's user gets it back: what for_root renamed, under its name."""
    out = {name: value for name, value in env.items() if not name.startswith(KEPT)}
    for name, value in env.items():
        if name.startswith(KEPT) and name[len(KEPT) :] in LOADER_VARIABLES:
            out[name[len(KEPT) :]] = value
    return out


# ``restored`` in bash, for ``bash -c RESTORE_SH bash COMMAND...`` run as the task's
# user: each renamed variable exported under its own name (its value never parsed).
# bash, not sh: dash drops from the environment the names that are not a shell's (a-b,
# x.y), which a job may have. Its own two names are the platform's, and unset after.
RESTORE_SH = (
    f"for _ty_n in {' '.join(sorted(LOADER_VARIABLES))}; do "
    f'eval "_ty_k=\\${{{KEPT}$_ty_n+x}}"; '
    f'if [ -n "$_ty_k" ]; then eval "export $_ty_n=\\"\\${KEPT}$_ty_n\\""; '
    f"unset {KEPT}$_ty_n; fi; "
    'done; unset _ty_n _ty_k; exec "$@"'
)


def restore_argv(env: Mapping[str, str]) -> list[str]:
    """What to run before a command started by root with ``for_root(env)``, so that it
    gets ``env`` back: nothing when nothing was renamed."""
    if not any(name in LOADER_VARIABLES for name in env):
        return []
    return ["/bin/bash", "-c", RESTORE_SH, "bash"]
