"""Kubernetes' command rules on the backends that are not Kubernetes: $(VAR) expansion
as the kubelet does it, and argv to a command line that runs exactly that argv."""

from __future__ import annotations

import shlex

import pytest

from trainyard_common.jobspec import RoleSpec
from trainyard_launcher.domain.containers import container_argv, container_command_line, expand

ENV = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456", "EMPTY": "", "X": "$(MASTER_ADDR)"}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(MASTER_ADDR):$(MASTER_PORT)", "10.0.0.1:23456"),
        ("--addr=$(MASTER_ADDR)", "--addr=10.0.0.1"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),  # not resolved: kept as written
        ("$$(MASTER_ADDR)", "$(MASTER_ADDR)"),  # escaped
        ("$$$(MASTER_ADDR)", "$10.0.0.1"),
        ("cost $5", "cost $5"),  # a $ that starts no reference
        ("$(MASTER_ADDR", "$(MASTER_ADDR"),  # incomplete
        ("trailing $", "trailing $"),
        ("$(EMPTY)x", "x"),
        ("$(X)", "$(MASTER_ADDR)"),  # values are not expanded again
        ("${MASTER_ADDR}", "${MASTER_ADDR}"),  # a shell's syntax is not Kubernetes'
        ("", ""),
    ],
)
def test_expansion_follows_the_kubelet(text: str, expanded: str) -> None:
    assert expand(text, ENV) == expanded


def test_command_and_args_become_one_argv_that_a_shell_runs_unchanged() -> None:
    role = RoleSpec(
        name="worker",
        command="ignored",
        entrypoint=["python", "-c"],
        args=["import sys; print(sys.argv)", "it's $(MASTER_ADDR)", "a b"],
    )
    argv = container_argv(role, ENV)
    assert argv == ["python", "-c", "import sys; print(sys.argv)", "it's 10.0.0.1", "a b"]
    assert shlex.split(container_command_line(role, ENV)) == argv


def test_a_role_with_args_only_relies_on_its_image_entrypoint() -> None:
    args_only = RoleSpec(name="w", command="x", args=["--epochs", "3"])
    bare = RoleSpec(name="w", command="x", args=[])
    with_command = RoleSpec(name="w", command="x", entrypoint=["train"])
    shell = RoleSpec(name="w", command="python train.py")
    assert args_only.uses_image_entrypoint and bare.uses_image_entrypoint
    assert not with_command.uses_image_entrypoint and not shell.uses_image_entrypoint
    assert not shell.container_form and with_command.container_form
