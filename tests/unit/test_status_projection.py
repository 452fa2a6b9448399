"""What each event means for the read model (pure)."""

from trainyard_common.contracts import example_events
from trainyard_common.events import JobState, TaskState, TaskStateChanged
from trainyard_status.domain.projection import STATE_RANK, project, task_id

EVENTS = {type(e).__name__: e for e in example_events()}


def test_job_states_rank_forward_and_terminal_states_rank_last() -> None:
    order = [JobState.SUBMITTED, JobState.ACCEPTED, JobState.QUEUED, JobState.PLACED, JobState.RUNNING]
    assert [STATE_RANK[s] for s in order] == sorted(STATE_RANK[s] for s in order)
    assert all(STATE_RANK[s] > STATE_RANK[JobState.RUNNING] for s in JobState if s.terminal)


def test_submitted_sets_the_job_fields_and_keeps_the_original() -> None:
    change = project(EVENTS["JobSubmitted"]).job
    assert change.state is JobState.SUBMITTED
    assert change.always["name"] == "pi-estimate" and change.always["user"] == "alice"
    assert change.always["dialect"] == "native"


def test_rejected_is_terminal_with_every_error_in_the_reason() -> None:
    change = project(EVENTS["JobRejected"]).job
    assert change.state is JobState.REJECTED
    assert "$.taskRoles[0].memoryMB" in change.with_state["reason"]
    assert change.always["errors"][0]["path"] == "$.taskRoles[0].memoryMB"


def test_queued_may_repeat_at_the_same_rank() -> None:
    change = project(EVENTS["JobQueued"]).job
    assert change.state is JobState.QUEUED and change.same_rank_ok
    assert change.with_state["queue_reasons"] == ["needs 4 CPU, most free on any node is 2"]


def test_placed_creates_each_task_with_its_node_and_ports() -> None:
    changes = project(EVENTS["JobPlaced"])
    assert changes.job.state is JobState.PLACED
    assert [t.task_id for t in changes.tasks] == [
        task_id(EVENTS["JobPlaced"].job_id, 1, "worker", i) for i in (0, 1)]
    assert all(t.seq is None for t in changes.tasks)  # placement fields never race a transition
    assert changes.tasks[1].fields["ports"] == [{"label": "http", "ports": [20101]}]


def test_a_running_task_makes_the_job_running_other_transitions_do_not() -> None:
    base = EVENTS["TaskStateChanged"]
    running = base.model_copy(update={"state": TaskState.RUNNING, "seq": 2, "exit_code": None})
    assert project(running).job.state is JobState.RUNNING
    changes = project(base)
    assert changes.job is None and changes.tasks[0].seq == 3
    assert changes.tasks[0].fields["exit_code"] == 0


def test_finished_carries_reason_and_exit_code() -> None:
    change = project(EVENTS["JobFinished"]).job
    assert change.state is JobState.SUCCEEDED
    assert change.with_state["exit_code"] == 0 and change.with_state["reason"] == "all tasks ended"


def test_stop_command_is_recorded_without_moving_the_state() -> None:
    change = project(EVENTS["StopJob"]).job
    assert change.state is None and change.always == {"stop_requested_by": "alice"}
    assert isinstance(EVENTS["TaskStateChanged"], TaskStateChanged)
