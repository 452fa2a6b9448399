"""The Kubernetes backend's pod cache: a create's answer that the namespace's watch has
already overtaken must not take the pod back to its first state (a pod that ran and
ended while its create was being answered looked running forever: bench/pipeline.py
--kube hung on one of 300 such jobs)."""

from __future__ import annotations

import copy
import json

import pytest

from trainyard_common.events import TaskPlacement
from trainyard_common.jobspec import JobSpec, RoleSpec
from trainyard_launcher.adapters.backend import AttemptEnd, AttemptSpec, TaskHandle, TaskRef
from trainyard_launcher.adapters.kubernetes import KubernetesBackend, KubeSettings
from trainyard_launcher.domain.failure import EndKind
from trainyard_launcher.domain.pods import (
    PodSettings,
    owner_name,
    pod_manifest,
    pod_name,
    service_name,
)

JOB = "0123456789abcdef0123456789abcdef"


def created(uid: str = "uid-1") -> dict:
    pod = pod_manifest(
        spec=JobSpec(name="j", image="img", roles=[RoleSpec(name="w", command="true")]),
        job_id=JOB, attempt=1, placement=TaskPlacement(role="w", index=0, node="n", host_ip="x"),
        env={}, command="true", namespace="ns", owner_uid=None, settings=PodSettings(),
    )  # fmt: skip
    pod["metadata"]["uid"] = uid
    pod["status"] = {"phase": "Pending"}
    return pod


