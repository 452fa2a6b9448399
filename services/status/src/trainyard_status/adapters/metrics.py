"""The job metrics status exports at ``/metrics`` (docs/observability.md): counters fed
by the events it projects (domain/metrics.py says what each adds), and the number of
jobs in each state, counted in the store: the states a job is still in every
``STATE_EVERY_S``, the ended ones (every finished job ever: their count grows with
history, some 70 ms at a million jobs on SQLite, the event loop held meanwhile) at most
a thousandth of the time (``ENDED_SHARE``), so every ``STATE_EVERY_S`` too below some
140,000 jobs.

Counters live in the process: they start at 0 when it starts (Prometheus's ``rate`` and
``increase`` read a restart as one), and with status replicas each counts the events it
projected, so dashboards sum them. The jobs by state come from the store and are the
same on every replica: dashboards take their ``max``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram

from trainyard_common.events import JobState

from ..domain import metrics as m
from .views import JobViews

log = logging.getLogger("trainyard.status")

STATE_EVERY_S = 10.0
ENDED_SHARE = 0.001
LIVE_STATES = tuple(s for s in JobState if not s.terminal)

COUNTERS = {
    m.SUBMITTED: Counter(
        "trainyard_jobs_submitted_total", "Jobs submitted, by dialect.", ["dialect"]
    ),
    m.ACCEPTED: Counter(
        "trainyard_jobs_accepted_total", "Jobs validation accepted, by dialect.", ["dialect"]
    ),
    m.REJECTED: Counter(
        "trainyard_jobs_rejected_total", "Jobs validation rejected, by dialect.", ["dialect"]
    ),
    m.FINISHED: Counter(
        "trainyard_jobs_finished_total",
        "Jobs that ended, by dialect and outcome (succeeded, failed, stopped).",
        ["dialect", "outcome"],
    ),
    m.TASK_EXITS: Counter(
        "trainyard_task_exits_total",
        "Tasks that ended, by their end (succeeded, failed, stopped) and failure class "
        "(user, platform, unknown; none when it did not fail).",
        ["state", "failure_class"],
    ),
    m.RETRIES: Counter(
        "trainyard_job_retries_total",
        "Attempts started again after a failure, by the failure's class.",
        ["failure_class"],
    ),
    m.INTERRUPTIONS: Counter(
        "trainyard_job_interruptions_total",
        "Attempts ended without failing, by cause (preempted, paused, scaled, "
        "node_removed, restarted, shutdown).",
        ["cause"],
    ),
}
HISTOGRAMS = {
    m.FIRST_WAIT: Histogram(
        "trainyard_queue_wait_seconds",
        "Time from a job's submission to its first placement, by queue.",
        ["queue"],
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600),
    ),
}
JOBS = Gauge("trainyard_jobs", "Jobs in each state, counted in the store.", ["state"])


def observe(observations: list[m.Observation]) -> None:
    for o in observations:
        if o.metric in HISTOGRAMS:
            HISTOGRAMS[o.metric].labels(*o.labels).observe(o.value)
        else:
            COUNTERS[o.metric].labels(*o.labels).inc(o.value)


async def count_states(views: JobViews, states: Iterable[JobState] = JobState) -> None:
    states = tuple(states)
    counts = await views.count_states({}, states)
    for state in states:  # a state no job is in any more reads 0, not its last count
        JOBS.labels(state.value).set(counts.get(state.value, 0))


async def count_turn(
    views: JobViews, ended_due: float, clock: Callable[[], float] = time.monotonic
) -> float:
    """One turn's counts: every state once ``ended_due`` is past, else the live ones;
    when the ended states are due next."""
    began = clock()
    if began < ended_due:
        await count_states(views, LIVE_STATES)
        return ended_due
    await count_states(views)
    return began + (clock() - began) / ENDED_SHARE


async def keep_state_counts(views: JobViews, stop: asyncio.Event) -> None:
    """Recount the jobs in each state until ``stop``; a failed count is logged and
    tried again at the next turn (the gauge keeps its last value meanwhile)."""
    ended_due = 0.0
    while not stop.is_set():
        try:
            ended_due = await count_turn(views, ended_due)
        except Exception:  # noqa: BLE001 - a figure, not an effect: next turn retries
            log.exception("counting jobs by state")
        try:
            await asyncio.wait_for(stop.wait(), STATE_EVERY_S)
        except TimeoutError:
            pass
