"""Every service has the same shape (docs/architecture.md): ``__main__.py`` bootstraps
(logging and telemetry set up, then serve), ``app.py`` is the HTTP app and bootstraps
nothing, and a service that consumes events derives its subscription from its handler
table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"
NAMES = ["intake", "validation", "placement", "launcher", "status", "gateway"]


def package(name: str) -> Path:
    return SERVICES / name / "src" / f"trainyard_{name}"


def called(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return names


def defined(path: Path) -> set[str]:
    return {
        node.name
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


@pytest.mark.parametrize("name", NAMES)
def test_main_bootstraps_and_app_serves(name: str) -> None:
    main, app = package(name) / "__main__.py", package(name) / "app.py"
    assert {"setup_logging", "setup_telemetry", "serve"} <= called(main), name
    assert not {"main", "run"} & defined(app), f"{name}/app.py bootstraps"
    assert "serve" not in called(app), f"{name}/app.py serves"


@pytest.mark.parametrize("name", ["validation", "placement", "launcher"])
def test_consumers_subscribe_to_what_their_table_handles(name: str) -> None:
    handlers = package(name) / "handlers"
    source = handlers / "__init__.py" if handlers.is_dir() else handlers.with_suffix(".py")
    assert "SUBJECTS = subjects_for(EVENT_HANDLERS)" in source.read_text(), name
    assert "SUBJECTS" in (package(name) / "__main__.py").read_text(), name
