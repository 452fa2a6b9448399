"""The launcher's handlers against the in-memory store and a scripted backend: event
sequences, derived ids, idempotent redelivery, stop, tombstones and adoption."""

from __future__ import annotations

import json

import pytest

from trainyard_common.errors import TransientError
from trainyard_common.events import (
    Event,
    JobFinished,
    JobPlaced,
    JobState,
    PortAssignment,
    StopJob,
    TaskPlacement,
    TasksPlaced,
    TaskState,
    TaskStateChanged,
    derived_id,
)
from trainyard_common.jobspec import EnvVar, JobKind, JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import LaunchRefused
from trainyard_launcher.adapters.kubernetes import KubeSettings
from trainyard_launcher.adapters.store import JobRecord, MemoryLauncherStore, new_task, task_id
from trainyard_launcher.handlers import (
    LOST_WHILE_DOWN,
    LOST_WHILE_STARTING,
    STOPPED_BEFORE_START,
    Deps,
    adopt,
    check_tasks,
    launch_job,
    launch_more,
    stop_job,
)

from ..support.bus import RECEIVED
from ..support.launcher import make_deps


def placed(job_id: str = "j1", min_failed: int | None = 1) -> JobPlaced:
    spec = JobSpec(
        name="train",
        user="alice",
        roles=[
            RoleSpec(name="ps", replicas=1, command="run-ps"),
            RoleSpec(name="worker", replicas=2, command="run-worker", min_failed=min_failed),
        ],
    )
    tasks = [
        TaskPlacement(
            role="ps",
            index=0,
            node="n1",
            host_ip="127.0.0.1",
            ports=[PortAssignment(label="grpc", ports=[30001])],
        ),
        TaskPlacement(role="worker", index=0, node="n1", host_ip="127.0.0.1"),
        TaskPlacement(role="worker", index=1, node="n1", host_ip="127.0.0.1"),
    ]
    return JobPlaced(event_id=f"placed-{job_id}", job_id=job_id, spec=spec, tasks=tasks)


def task_events(published: list[Event]) -> list[tuple[str, int, TaskState, int]]:
    return [(e.role, e.index, e.state, e.seq) for e in published if isinstance(e, TaskStateChanged)]


def finished(published: list[Event]) -> list[JobFinished]:
    return [e for e in published if isinstance(e, JobFinished)]


async def test_a_launch_says_whether_its_command_carries_the_jobs_secrets() -> None:
    # The Kubernetes backend keeps such a line out of the pod: it once looked for the
    # secret's value in the final line, where mpirun's quoting had rewritten a quote.
    deps, backend, _ = make_deps()
    spec = JobSpec(
        name="mpi",
        user="alice",
        kind=JobKind.MPI,
        roles=[RoleSpec(name="worker", replicas=2, command="./run --token <% $secrets.t %>")],
        secrets=[EnvVar(name="t", value="it's-secret")],
    )
    tasks = [TaskPlacement(role="worker", index=i, node="n1", host_ip="127.0.0.1") for i in (0, 1)]
    await launch_job(JobPlaced(job_id="m1", spec=spec, tasks=tasks), RECEIVED, deps)
    by_index = {t.ref.index: t for t in backend.launched}
    assert "it's-secret" not in by_index[0].command and "mpirun" in by_index[0].command
    assert by_index[0].carries_secrets
    # Worker 1 runs sshd: no secret of the job in its line.
    assert not by_index[1].carries_secrets


async def test_a_command_its_secrets_would_swell_past_the_bound_fails_to_start() -> None:
    """A secret of 1 MiB named five times: refused at launch, before the line is built
    (a body's worth of references to a body's worth of secret is gigabytes a task)."""
    deps, backend, published = make_deps()
    spec = JobSpec(
        name="big",
        user="alice",
        roles=[RoleSpec(name="worker", replicas=1, command="echo <% $secrets.t %>" * 5)],
        secrets=[EnvVar(name="t", value="x" * 1024 * 1024)],
    )
    tasks = [TaskPlacement(role="worker", index=0, node="n1", host_ip="127.0.0.1")]
    await launch_job(JobPlaced(job_id="s1", spec=spec, tasks=tasks), RECEIVED, deps)
    assert backend.launched == []
    [done] = finished(published)
    assert done.state == JobState.FAILED
    assert "<% $secrets %> references substituted, comes to more than" in done.reason


