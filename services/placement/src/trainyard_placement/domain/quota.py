"""Queue quotas: what each queue uses, what it is guaranteed, and who borrows.

A queue's quota is a guarantee (docs/placement.md, "Queues and quota"): a job that keeps
its queue within the quota may always be placed, reclaiming capacity lent to other
queues if it must. Beyond the quota a job may only borrow idle capacity, and only when
its queue allows borrowing. Which jobs of a queue are the borrowers is derived, never
stored: the queue's jobs in the order they were placed, and every job from the first one
that takes the running sum past the quota on is borrowing. So when an older job ends, a
younger one stops being a borrower without any bookkeeping.

Usage is in integers (milli-CPU, MiB, milli-GPU), so sums compare exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainyard_common.cluster import QueueQuota
from trainyard_common.jobspec import JobSpec

from .gpu_share import MILLI, gpu_request


@dataclass(frozen=True, slots=True)
class Usage:
    cpu_milli: int = 0
    memory_mb: int = 0
    gpu_milli: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.cpu_milli + other.cpu_milli, self.memory_mb + other.memory_mb,
                     self.gpu_milli + other.gpu_milli)  # fmt: skip

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.cpu_milli - other.cpu_milli, self.memory_mb - other.memory_mb,
                     self.gpu_milli - other.gpu_milli)  # fmt: skip


def usage_of(spec: JobSpec) -> Usage:
    """Everything a job holds at its spec's replicas (a GPU share counts as its milli)."""
    cpu = memory = gpu = 0
    for role in spec.roles:
        count, milli = gpu_request(role.resources.gpu)
        cpu += role.replicas * round(role.resources.cpu * MILLI)
        memory += role.replicas * role.resources.memory_mb
        gpu += role.replicas * count * milli
    return Usage(cpu, memory, gpu)


def total(usages: Iterable[Usage]) -> Usage:
    result = Usage()
    for usage in usages:
        result = result + usage
    return result


def _limits(quota: QueueQuota) -> list[tuple[str, int | None, str]]:
    """(field of Usage, limit in its unit, name for people)."""
    return [
        ("gpu_milli", None if quota.gpus is None else round(quota.gpus * MILLI), "GPUs"),
        ("cpu_milli", None if quota.cpu is None else round(quota.cpu * MILLI), "CPU"),
        ("memory_mb", quota.memory_mb, "MB memory"),
    ]


def within(quota: QueueQuota, usage: Usage) -> bool:
    return all(limit is None or getattr(usage, attr) <= limit for attr, limit, _ in _limits(quota))


def unlimited(quota: QueueQuota) -> bool:
    return all(limit is None for _, limit, _ in _limits(quota))


def over_quota_text(
    queue: str, quota: QueueQuota, used: Usage, held: Usage, ask: Usage
) -> list[str]:
    """Why ``ask`` does not fit in the queue's quota, one line per resource it exceeds,
    e.g. "queue gpu-a uses 6 of its 8 GPUs quota; this job needs 4". ``held`` is what is
    kept for the job at the queue's head (not named: the text is memoised by the job's
    shape, whoever's it is, and may be another user's)."""
    lines = []
    for attr, limit, unit in _limits(quota):
        if limit is None:
            continue
        use, keep, need = getattr(used, attr), getattr(held, attr), getattr(ask, attr)
        if use + keep + need <= limit:
            continue
        scale = 1 if attr == "memory_mb" else MILLI
        text = f"queue {queue} uses {_num(use / scale)} of its {_num(limit / scale)} {unit} quota"
        if keep:
            text += f" ({_num(keep / scale)} more kept for the job at its head)"
        lines.append(f"{text}; this job needs {_num(need / scale)}")
    return lines


def borrowers(quota: QueueQuota, jobs: Iterable[tuple[str, Usage]]) -> list[str]:
    """The queue's jobs beyond its quota, given its jobs in the order they were placed:
    from the first one that takes the running sum past the quota on."""
    if unlimited(quota):
        return []
    running = Usage()
    found: list[str] = []
    for job_id, usage in jobs:
        running = running + usage
        if found or not within(quota, running):
            found.append(job_id)
    return found


def queue_usage(queue_of: Mapping[str, str], usage: Mapping[str, Usage]) -> dict[str, Usage]:
    """Usage summed per queue, from each job's queue and usage."""
    result: dict[str, Usage] = {}
    for job_id, queue in queue_of.items():
        result[queue] = result.get(queue, Usage()) + usage[job_id]
    return result


def _num(value: float) -> str:
    return f"{value:g}"
