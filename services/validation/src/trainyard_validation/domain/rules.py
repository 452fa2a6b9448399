"""Whether a submitted job is accepted: the dialect's rules, then the cluster's limits
(the queue exists, the GPU type exists, every task fits on some node)."""

from __future__ import annotations

from trainyard_common.cluster import ClusterSpec
from trainyard_common.dialects import BY_NAME, dedupe, field_path, validate_native
from trainyard_common.dialects.translation import masked_secrets, too_many_tasks
from trainyard_common.events import FieldIssue, JobAccepted, JobRejected, JobSubmitted, derived_id
from trainyard_common.fit import Locate, check_against_cluster
from trainyard_common.jobspec import JobSpec
from trainyard_common.runtimes import runtime_errors, runtime_warnings

__all__ = ["check_against_cluster", "decide", "locator", "name_taken"]


def result_id(submitted: JobSubmitted) -> str:
    # Accepted or rejected, one submission has one answer: redelivery re-publishes it
    # under the same id and JetStream drops the copy.
    return derived_id(submitted.event_id, "validated")


def locator(submitted: JobSubmitted) -> Locate:
    """Paths in the payload as the user wrote it; a bare spec (a producer that sent no
    original) is located in its own JSON."""
    if submitted.original is None:
        payload = submitted.spec.model_dump(mode="json")
        return lambda role, field: field_path("native", payload, role, field)
    return lambda role, field: field_path(submitted.dialect, submitted.original, role, field)


def _with_defaults(spec: JobSpec) -> JobSpec:
    """What later services may rely on: every role names its image."""
    roles = [
        role if role.image else role.model_copy(update={"image": spec.image}) for role in spec.roles
    ]
    return spec.model_copy(update={"roles": roles})


def rule_errors(submitted: JobSubmitted) -> list[FieldIssue]:
    chosen = BY_NAME.get(submitted.dialect)
    if chosen is None or submitted.original is None:
        # A producer on the bus may send a bare spec: the canonical rules still hold.
        errors = validate_native(submitted.spec)
    else:
        errors = chosen.validate(submitted.original, submitted.spec)
        if not any(e.code == "too_many_tasks" for e in errors):
            # Every dialect's job, whatever its own rules (intake's checked() says the same).
            errors += too_many_tasks(submitted.spec, locator(submitted))
    # Every dialect's job too. Intake refuses it at the door (checked()); sealed (with
    # YARD_SECRETS_KEY) a value is never the mask here, in clear it is what was written.
    return errors + masked_secrets(submitted.spec, locator(submitted))


def _shadowed(path: str, broken: list[str]) -> bool:
    """A rule's finding about something that holds a field translation already found
    broken (and left out or replaced): ``$.roles`` "has no role" when ``$.roles[0].cpu``
    was the trouble. It would only mislead."""
    return path != "$" and any(b.startswith((f"{path}.", f"{path}[")) for b in broken)


# A submission that held no job at all (unreadable, too large for the bus): what the
# rules would say of its stand-in spec is about nothing the user wrote.
NO_JOB = ("unreadable", "too_large")


def decide(submitted: JobSubmitted, cluster: ClusterSpec) -> JobAccepted | JobRejected:
    """Accept or reject the submission. Total: a rule that raises (a bug, the same on
    every delivery) rejects the job saying so, as translation does; the job would
    otherwise stay submitted, its name held, until its message went to the dead letters
    with its user never told."""
    try:
        return _decide(submitted, cluster)
    except Exception as exc:  # noqa: BLE001 - see above
        issue = FieldIssue(
            path="$", message=f"the job could not be validated: {exc!r}", code="internal"
        )
        return JobRejected(event_id=result_id(submitted), job_id=submitted.job_id, errors=[issue])


def _decide(submitted: JobSubmitted, cluster: ClusterSpec) -> JobAccepted | JobRejected:
    broken = [e.path for e in submitted.translation_errors]
    if any(e.code in NO_JOB for e in submitted.translation_errors):
        rules: list[FieldIssue] = []
    else:
        rules = [e for e in rule_errors(submitted) if not _shadowed(e.path, broken)]
    errors = dedupe([*submitted.translation_errors, *rules])
    # Cluster checks only on a spec that broke no rule: a broken field was replaced by
    # a default in translation, and checking the default would only mislead.
    if not errors:
        locate = locator(submitted)
        errors = runtime_errors(submitted.spec, cluster, locate) or check_against_cluster(
            submitted.spec, cluster, locate
        )
    if errors:
        return JobRejected(event_id=result_id(submitted), job_id=submitted.job_id, errors=errors)
    warnings = list(submitted.warnings)
    chosen = BY_NAME.get(submitted.dialect)
    if chosen is not None and submitted.original is not None:
        warnings += chosen.warnings(submitted.original, submitted.spec)
    warnings += runtime_warnings(submitted.spec, cluster.runtime, locator(submitted))
    spec = _with_defaults(submitted.spec)
    # A queue named by an alias (a DLC quota id) is accepted into the queue itself.
    queue = cluster.resolve_queue(spec.queue) or spec.queue
    return JobAccepted(
        event_id=result_id(submitted),
        job_id=submitted.job_id,
        spec=spec.model_copy(update={"queue": queue}),
        warnings=dedupe(warnings),
    )


def name_taken(submitted: JobSubmitted) -> JobRejected:
    spec = submitted.spec
    return JobRejected(
        event_id=result_id(submitted),
        job_id=submitted.job_id,
        errors=[
            FieldIssue(
                path=locator(submitted)(None, "name"),
                code="name_taken",
                message=f"job name {spec.name!r} is already used by another job of "
                f"{spec.user or 'this user'}; job names are unique per user",
            )
        ],
    )
