"""A node's task ports by default stay out of the range the kernel takes local ports
from for outgoing connections: a task port drawn there could be held by any
connection on the machine, and the task failed to start ("address already in use",
seen in a full test run)."""

from __future__ import annotations

from pathlib import Path

from trainyard_common.cluster import NodeSpec

LINUX_DEFAULT = (32768, 60999)


def kernel_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return LINUX_DEFAULT


def test_the_default_task_ports_are_below_the_ephemeral_range() -> None:
    low, high = NodeSpec(name="n", cpu=1, memory_mb=1).port_range
    assert 1024 <= low < high
    assert high < min(kernel_range()[0], LINUX_DEFAULT[0])
    assert high - low + 1 >= 10_000  # room for many tasks' ports on a node
