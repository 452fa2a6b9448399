"""Commands: a stop, and placement's interrupts (pause, restart, preemption, scale, node
removed)."""

from __future__ import annotations

import dataclasses
import logging

from trainyard_common.bus import Delivery
from trainyard_common.errors import TransientError
from trainyard_common.events import (
    InterruptJob,
    JobState,
    StopJob,
)

from ..adapters.store import (
    JOB_FINISHED,
    JOB_STOP_EARLY,
)
from ..domain.completion import Verdict
from .common import Deps
from .ending import finish_job, finish_with

log = logging.getLogger("trainyard.launcher")


# --- stopping -------------------------------------------------------------------------


async def stop_job(command: StopJob, delivery: Delivery, deps: Deps) -> None:
    async with deps.lock(command.job_id):
        job = await deps.store.get_job(command.job_id)
        if job is None:
            # Not placed here yet: leave a tombstone for the JobPlaced that may follow.
            if await deps.store.insert_tombstone(command.job_id, command.reason):
                return
            job = await deps.store.get_job(command.job_id)
            assert job is not None
        if job.state == JOB_STOP_EARLY:
            return
        if job.state == JOB_FINISHED:
            if not job.finished_published:
                await finish_job(deps, job)
            if job.retry is not None or job.interrupt is not None:
                # Between attempts: placement stops a queued retry itself, but the next
                # attempt may already be placed; it must not start.
                await deps.store.note_stop(job.job_id, job.attempt, command.reason)
            return
        await finish_with(deps, job, Verdict(JobState.STOPPED, command.reason))


# --- interrupting ---------------------------------------------------------------------


async def interrupt_job(command: InterruptJob, delivery: Delivery, deps: Deps) -> None:
    """Placement takes this attempt's capacity back (a pause, a preemption, a scale): its
    tasks end as STOPPED with their directories kept, the attempt is finished as
    interrupted — not judged, so no retry is spent and no JobFinished follows — and
    JobInterrupted (stored first, so a restart publishes it again) answers."""
    async with deps.lock(command.job_id):
        job = await deps.store.get_job(command.job_id)
        if job is None or job.state == JOB_STOP_EARLY or job.attempt < command.attempt:
            # Placement announces an attempt before it interrupts it: the JobPlaced is
            # still on its way (or was put back for later); this waits for it.
            raise TransientError(
                f"attempt {command.attempt} of {command.job_id} is not known here yet"
            )
        if job.attempt > command.attempt:
            return  # an older attempt's interrupt
        if job.state == JOB_FINISHED:
            # Ended already (its own end, a stop, or this interrupt delivered again).
            if not job.finished_published:
                await finish_job(deps, job)
            return
        verdict = Verdict(JobState.STOPPED, command.reason)
        if await deps.store.set_interrupted(job.job_id, job.attempt, verdict, command.cause.value):
            job = dataclasses.replace(
                job,
                state=JOB_FINISHED,
                verdict=verdict,
                retry=None,
                interrupt=(command.cause.value, command.reason),
                finished_published=False,
            )
        else:
            job = await deps.store.get_job(job.job_id) or job
        if job.state == JOB_FINISHED and not job.finished_published:
            await finish_job(deps, job)
