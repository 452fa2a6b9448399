"""The job's loader variables travel renamed through what root runs for a task and
come back, whole, to what runs as the task's user (adapters/identity.py)."""

from __future__ import annotations

import subprocess

from trainyard_launcher.adapters.identity import (
    LOADER_VARIABLES,
    for_root,
    restore_argv,
    restored,
)

TRICKY = "a b\"c$(id)\n`x` \\ end's"


def test_root_gets_no_loader_variable_and_the_user_gets_each_back() -> None:
    env = {"LD_PRELOAD": "/tmp/mine.so", "LD_LIBRARY_PATH": TRICKY, "TMPDIR": "", "PATH": "/bin"}
    rooted = for_root(env)
    assert not LOADER_VARIABLES & rooted.keys()
    assert rooted["PATH"] == "/bin" and rooted["TRAINYARD_KEPT_LD_PRELOAD"] == "/tmp/mine.so"
    assert for_root(rooted) == rooted  # the wrapper renames what the launcher renamed
    assert restored(rooted) == env


def test_the_shell_before_an_exec_gives_them_back_as_they_were() -> None:
    asked = {"LD_LIBRARY_PATH": TRICKY, "TMPDIR": "", "PATH": "/usr/bin:/bin", "X": "1",
             "n": "mine", "k": "mine too", "a-b": "not a shell's name"}  # fmt: skip
    env = for_root(asked)
    shown = subprocess.run(
        [*restore_argv(asked), "env", "-0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got = dict(line.split("=", 1) for line in shown.split("\0") if line)
    for own in ("PWD", "SHLVL", "_"):  # bash's own
        got.pop(own, None)
    assert got == asked
    assert restore_argv({"PATH": "/bin"}) == []  # nothing renamed: nothing run before
