"""The scheduler's other extension points, beside the node ``Scorer`` (scoring.py): the
order of the queue and the choice of preemption victims, each a typed plug-in chosen by
name in configuration, and the rules of a cycle that hold them.

| variable | values (default first) |
| --- | --- |
| ``YARD_PLACEMENT_QUEUE_ORDER`` | ``priority`` (higher first, FIFO within), ``fifo`` |
| ``YARD_PLACEMENT_PREEMPTION`` | ``least-work``, ``lowest-priority``, ``off`` |
| ``YARD_PLACEMENT_BACKFILL`` | ``conservative``, ``off`` |
| ``YARD_PLACEMENT_MAX_PREEMPTIONS`` | ``2``: preempted this often, a job is no longer preempted |
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from trainyard_common.limits import digits

if TYPE_CHECKING:
    from .queue import QueuedJob

T = TypeVar("T")


class UnknownSetting(ValueError):
    def __init__(self, variable: str, value: str, known: Iterable[str]) -> None:
        super().__init__(f"{variable}: unknown value {value!r}; known: {', '.join(sorted(known))}")


class QueueOrder(Protocol):
    """The order in which a cycle considers the queued jobs; the first job of each queue
    that cannot be placed is that queue's head."""

    @property
    def name(self) -> str: ...

    def order(self, jobs: Iterable[QueuedJob]) -> list[QueuedJob]: ...


@dataclass(frozen=True)
class PriorityFifo:
    """Higher priority first (DLC's 1-9, 9 highest), then by arrival."""

    name: str = "priority"

    def order(self, jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
        return sorted(jobs, key=lambda job: (-job.spec.priority, job.arrival_seq, job.job_id))


@dataclass(frozen=True)
class Fifo:
    """By arrival only: priority still decides who may preempt whom."""

    name: str = "fifo"

    def order(self, jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
        return sorted(jobs, key=lambda job: (job.arrival_seq, job.job_id))


@dataclass(frozen=True)
class Candidate:
    """A placed job that may be preempted for the job at a queue's head. ``work`` is
    what preempting it loses: its tasks times the time they have run (task-seconds, or
    placements since, on the state's logical clock). ``borrowed``: it runs beyond its
    queue's quota on capacity the head's queue is owed."""

    job_id: str
    queue: str
    priority: int
    tasks: int
    work: float
    placed_at: float
    borrowed: bool


class VictimChooser(Protocol):
    """Chooses the jobs to preempt. ``fits(victims)`` simulates the head's gang with
    those jobs gone; return a set for which it holds, or None."""

    @property
    def name(self) -> str: ...

    def choose(
        self, candidates: Sequence[Candidate], fits: Callable[[tuple[str, ...]], bool]
    ) -> tuple[str, ...] | None: ...


def greedy(
    ranked: Sequence[Candidate], fits: Callable[[tuple[str, ...]], bool]
) -> tuple[str, ...] | None:
    """Take the candidates in rank order until the head fits, then drop again every one
    it fits without (the latest taken, which lose the most, first): a small set, none of
    them needless."""
    chosen: list[Candidate] = []
    for candidate in ranked:
        chosen.append(candidate)
        if fits(tuple(c.job_id for c in chosen)):
            break
    else:
        return None
    for candidate in reversed(chosen[:-1]):
        rest = tuple(c.job_id for c in chosen if c is not candidate)
        if fits(rest):
            chosen.remove(candidate)
    return tuple(c.job_id for c in chosen)


@dataclass(frozen=True)
class LeastWork:
    """Borrowed capacity first, newest-borrowed first (it is owed back); then the
    jobs that lose the least work (fewest task-seconds: placed most recently, smallest)."""

    name: str = "least-work"

    def choose(
        self, candidates: Sequence[Candidate], fits: Callable[[tuple[str, ...]], bool]
    ) -> tuple[str, ...] | None:
        ranked = sorted(candidates, key=lambda c: (
            not c.borrowed, -c.placed_at if c.borrowed else c.work, c.job_id))  # fmt: skip
        return greedy(ranked, fits)


@dataclass(frozen=True)
class LowestPriority:
    """Borrowed capacity first, then the lowest priority, least work within it."""

    name: str = "lowest-priority"

    def choose(
        self, candidates: Sequence[Candidate], fits: Callable[[tuple[str, ...]], bool]
    ) -> tuple[str, ...] | None:
        ranked = sorted(candidates, key=lambda c: (
            not c.borrowed, c.priority, -c.placed_at if c.borrowed else c.work, c.job_id))  # fmt: skip
        return greedy(ranked, fits)


QUEUE_ORDERS: dict[str, Callable[[], QueueOrder]] = {"priority": PriorityFifo, "fifo": Fifo}
VICTIM_CHOOSERS: dict[str, Callable[[], VictimChooser]] = {
    "least-work": LeastWork,
    "lowest-priority": LowestPriority,
}
PREEMPTION_OFF = "off"
BACKFILL_MODES = ("conservative", "off")
DEFAULT_MAX_PREEMPTIONS = 2


@dataclass(frozen=True)
class Rules:
    """How a cycle orders, preempts and backfills. ``victims`` None: no preemption at
    all (neither by priority nor to reclaim a quota)."""

    order: QueueOrder = field(default_factory=PriorityFifo)
    victims: VictimChooser | None = field(default_factory=LeastWork)
    backfill: bool = True
    # A job preempted this many times without completing is not preempted again (it
    # could otherwise be preempted forever); reclaimed this often, it stops borrowing.
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Rules:
        """The rules the environment names; an unknown name raises UnknownSetting, so a
        misspelt setting stops the service at start instead of being ignored."""
        order = _named(env, "YARD_PLACEMENT_QUEUE_ORDER", "priority", QUEUE_ORDERS)()
        preemption = (env.get("YARD_PLACEMENT_PREEMPTION") or "least-work").strip().lower()
        if preemption == PREEMPTION_OFF:
            victims = None
        else:
            victims = _named(env, "YARD_PLACEMENT_PREEMPTION", "least-work", VICTIM_CHOOSERS)()
        backfill = (env.get("YARD_PLACEMENT_BACKFILL") or "conservative").strip().lower()
        if backfill not in BACKFILL_MODES:
            raise UnknownSetting("YARD_PLACEMENT_BACKFILL", backfill, BACKFILL_MODES)
        raw = (env.get("YARD_PLACEMENT_MAX_PREEMPTIONS") or str(DEFAULT_MAX_PREEMPTIONS)).strip()
        if not digits(raw):
            raise UnknownSetting("YARD_PLACEMENT_MAX_PREEMPTIONS", raw, ["a whole number"])
        return cls(order=order, victims=victims, backfill=backfill == "conservative",
                   max_preemptions=int(raw))  # fmt: skip


def _named(
    env: Mapping[str, str], variable: str, default: str, table: Mapping[str, Callable[[], T]]
) -> Callable[[], T]:
    value = (env.get(variable) or default).strip().lower()
    if value not in table:
        known = list(table) + ([PREEMPTION_OFF] if variable == "YARD_PLACEMENT_PREEMPTION" else [])
        raise UnknownSetting(variable, value, known)
    return table[value]