async def test_launch_publishes_starting_then_running_with_derived_ids() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    assert sorted(task_events(published)) == sorted(
        [(r, i, TaskState.STARTING, 1) for r, i in [("ps", 0), ("worker", 0), ("worker", 1)]]
        + [(r, i, TaskState.RUNNING, 2) for r, i in [("ps", 0), ("worker", 0), ("worker", 1)]]
    )
    for event in published:
        assert isinstance(event, TaskStateChanged)
        assert event.event_id == derived_id("j1", 1, event.role, event.index, event.seq)
    assert [key for key, _, _ in backend.launches] == [
        "j1:1:ps:0",
        "j1:1:worker:0",
        "j1:1:worker:1",
    ]
    key, command, env = backend.launches[0]
    assert command == "run-ps"
    assert env["PAI_CONTAINER_HOST_grpc_PORT_LIST"] == "30001"
    assert env["PAI_USER_NAME"] == "alice"
    assert set(deps.watching) == {"j1:1:ps:0", "j1:1:worker:0", "j1:1:worker:1"}


async def test_redelivered_job_placed_launches_nothing_twice() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    ids = {e.event_id for e in published}
    await launch_job(placed(), RECEIVED, deps)
    assert len(backend.launches) == 3
    assert {e.event_id for e in published} == ids


async def test_all_tasks_succeed_then_one_job_finished() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    backend.exit("j1", "worker", 0, 0, at=1)
    await check_tasks(deps)
    assert finished(published) == []
    backend.exit("j1", "worker", 1, 0, at=2)
    backend.exit("j1", "ps", 0, 0, at=3)
    await check_tasks(deps)
    await check_tasks(deps)
    [done] = finished(published)
    assert done.state == JobState.SUCCEEDED
    assert done.event_id == derived_id("j1", 1, "finished")
    assert done.exit_code == 0
    ends = [(r, i, s, q) for r, i, s, q in task_events(published) if q == 3]
    assert sorted(ends) == [
        ("ps", 0, TaskState.SUCCEEDED, 3),
        ("worker", 0, TaskState.SUCCEEDED, 3),
        ("worker", 1, TaskState.SUCCEEDED, 3),
    ]
    assert deps.watching == {}


async def test_a_failure_ends_the_job_and_stops_the_others() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    backend.exit("j1", "worker", 1, 3)
    await check_tasks(deps)
    [done] = finished(published)
    assert (done.state, done.exit_code) == (JobState.FAILED, 3)
    assert "worker[1] failed: exited with code 3" in done.reason
    assert sorted(backend.killed) == ["j1:1:ps:0", "j1:1:worker:0"]
    stopped = {
        (e.role, e.index): e
        for e in published
        if isinstance(e, TaskStateChanged) and e.state == TaskState.STOPPED
    }
    assert set(stopped) == {("ps", 0), ("worker", 0)}
    assert stopped[("ps", 0)].reason.startswith("stopped because the job ended")
    # The job's end was published after every task's last transition.
    assert isinstance(published[-1], JobFinished)
    await check_tasks(deps)
    assert len(finished(published)) == 1


async def test_tolerated_failures_do_not_end_the_job() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(min_failed=None), RECEIVED, deps)
    backend.exit("j1", "worker", 0, 1)
    await check_tasks(deps)
    assert finished(published) == []
    assert "j1:1:worker:0" not in deps.watching


async def test_stop_job_stops_every_task_once() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    stop = StopJob(job_id="j1", requested_by="alice", reason="no longer needed")
    await stop_job(stop, RECEIVED, deps)
    [done] = finished(published)
    assert (done.state, done.reason) == (JobState.STOPPED, "no longer needed")
    assert len(backend.killed) == 3
    assert all(s == TaskState.STOPPED for _, _, s, q in task_events(published) if q == 3)
    count = len(published)
    await stop_job(stop, RECEIVED, deps)
    await check_tasks(deps)
    assert len(published) == count


async def test_stop_before_placement_leaves_a_tombstone() -> None:
    deps, backend, published = make_deps()
    await stop_job(StopJob(job_id="j1", requested_by="alice"), RECEIVED, deps)
    assert published == []
    await launch_job(placed(), RECEIVED, deps)
    assert backend.launches == []
    [done] = finished(published)
    assert (done.state, done.reason) == (JobState.STOPPED, STOPPED_BEFORE_START)
    assert done.event_id == derived_id("j1", 1, "finished")
    await launch_job(placed(), RECEIVED, deps)
    assert len(finished(published)) == 1