def ended(pod: dict) -> dict:
    done = copy.deepcopy(pod)
    done["status"] = {
        "phase": "Succeeded",
        "containerStatuses": [
            {"name": "task", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ],
    }
    return done


REF = TaskRef(JOB, 1, "w", 0)


class _NoApi:
    """Names API calls for a replaced ``_delete`` to record; calls none."""

    def __getattr__(self, name: str) -> str:
        return name


async def test_the_watch_state_is_kept_over_an_older_create_answer() -> None:
    backend = KubernetesBackend(KubeSettings())
    pod = created()
    backend._remember("ns", ended(pod))  # the watch saw it end first
    backend._remember("ns", pod, unless_seen=True)  # then the create's answer came
    status = await backend.poll(REF, TaskHandle(uid="uid-1"))
    assert not status.running and status.exit_code == 0


async def test_a_create_answer_fills_in_what_the_watch_has_not_seen() -> None:
    backend = KubernetesBackend(KubeSettings())
    backend._remember("ns", ended(created("old-uid")))  # an earlier pod of that name
    backend._remember("ns", created("uid-2"), unless_seen=True)
    assert (await backend.poll(REF, TaskHandle(uid="uid-2"))).running
    # And from the watch, the newest state always wins.
    backend._remember("ns", ended(created("uid-2")))
    assert not (await backend.poll(REF, TaskHandle(uid="uid-2"))).running


def offline(monkeypatch) -> tuple[KubernetesBackend, list[tuple[str, str]], AttemptSpec]:
    """A backend that calls no API (its deletes recorded: name, namespace) and the open
    first attempt of a one-task job in namespace "ns", its namespace known but not what
    was made for it (as for an attempt adopted from a launcher before this one)."""
    backend = KubernetesBackend(KubeSettings(namespace="yard", allowed_namespaces=frozenset({"*"})))
    deleted: list[tuple[str, str]] = []

    async def delete(_call, name: str, namespace: str, grace: int | None = None) -> None:
        deleted.append((name, namespace))

    monkeypatch.setattr(backend, "_delete", delete)
    monkeypatch.setattr(KubernetesBackend, "core", property(lambda _self: _NoApi()))
    spec = JobSpec(name="j", image="img", namespace="ns",
                   roles=[RoleSpec(name="w", command="true")])  # fmt: skip
    attempt = AttemptSpec(JOB, 1, spec, (TaskPlacement(role="w", index=0, node="n", host_ip="x"),))
    backend._job_namespace[JOB] = (1, "ns")
    return backend, deleted, attempt


async def test_a_closed_attempt_forgets_its_namespace_and_its_kept_pod_is_still_found(
    monkeypatch,
) -> None:
    """One namespace entry per job ever run would grow with history: it goes when the
    attempt closes, and what still asks about a closed job's pods finds them in the
    watch's cache with their own namespace. (The API calls themselves are the e2e
    tests' business: tests/e2e/test_kubernetes.py runs jobs in other namespaces.)"""
    backend, deleted, attempt = offline(monkeypatch)
    spec = attempt.spec
    backend._remember("ns", ended(created()))  # the failed pod, kept for debugging
    await backend.close_attempt(attempt, AttemptEnd.FINISHED)
    assert backend._job_namespace == {}
    assert deleted and {namespace for _, namespace in deleted} == {"ns"}
    assert await backend.write_debug_env(REF, "A=1\n") == f"ns/{created()['metadata']['name']}"
    # A pod the cache does not hold is looked for where the job's spec says.
    assert backend.location(TaskRef(JOB, 1, "w", 1), spec).startswith("ns/")
    # A late close of an earlier attempt leaves the open one's entry; closing twice is
    # harmless.
    backend._job_namespace[JOB] = (2, "ns")
    await backend.close_attempt(attempt, AttemptEnd.FINISHED)
    assert backend._job_namespace == {JOB: (2, "ns")}
    second = AttemptSpec(JOB, 2, spec, attempt.tasks)
    await backend.close_attempt(second, AttemptEnd.FINISHED)
    await backend.close_attempt(second, AttemptEnd.FINISHED)
    assert backend._job_namespace == {}


async def test_an_attempt_opened_here_deletes_only_what_it_made(monkeypatch) -> None:
    """A lone task's attempt has no Service and no owner: its end asks for no delete of
    either (each was a 404 for every such job); a gang's has both; an adopted attempt,
    which a launcher before this one may have given both, is cleared of both."""
    backend, deleted, lone = offline(monkeypatch)
    key = (JOB, 1)
    backend._owner_uids[key] = None  # as open_attempt leaves a lone task's
    await backend.close_attempt(lone, AttemptEnd.FINISHED)
    assert deleted == []
    backend._owner_uids[key] = None
    await backend.close_attempt(lone, AttemptEnd.STOPPED)
    assert deleted == [(pod_name(JOB, 1, "w", 0), "ns")]  # its pod, itself
    deleted.clear()
    await backend.close_attempt(lone, AttemptEnd.STOPPED)  # adopted: nothing known
    assert sorted(deleted) == sorted([(owner_name(JOB, 1), "ns"), (pod_name(JOB, 1, "w", 0), "ns"),
                                      (service_name(JOB), "ns")])  # fmt: skip
    gang_spec = JobSpec(name="j", image="img", namespace="ns",
                        roles=[RoleSpec(name="w", command="true", replicas=2)])  # fmt: skip
    tasks = tuple(TaskPlacement(role="w", index=i, node="n", host_ip="x") for i in range(2))
    gang = AttemptSpec(JOB, 1, gang_spec, tasks)
    for end, made in ((AttemptEnd.FINISHED, [service_name(JOB)]),
                      (AttemptEnd.STOPPED, [owner_name(JOB, 1), service_name(JOB)])):  # fmt: skip
        deleted.clear()
        backend._owner_uids[key] = "owner-uid"  # as open_attempt leaves a gang's
        await backend.close_attempt(gang, end)
        assert sorted(name for name, _ in deleted) == sorted(made), end


async def test_a_lost_nodes_task_is_known_while_its_attempt_is_open_or_its_pod_cached(
    monkeypatch,
) -> None:
    """A task on a node that disappeared ends as NODE_LOST, even when its pod is gone
    before the launcher asks (the pod garbage collector deletes a lost node's pods).
    What says so is kept while the attempt is open or the pod is cached, no longer:
    one entry per such task ever seen would grow with history (the pods' last events
    come after their attempt closed, and must not bring it back for good)."""
    backend, _, attempt = offline(monkeypatch)
    pod = created()
    pod["spec"]["nodeName"] = "n"
    pod["status"] = {"phase": "Running"}
    backend._remember("ns", pod)
    backend._lost("n")
    backend._forget(REF)  # its pod deleted before the launcher looked
    status = await backend.poll(REF, TaskHandle(uid="uid-1"))
    assert not status.running and status.end_kind == EndKind.NODE_LOST.value
    await backend.close_attempt(attempt, AttemptEnd.INTERRUPTED)
    assert backend._node_of_lost == {}
    # The pod's last events, after the close: kept while the pod is cached, gone with it.
    assert backend._remember("ns", pod) == REF
    assert REF in backend._node_of_lost
    backend._forget(REF)  # its DELETED
    assert backend._node_of_lost == {} and backend._pods == {}


async def test_the_cache_keeps_what_is_read_of_a_pod_not_the_whole_pod() -> None:
    # A finished job's pods stay in the cluster (their logs), each in the cache: whole,
    # the launcher's memory grew with every task ever run by its environment, volumes
    # and managed fields.
    backend = KubernetesBackend(KubeSettings())
    pod = ended(created())
    pod["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    pod["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x" * 64} for i in range(50)]
    backend._remember("ns", pod)
    kept = backend._pods[REF].body
    assert "managedFields" not in kept["metadata"] and "containers" not in kept["spec"]
    assert len(json.dumps(kept)) < len(json.dumps(pod)) / 10
    status = await backend.poll(REF, TaskHandle(uid="uid-1"))
    assert not status.running and status.exit_code == 0


async def test_the_inventory_is_this_installations_pods_that_still_run() -> None:
    # At each restart the launcher stopped every pod of the inventory its store did not
    # know as running: the ended pods kept for their logs, and every pod of another
    # Trainyard sharing the cluster.
    backend = KubernetesBackend(KubeSettings(installation="prod"))

    def pod(job: str, installation: str | None, done: bool = False) -> dict:
        body = created(f"uid-{job}")
        body["metadata"]["name"] = pod_name(job, 1, "w", 0)
        body["metadata"]["labels"]["trainyard.dev/job"] = job
        body["metadata"]["annotations"]["trainyard.dev/job"] = job
        if installation is not None:
            body["metadata"]["labels"]["trainyard.dev/installation"] = installation
        return ended(body) if done else body

    jobs = {"a" * 32: "prod", "b" * 32: "staging", "c" * 32: None}
    for job, installation in jobs.items():
        backend._remember("ns", pod(job, installation))
    backend._remember("ns", pod("d" * 32, "prod", done=True))
    inventory = await backend.inventory()
    assert inventory is not None
    # Its own running pod, and one made before pods named their installation.
    assert sorted(ref.job_id for ref in inventory) == ["a" * 32, "c" * 32]
    assert KubeSettings.from_env({"YARD_K8S_NAMESPACE": "ml"}).installation == "ml"
    assert KubeSettings.from_env({"YARD_K8S_INSTALLATION": "x"}).installation == "x"


async def test_a_create_the_api_server_cannot_take_now_comes_again(monkeypatch) -> None:
    # A 429 or a 5xx failed the task at once (a job without retries failed for it); a
    # 504's pod may even have been made, and ran on as an orphan.
    from kubernetes_asyncio.client.exceptions import ApiException

    from trainyard_common.errors import TransientError
    from trainyard_launcher.adapters.backend import LaunchRefused, TaskLaunch

    backend, _deleted, attempt = offline(monkeypatch)
    backend._owner_uids[(JOB, 1)] = None
    answers: list[ApiException] = []

    async def refused(*_args: object, **_kwargs: object) -> dict:
        raise answers.pop(0)

    monkeypatch.setattr(backend, "_raw", refused)
    launch = TaskLaunch(ref=REF, attempt=attempt, placement=attempt.tasks[0], env={}, command="x")
    for status, message in [(429, "slow down"), (504, "timeout"), (403, "exceeded quota: q")]:
        exc = ApiException(status=status, reason="x")
        exc.body = json.dumps({"message": message})
        answers.append(exc)
        with pytest.raises(TransientError, match=message):
            await backend.launch(launch)
    # A pod that alone asks more than the quota's hard limit never fits: it was tried
    # again until the start deadline (ten minutes an attempt), a platform failure.
    exceeded = (
        'pods "p" is forbidden: exceeded quota: team, requested: limits.memory=2Gi,'
        "requests.cpu=4,requests.nvidia.com/gpu=1, used: limits.memory=1Gi,requests.cpu=0,"
        "requests.nvidia.com/gpu=0, limited: limits.memory=4Gi,requests.cpu=2,"
        "requests.nvidia.com/gpu=8"
    )
    for status, message, refused_for_good in [
        (422, "Pod is invalid", True),
        (403, exceeded, True),
        (403, exceeded.replace("requests.cpu=4", "requests.cpu=1500m"), False),
    ]:
        exc = ApiException(status=status, reason="x")
        exc.body = json.dumps({"message": message})
        answers.append(exc)
        with pytest.raises(LaunchRefused if refused_for_good else TransientError) as raised:
            await backend.launch(launch)
        assert message in str(raised.value)


async def test_a_kill_grace_under_a_second_is_never_the_apis_delete_now(monkeypatch) -> None:
    backend, _deleted, _attempt = offline(monkeypatch)
    graces: list[int | None] = []

    async def delete(_call, name: str, namespace: str, grace: int | None = None) -> None:
        graces.append(grace)
        backend._pods.pop(REF, None)  # as the watch sees it go

    monkeypatch.setattr(backend, "_delete", delete)
    for grace_s in (0.1, 0, 2.5):
        backend._remember("ns", ended(created()))
        await backend.kill(REF, TaskHandle(uid="uid-1"), grace_s)
    assert graces == [1, 1, 3]


async def test_a_command_secret_the_namespace_cannot_take_now_comes_again(monkeypatch) -> None:
    # A namespace's count of Secrets used up for now failed the task as the job's own.
    from kubernetes_asyncio.client.exceptions import ApiException

    from trainyard_common.errors import TransientError
    from trainyard_launcher.adapters.backend import LaunchRefused, TaskLaunch

    backend, _deleted, attempt = offline(monkeypatch)
    answers: list[ApiException] = []

    async def refused(*_args: object, **_kwargs: object) -> dict:
        raise answers.pop(0)

    monkeypatch.setattr(backend, "_raw", refused)
    launch = TaskLaunch(ref=REF, attempt=attempt, placement=attempt.tasks[0], env={}, command="x")
    quota = "exceeded quota: q, requested: count/secrets=1, used: count/secrets={}, limited: count/secrets={}"
    for message, kind in [
        (quota.format(10, 10), TransientError),
        (quota.format(0, 0), LaunchRefused),
    ]:
        exc = ApiException(status=403, reason="Forbidden")
        exc.body = json.dumps({"message": f'secrets "s" is forbidden: {message}'})
        answers.append(exc)
        with pytest.raises(kind, match="exceeded quota"):
            await backend._command_secret(launch, "ns", "owner-uid")


async def test_a_followed_log_ends_once_its_follower_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The follow asked ended() only until the pod started, then streamed until the
    # kubelet closed it: a follower whose token was revoked kept reading (found in
    # review). What is on its way when it ends is still sent.
    import asyncio

    from trainyard_launcher.adapters import kubernetes

    monkeypatch.setattr(kubernetes, "FOLLOW_CHECK_S", 0.05)
    running = created()
    running["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "task", "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}
    ]}  # fmt: skip
    backend = KubernetesBackend(KubeSettings(namespace="ns"))
    backend._remember("ns", running)
    sent = asyncio.Queue[bytes]()

    class Stream:
        async def __aenter__(self) -> Stream:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        class content:  # noqa: N801 - aiohttp's attribute
            @staticmethod
            async def iter_any():  # type: ignore[no-untyped-def]
                while True:  # the kubelet's stream of a running container: never ends
                    yield await sent.get()

    class Core:
        async def read_namespaced_pod_log(self, *args: object, **kwargs: object) -> Stream:
            return Stream()

    monkeypatch.setattr(KubernetesBackend, "core", property(lambda self: Core()))
    done = False

    async def ended() -> bool:
        return done

    follow = backend.follow_log(REF, "stdout", 0, ended)
    sent.put_nowait(b"first\n")
    assert await anext(follow) == b"first\n"
    done = True
    sent.put_nowait(b"last\n")  # on its way as the follower is done: still sent
    got = await asyncio.wait_for(anext(follow), 2.0)
    assert got == b"last\n"
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(follow), 3.0)
