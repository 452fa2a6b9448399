"""The task wrapper starts light (every task's start pays for what it imports) and reads
its arguments by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainyard_launcher.taskwrap import parse_args


def test_the_task_wrapper_starts_without_heavy_imports() -> None:
    """On two cores the wrapper's imports were most of a one-task job's cost (pydantic
    and the job model through ``demote``, asyncio through the logs; then dataclasses,
    inspect and tempfile through the limits, 18 ms of a task's ~60): a plain task's
    wrapper, with its limits and its user, loads none of them."""
    code = (
        "import sys, trainyard_launcher.taskwrap, trainyard_launcher.logs, "
        "trainyard_launcher.adapters.limits, trainyard_launcher.adapters.identity; "
        "print(sorted(m for m in ('pydantic', 'asyncio', 'trainyard_common.jobspec', "
        "'dataclasses', 'inspect', 'tempfile') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_wrapper_reads_its_arguments_and_refuses_others() -> None:
    args = parse_args(["--dir", "/t", "--options", "/o", "--", "bash", "-c", "x --dir y"])
    assert args == (Path("/t"), None, Path("/o"), ["bash", "-c", "x --dir y"])
    for bad in (["--dir", "/t"], ["--dir", "/t", "--"], ["--", "true"], ["--dir"],
                ["--dir", "/t", "--bogus", "x", "--", "true"],
                ["--dir", "/t", "--dir", "/u", "--", "true"]):  # fmt: skip
        with pytest.raises(SystemExit, match="usage: trainyard_launcher.taskwrap"):
            parse_args(bad)