async def test_a_task_that_cannot_start_fails_the_job_without_launching_the_rest() -> None:
    deps, backend, published = make_deps()
    backend.busy_ports.add(30001)
    await launch_job(placed(), RECEIVED, deps)
    assert backend.launches == []
    [done] = finished(published)
    assert done.state == JobState.FAILED
    assert "could not start: port 30001 (grpc)" in done.reason
    states = {(r, i): s for r, i, s, q in task_events(published) if q == 2}
    assert states == {
        ("ps", 0): TaskState.FAILED,
        ("worker", 0): TaskState.STOPPED,
        ("worker", 1): TaskState.STOPPED,
    }


async def test_an_attempt_the_backend_refuses_to_open_fails_at_once() -> None:
    # A namespace that cannot be one: refused on every try, so the job fails now, not
    # after its message came back fifty times holding its capacity.
    deps, backend, published = make_deps()
    backend.refuse_attempt = "namespace: 'Bad_Name' is not a Kubernetes namespace name"
    await launch_job(placed(), RECEIVED, deps)
    assert backend.launches == [] and backend.opened == []
    [done] = finished(published)
    assert done.state == JobState.FAILED
    assert "could not start: namespace: 'Bad_Name'" in done.reason


def test_a_namespace_that_cannot_be_one_is_refused_and_never_used() -> None:
    settings = KubeSettings(namespace="yard", allowed_namespaces=frozenset({"*"}))
    for bad in ("Bad_Name", "a" * 64, "x/../y", "-x"):
        with pytest.raises(LaunchRefused, match="not a Kubernetes namespace name"):
            settings.check_namespace(bad)
        assert settings.namespace_for(bad) == "yard"
    settings.check_namespace("team-a")
    assert settings.namespace_for("team-a") == "team-a"


def test_a_namespace_kept_to_some_users_is_theirs_alone() -> None:
    # Any user could name any allowed namespace, and mount any claim there: a team's
    # namespace is now kept to its users, and their jobs run there by default.
    settings = KubeSettings.from_env({
        "YARD_K8S_NAMESPACE": "yard",
        "YARD_K8S_NAMESPACES": "*",
        "YARD_K8S_NAMESPACE_USERS": '{"team-a": ["alice", "bob"], "team-b": ["bob"]}',
    })  # fmt: skip
    settings.check_namespace("team-a", "alice")
    assert settings.namespace_for("team-a", "alice") == "team-a"
    with pytest.raises(LaunchRefused, match="namespace: 'team-a' is kept to other users"):
        settings.check_namespace("team-a", "carol")
    # Its claims are its users' to write; anywhere else, mounted read-only.
    assert settings.kept_to("team-a", "alice") and not settings.kept_to("team-a", "carol")
    assert not settings.kept_to("scratch", "alice") and not settings.kept_to("yard", "alice")
    # A listed user's job that names none (OpenPAI, PAI-DLC, TI) runs in their first.
    assert settings.namespace_for(None, "bob") == "team-a"
    assert settings.namespace_for("team-b", "bob") == "team-b"
    assert settings.namespace_for(None, "carol") == "yard"
    # Others' namespaces stay as the allowed list says.
    settings.check_namespace("scratch", "carol")
    assert settings.namespace_for("scratch", "carol") == "scratch"
    # A default namespace kept to a team leaves other users no place to fall back to.
    kept_default = KubeSettings.from_env({
        "YARD_K8S_NAMESPACE": "team-a", "YARD_K8S_NAMESPACE_USERS": '{"team-a": ["alice"]}',
    })  # fmt: skip
    kept_default.check_namespace(None, "alice")
    with pytest.raises(LaunchRefused, match="default namespace 'team-a' is kept"):
        kept_default.check_namespace(None, "carol")
    with pytest.raises(LaunchRefused, match="default namespace"):
        kept_default.check_namespace("elsewhere", "carol")  # not allowed: falls back
    # Unkept, the default namespace is everyone's, whatever the allowed list says.
    plain = KubeSettings(namespace="trainyard")
    plain.check_namespace(None, "alice")
    plain.check_namespace("elsewhere", "alice")
    assert plain.namespace_for("elsewhere", "alice") == "trainyard"
    others = KubeSettings.from_env({"YARD_K8S_NAMESPACE_USERS": '{"team-a": ["alice"]}'})
    others.check_namespace(None, "carol")
    assert others.namespace_for(None, "carol") == "trainyard"


