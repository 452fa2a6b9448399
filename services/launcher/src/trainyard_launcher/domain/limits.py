"""Which of a task's resources the local backend can hold it to, and how.

The launcher finds out once what the machine allows (``Mechanisms``: a cgroup v2
subtree it may write, a private mount namespace for ``/dev/shm``), and each task gets a
``LimitPlan`` from its role's resources, carried out by the task's wrapper before the
command starts:

- **cgroup v2** (a writable subtree with the controllers enabled): ``memory.max`` =
  ``memory_mb`` (and ``memory.swap.max`` 0), ``cpu.max`` from ``cpu``, ``pids.max``; the
  whole task (every process of it) is held to them, and an OOM kill is read from
  ``memory.events``;
- **otherwise rlimits**, set on the command's process: ``RLIMIT_DATA`` = ``memory_mb``
  (per process, not for the task as a whole; a program that allocates past it gets an
  allocation failure, e.g. Python's MemoryError), no CPU or process-count limit;
- always ``RLIMIT_NOFILE`` (at most ``NOFILE``) and ``RLIMIT_CORE`` 0 (a core dump of a
  training process would fill the disk);
- ``shm_mb``: a tmpfs of that size at ``/dev/shm`` in the task's own mount namespace,
  where one can be made (root; 0: an empty read-only one); otherwise the machine's
  shared ``/dev/shm``.

``summary`` says what is and is not enforced; it becomes the RUNNING reason of the task.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the task wrapper imports this module and must start fast
    from trainyard_common.jobspec import Resources

NOFILE = 65536
PIDS_MAX = 16384
CPU_PERIOD_US = 100_000
MIB = 1024 * 1024

CGROUP_CONTROLLERS = ("memory", "cpu", "pids")


# NamedTuples, not dataclasses: the task wrapper of every task with resources reads a
# LimitPlan, and importing dataclasses (inspect with it) cost it 12 ms of its ~60.
class Mechanisms(NamedTuple):
    """What this machine lets the launcher enforce (found at start)."""

    # A cgroup v2 directory whose children get the controllers in ``controllers``.
    cgroup: str | None = None
    controllers: frozenset[str] = frozenset()
    why_no_cgroup: str = "not looked for"
    # A private mount namespace with a tmpfs at /dev/shm can be made for a task.
    shm_namespace: bool = False
    why_no_shm: str = "not looked for"


class LimitPlan(NamedTuple):
    memory_mb: int | None = None  # cgroup memory.max, or RLIMIT_DATA
    memory_by: str = ""  # "cgroup" | "rlimit" | ""
    cpu_max: str | None = None  # cgroup cpu.max ("quota period")
    pids_max: int | None = None
    cgroup: str | None = None  # the cgroup directory made for the task
    nofile: int = NOFILE
    core: int = 0
    shm_mb: int | None = None  # a tmpfs at /dev/shm of this size (0: empty, read-only)
    summary: str = ""

    def to_json(self) -> str:
        return json.dumps(self._asdict())

    @classmethod
    def from_json(cls, text: str) -> LimitPlan:
        return cls(**json.loads(text))


def cgroup_name(job_id: str, attempt: int, role: str, index: int) -> str:
    # One directory per task; characters a path cannot hold are replaced.
    raw = f"yard-{job_id}-{attempt}-{role}-{index}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def cpu_max(cpu: float) -> str | None:
    if cpu <= 0:
        return None
    return f"{max(int(cpu * CPU_PERIOD_US), 1000)} {CPU_PERIOD_US}"


def plan_limits(resources: Resources, found: Mechanisms, cgroup_dir: str | None) -> LimitPlan:
    """How ``resources`` are enforced on this machine, with a summary a person reads."""
    said: list[str] = []
    cg = found.cgroup is not None and cgroup_dir is not None
    memory = resources.memory_mb if resources.memory_mb > 0 else None
    if "memory" in resources.uncapped:
        memory = None
        said.append(f"memory {resources.memory_mb} MiB reserved, not capped (uncapped)")
    memory_by = ""
    if memory is not None:
        if cg and "memory" in found.controllers:
            memory_by = "cgroup"
            said.append(f"memory {memory} MiB (cgroup v2 memory.max, the whole task)")
        else:
            memory_by = "rlimit"
            said.append(f"memory {memory} MiB (RLIMIT_DATA, per process)")
    cpu = cpu_max(resources.cpu) if cg and "cpu" in found.controllers else None
    if "cpu" in resources.uncapped:
        cpu = None
        said.append(f"cpu {resources.cpu:g} reserved, not capped (uncapped)")
    elif cpu is not None:
        said.append(f"cpu {resources.cpu:g} (cgroup v2 cpu.max)")
    else:
        said.append(f"cpu {resources.cpu:g} not enforced")
    pids = PIDS_MAX if cg and "pids" in found.controllers else None
    if pids is not None:
        said.append(f"pids {pids} (cgroup v2 pids.max)")
    # 0 is a /dev/shm of the task's own too (empty and read-only), never the machine's:
    # that one is memory no limit charges to the task, and its names are shared with
    # the services and every other user's tasks.
    shm = resources.shm_mb if found.shm_namespace else None
    if shm:
        said.append(f"shm {shm} MiB (tmpfs at /dev/shm)")
    elif shm is not None:
        said.append("shm 0 MiB (an empty read-only tmpfs at /dev/shm)")
    else:
        said.append(
            f"shm {resources.shm_mb} MiB not enforced: the machine's /dev/shm ({found.why_no_shm})"
        )
    said.append(f"open files {NOFILE}, no core dumps")
    if not cg:
        said.append(f"no cgroup: {found.why_no_cgroup}")
    return LimitPlan(
        memory_mb=memory,
        memory_by=memory_by,
        cpu_max=cpu,
        pids_max=pids,
        cgroup=cgroup_dir if cg else None,
        shm_mb=shm,
        summary="limits: " + "; ".join(said),
    )


# What programs print when an allocation fails (Python, C, C++, the shell, CUDA's host
# side); read only from a task whose memory was limited by an rlimit and that failed.
_OUT_OF_MEMORY = re.compile(
    r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory|memory exhausted"
    r"|failed to allocate|Killed process",
    re.IGNORECASE,
)


def memory_exhausted(stderr_tail: str) -> bool:
    return bool(_OUT_OF_MEMORY.search(stderr_tail))


def out_of_memory_note(plan: LimitPlan, held_bytes: int | None = None) -> str:
    """Why the task ended out of memory; ``held_bytes``: what its processes held
    together when the wrapper's sampling ended it (memory_over)."""
    if held_bytes is not None:
        how = (
            f"its processes held {held_bytes // MIB} MiB together, sampled each second; "
            "RLIMIT_DATA alone bounds each process, and not its shared memory"
        )
    elif plan.memory_by == "cgroup":
        how = "cgroup v2 memory.max, the OOM killer ended it"
    else:
        how = "RLIMIT_DATA per process, an allocation failed"
    return f"out of memory: the task's limit of {plan.memory_mb} MiB was reached ({how})"


def sampled_memory_limit(plan: LimitPlan, cgroup: str | None) -> int | None:
    """The bytes the task's processes may hold together (their proportional set size of
    anonymous and shared memory), checked by sampling where no cgroup holds the task's
    total (``cgroup``: the one the task was put in, None when none could be made):
    RLIMIT_DATA is per process, and shared mappings pass it. None where a cgroup holds
    it, or no limit."""
    if not plan.memory_mb or (cgroup is not None and plan.memory_by == "cgroup"):
        return None
    return plan.memory_mb * MIB
