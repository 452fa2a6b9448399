"""Kubernetes' rules for a container's command, for the backends that are not Kubernetes.

A container's ``command`` replaces its image's entrypoint and its ``args`` follow it;
``$(VAR)`` in either is replaced by the container's variable ``VAR``, a reference to a
variable it does not have stays as it was written, and ``$$`` is one literal ``$`` (so
``$$(VAR)`` stays ``$(VAR)``). This is the algorithm of Kubernetes'
``third_party/forked/golang/expansion`` (``Expand``), which the kubelet applies to
``command`` and ``args``; the Kubernetes backend leaves the expansion to the kubelet.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from trainyard_common.jobspec import RoleSpec


def expand(text: str, env: Mapping[str, str]) -> str:
    """``text`` with its ``$(VAR)`` references expanded as the kubelet expands them."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":
                out.append("$")  # an escaped operator
                advance = 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    out.append("$(")  # an incomplete reference stays as written
                    advance = 1
                else:
                    name = rest[1:close]
                    out.append(env[name] if name in env else f"$({name})")
                    advance = close + 1
            else:
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


def container_argv(role: RoleSpec, env: Mapping[str, str]) -> list[str]:
    """The argv the container runs, expanded; the image's entrypoint is not known here,
    so a container without a command of its own has only its args."""
    return [expand(word, env) for word in [*(role.entrypoint or []), *(role.args or [])]]


def container_command_line(role: RoleSpec, env: Mapping[str, str]) -> str:
    """The container's argv as one shell command line that runs exactly that argv."""
    return shlex.join(container_argv(role, env))