def test_a_users_first_kept_namespace_is_the_first_listed_in_either_form() -> None:
    listed = KubeSettings.from_env({"YARD_K8S_NAMESPACE_USERS": json.dumps([
        {"namespace": "zeta", "users": ["alice"]}, {"namespace": "alpha", "users": ["alice"]},
    ])})  # fmt: skip
    assert listed.home("alice") == "zeta"
    mapped = KubeSettings.from_env(
        {"YARD_K8S_NAMESPACE_USERS": '{"zeta": ["alice"], "alpha": ["alice"]}'}
    )
    assert mapped.home("alice") == "zeta"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("team-a", "not JSON"),
        ('{"team-a": ["a"], "team-a": ["b"]}', "'team-a' is listed twice"),
        ('["team-a"]', "a JSON object"),
        ('[{"namespace": "team-a"}]', "a JSON object"),
        (
            '[{"namespace": "team-a", "users": ["a"]}, {"namespace": "team-a", "users": ["b"]}]',
            "'team-a' is listed twice",
        ),
        ('{"Team_A": ["alice"]}', "not a Kubernetes namespace name"),
        ('{"team-a": "alice"}', "a list of user names"),
        ('{"team-a": [""]}', "a list of user names"),
    ],
)
def test_a_namespace_users_setting_that_cannot_be_honoured_stops_the_launcher(
    text: str, says: str
) -> None:
    with pytest.raises(ValueError, match=f"YARD_K8S_NAMESPACE_USERS: .*{says}"):
        KubeSettings.from_env({"YARD_K8S_NAMESPACE_USERS": text})


async def test_adopt_records_ends_lost_tasks_and_keeps_running_ones() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(min_failed=None), RECEIVED, deps)
    published.clear()
    # A new launcher process: nothing watched, the store and the processes remain.
    restarted = Deps(deps.store, backend, deps.publish, kill_grace_s=0.1)
    backend.exit("j1", "worker", 0, 0)
    del backend.status["j1:1:worker:1"]  # gone without an exit record
    await adopt(restarted)
    ends = {(r, i): (s, q) for r, i, s, q in task_events(published)}
    assert ends == {("worker", 0): (TaskState.SUCCEEDED, 3), ("worker", 1): (TaskState.FAILED, 3)}
    lost = [e for e in published if isinstance(e, TaskStateChanged) and e.index == 1]
    assert lost[0].reason == LOST_WHILE_DOWN
    assert set(restarted.watching) == {"j1:1:ps:0"}
    assert len(backend.launches) == 3
    backend.exit("j1", "ps", 0, 0)
    await check_tasks(restarted)
    [done] = finished(published)
    assert done.state == JobState.SUCCEEDED


class FlakyStore(MemoryLauncherStore):
    """The in-memory store whose job reads fail while ``down`` (a store restart)."""

    down = False

    async def get_job(self, job_id: str) -> JobRecord | None:
        if self.down:
            raise ConnectionError("store restarting")
        return await super().get_job(job_id)


async def test_a_job_whose_last_task_ended_as_the_store_failed_still_finishes() -> None:
    deps, backend, published = make_deps()
    store = FlakyStore()
    deps.store = store
    await launch_job(placed(), RECEIVED, deps)
    for role, index in (("ps", 0), ("worker", 0), ("worker", 1)):
        backend.exit("j1", role, index, 0)
    # The tasks' ends are stored, then the job's verdict cannot be: the store went away.
    store.down = True
    try:
        await check_tasks(deps)
    except ConnectionError:
        pass
    ended = {(r, i) for r, i, s, _ in task_events(published) if s == TaskState.SUCCEEDED}
    assert ended and finished(published) == []
    store.down = False
    # Ended tasks are no longer watched; the watcher's next rounds finish the job anyway.
    await check_tasks(deps)
    await check_tasks(deps)
    [done] = finished(published)
    assert done.state == JobState.SUCCEEDED
    assert deps.watching == {} and deps.unsettled == set()


