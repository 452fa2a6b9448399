"""How a task's resources are enforced on the local backend (domain/limits.py), what
the summary says is and is not enforced, and how a task past its memory limit ends."""

from __future__ import annotations

from trainyard_common.events import FailureClass
from trainyard_common.jobspec import Resources
from trainyard_launcher.adapters.backend import TaskStatus
from trainyard_launcher.domain.failure import EndKind, classify, permanent
from trainyard_launcher.domain.limits import (
    LimitPlan,
    Mechanisms,
    cgroup_name,
    cpu_max,
    memory_exhausted,
    out_of_memory_note,
    plan_limits,
)
from trainyard_launcher.handlers.ending import _end_of

RES = Resources(cpu=1.5, memory_mb=512, shm_mb=128)
CGROUP = Mechanisms(
    cgroup="/sys/fs/cgroup/yard",
    controllers=frozenset({"memory", "cpu", "pids"}),
    why_no_cgroup="",
    shm_namespace=True,
)
BARE = Mechanisms(
    why_no_cgroup="no cgroup v2 hierarchy is mounted",
    shm_namespace=False,
    why_no_shm="a private mount namespace for it needs root",
)


def test_with_a_cgroup_the_whole_task_is_held_to_memory_cpu_and_pids() -> None:
    plan = plan_limits(RES, CGROUP, "/sys/fs/cgroup/yard/t")
    assert (plan.memory_mb, plan.memory_by, plan.cpu_max) == (512, "cgroup", "150000 100000")
    assert plan.pids_max and plan.cgroup == "/sys/fs/cgroup/yard/t" and plan.shm_mb == 128
    assert plan.summary.startswith("limits: memory 512 MiB (cgroup v2 memory.max, the whole task)")
    assert "no cgroup" not in plan.summary


def test_what_a_job_leaves_uncapped_is_reserved_but_not_enforced() -> None:
    for found, cgroup in ((CGROUP, "/sys/fs/cgroup/yard/t"), (BARE, None)):
        plan = plan_limits(RES.model_copy(update={"uncapped": ["cpu", "memory"]}), found, cgroup)
        assert (plan.memory_mb, plan.memory_by, plan.cpu_max) == (None, "", None)
        assert "memory 512 MiB reserved, not capped" in plan.summary
        assert "cpu 1.5 reserved, not capped" in plan.summary
    plan = plan_limits(RES.model_copy(update={"uncapped": ["memory"]}), CGROUP, "/cg/t")
    assert (plan.memory_mb, plan.cpu_max) == (None, "150000 100000")


def test_without_one_memory_is_an_rlimit_and_the_rest_is_said_to_be_unenforced() -> None:
    plan = plan_limits(RES, BARE, None)
    assert (plan.memory_by, plan.cpu_max, plan.pids_max, plan.cgroup, plan.shm_mb) == (
        "rlimit",
        None,
        None,
        None,
        None,
    )
    assert plan.summary == (
        "limits: memory 512 MiB (RLIMIT_DATA, per process); cpu 1.5 not enforced; "
        "shm 128 MiB not enforced: the machine's /dev/shm (a private mount namespace for "
        "it needs root); open files 65536, no core dumps; no cgroup: no cgroup v2 "
        "hierarchy is mounted"
    )


def test_a_cgroup_without_the_cpu_controller_limits_memory_only() -> None:
    found = Mechanisms(cgroup="/cg", controllers=frozenset({"memory"}), shm_namespace=True)
    plan = plan_limits(RES, found, "/cg/t")
    assert plan.memory_by == "cgroup" and plan.cpu_max is None and plan.pids_max is None


def test_the_plan_survives_the_trip_to_the_wrapper() -> None:
    plan = plan_limits(RES, CGROUP, "/cg/t")
    assert LimitPlan.from_json(plan.to_json()) == plan


def test_cpu_quota_and_cgroup_names() -> None:
    assert cpu_max(0.5) == "50000 100000" and cpu_max(0) is None
    assert cgroup_name("job/1", 2, "w r", 0) == "yard-job_1-2-w_r-0"


def test_what_an_allocation_failure_looks_like() -> None:
    assert memory_exhausted("Traceback ...\nMemoryError\n")
    assert memory_exhausted("terminate called after throwing an instance of 'std::bad_alloc'")
    assert memory_exhausted("bash: fork: Cannot allocate memory")
    assert not memory_exhausted("ValueError: bad input\n")


def test_out_of_memory_is_the_users_failure_and_may_be_retried() -> None:
    assert classify(1, None, EndKind.OUT_OF_MEMORY) is FailureClass.USER
    assert classify(137, 9, EndKind.OUT_OF_MEMORY) is FailureClass.USER
    assert not permanent(1, None, EndKind.OUT_OF_MEMORY)


def test_a_task_that_ran_out_of_memory_fails_saying_so() -> None:
    note = out_of_memory_note(plan_limits(RES, BARE, None))
    state, fields = _end_of(
        TaskStatus(running=False, exit_code=1, reason=note, end_kind="out_of_memory"), "lost"
    )
    assert fields["failure_class"] is FailureClass.USER
    assert fields["end_kind"] == "out_of_memory"
    assert fields["reason"] == (
        "exited with code 1; out of memory: the task's limit of 512 MiB "
        "was reached (RLIMIT_DATA per process, an allocation failed)"
    )


def test_no_shared_memory_is_still_a_dev_shm_of_the_tasks_own() -> None:
    # shm_mb 0 gave the task the machine's /dev/shm: memory no limit charges to it, with
    # names shared with the services and every other user's tasks.
    plan = plan_limits(RES.model_copy(update={"shm_mb": 0}), CGROUP, "/cg/t")
    assert plan.shm_mb == 0
    assert "shm 0 MiB (an empty read-only tmpfs at /dev/shm)" in plan.summary
    assert LimitPlan.from_json(plan.to_json()).shm_mb == 0
    # Where no mount namespace can be made (not root), it is the machine's, as said.
    bare = plan_limits(RES.model_copy(update={"shm_mb": 0}), BARE, None)
    assert bare.shm_mb is None and "the machine's /dev/shm" in bare.summary