async def test_adopt_finishes_a_running_job_whose_tasks_all_ended_before_the_crash() -> None:
    deps, backend, published = make_deps()
    await launch_job(placed(), RECEIVED, deps)
    for role, index in (("ps", 0), ("worker", 0), ("worker", 1)):
        task = await deps.store.get_task(task_id("j1", 1, role, index))
        assert task is not None
        # Every end stored, and the launcher killed before the job's verdict.
        await deps.store.transition(task, TaskState.SUCCEEDED, exit_code=0)
    published.clear()
    restarted = Deps(deps.store, backend, deps.publish, kill_grace_s=0.1)
    await adopt(restarted)
    [done] = finished(published)
    assert done.state == JobState.SUCCEEDED


async def test_adopt_fails_a_task_launched_before_that_never_showed_a_pid() -> None:
    deps, backend, published = make_deps()
    event = placed()
    await deps.store.insert_job(
        JobRecord(
            job_id="j1",
            attempt=1,
            state="running",
            spec=event.spec,
            tasks=event.tasks,
            user="alice",
        )
    )
    for p in event.tasks:
        await deps.store.insert_task(new_task("j1", 1, p.role, p.index, "/tasks", p.node))
    backend.marked.add("j1:1:ps:0")  # launched marker, but no pid ever
    await adopt(deps)
    ps = await deps.store.get_task(task_id("j1", 1, "ps", 0))
    assert ps is not None and (ps.state, ps.reason) == (TaskState.FAILED, LOST_WHILE_STARTING)
    # The two never-launched tasks were started by adoption, but the failure ended the
    # job, so they were stopped again; the marked task was never launched.
    assert "j1:1:ps:0" not in [key for key, _, _ in backend.launches]
    [done] = finished(published)
    assert done.state == JobState.FAILED


async def test_tasks_placed_after_the_start_are_launched_once_and_the_job_waits_for_them() -> None:
    deps, backend, published = make_deps()
    first = placed()
    first = first.model_copy(update={"spec": first.spec.model_copy(update={"gang": False}),
                                     "tasks": first.tasks[:2]})  # fmt: skip
    more = TasksPlaced(job_id="j1", tasks=placed().tasks)
    # Before its JobPlaced is handled: a transient error, redelivered later.
    with pytest.raises(TransientError):
        await launch_more(more, RECEIVED, deps)
    await launch_job(first, RECEIVED, deps)
    assert [key for key, _, _ in backend.launches] == ["j1:1:ps:0", "j1:1:worker:0"]
    # The tasks placed so far end: the job goes on, its third task is not placed yet.
    backend.exit("j1", "ps", 0, 0, at=1)
    backend.exit("j1", "worker", 0, 0, at=2)
    await check_tasks(deps)
    assert finished(published) == []
    await launch_more(more, RECEIVED, deps)
    await launch_more(more, RECEIVED, deps)  # a repeat launches nothing
    assert [key for key, _, _ in backend.launches][2:] == ["j1:1:worker:1"]
    job = await deps.store.get_job("j1")
    assert job is not None and len(job.tasks) == 3
    backend.exit("j1", "worker", 1, 0, at=3)
    await check_tasks(deps)
    await check_tasks(deps)
    [done] = finished(published)
    assert done.state == JobState.SUCCEEDED


async def test_a_task_end_recorded_while_the_bus_is_down_is_published_before_the_job_end() -> None:
    # Seen in the crash test: NATS killed as a task ended; its SUCCEEDED stayed in the
    # outbox until the launcher's next start, while the job's end went out without it.
    deps, backend, published = make_deps()
    collect = deps.publish
    await launch_job(placed(), RECEIVED, deps)
    backend.exit("j1", "worker", 0, 0, at=1)
    backend.exit("j1", "worker", 1, 0, at=2)
    await check_tasks(deps)
    down = True

    async def publish(event: Event) -> None:
        if down:
            raise ConnectionError("nats: connection closed")
        await collect(event)

    deps.publish = publish
    backend.exit("j1", "ps", 0, 0, at=3)
    with pytest.raises(ConnectionError):  # the watcher logs it and looks again
        await check_tasks(deps)
    with pytest.raises(ConnectionError):  # still down: the outbox cannot be sent yet
        await check_tasks(deps)
    down = False
    await check_tasks(deps)
    ends = [(r, i, s, q) for r, i, s, q in task_events(published) if q == 3]
    assert ("ps", 0, TaskState.SUCCEEDED, 3) in ends
    [done] = finished(published)
    assert isinstance(published[-1], JobFinished)  # after every task's last transition
    assert not await deps.store.unpublished_tasks()
    assert deps.unsettled == set()
