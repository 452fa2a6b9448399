"""What the running platform answers fits the types the OpenAPI document gives its own
API (trainyard_common.api): a client generated from contracts/openapi.json reads real
answers."""

from __future__ import annotations

import httpx

from trainyard_common.api import (
    ClusterView,
    ControlAnswer,
    ErrorBody,
    History,
    JobList,
    JobView,
    Me,
    QueueView,
    SubmitAnswer,
    ValidationAnswer,
)
from trainyard_stack.platform import Platform

from .conftest import Api, unique


def test_real_answers_fit_the_documented_types(platform: Platform, api: Api) -> None:
    http = api.http
    job = {
        "name": unique("typed"),
        "labels": [{"name": "team", "value": "typed-tests"}],
        "roles": [
            {
                "name": "w",
                "command": "true",
                "resources": {"cpu": 1, "memory_mb": 128},
                "ports": [{"label": "http", "count": 1}],
            }
        ],
    }
    checked = http.post("/v1/jobs:validate", json=job)
    assert checked.status_code == 200 and ValidationAnswer.model_validate(checked.json()).valid
    submitted = http.post("/v1/jobs", json=job)
    assert submitted.status_code == 202
    job_id = SubmitAnswer.model_validate(submitted.json()).id
    api.wait(job_id)
    view = JobView.model_validate(http.get(f"/v1/jobs/{job_id}").json())
    assert view.state == "SUCCEEDED" and view.tasks[0].ports[0].label == "http"
    task = view.tasks[0]
    assert task.started_at is not None and task.ended_at is not None
    assert task.started_at <= task.ended_at
    assert view.spec is not None and view.spec.name == job["name"]
    History.model_validate(http.get(f"/v1/jobs/{job_id}/events").json())
    listed = JobList.model_validate(http.get("/v1/jobs", params={"limit": 5}).json())
    assert listed.items and listed.total >= 1
    labelled = http.get("/v1/jobs", params={"label": "team=typed-tests", "counts": "true"})
    page = JobList.model_validate(labelled.json())
    assert [j.id for j in page.items] == [job_id] and page.counts == {"SUCCEEDED": 1}
    refused = http.get("/v1/jobs", params={"label": "app.kubernetes.io/name=x"})
    assert (
        refused.status_code == 400 and "label:" in ErrorBody.model_validate(refused.json()).detail
    )
    assert Me.model_validate(http.get("/v1/me").json()).admin
    QueueView.model_validate(http.get("/v1/placement/queue").json())
    cluster = ClusterView.model_validate(http.get("/v1/placement/cluster").json())
    assert {n.name for n in cluster.nodes} == {"node-gpu", "node-cpu"}
    stopped = http.post(f"/v1/jobs/{job_id}/stop")
    assert stopped.status_code == 202
    ControlAnswer.model_validate(stopped.json())
    for refused in (
        http.get("/v1/jobs/no-such-job"),
        httpx.get(f"{platform.url}/v1/jobs"),
        http.get("/v1/jobs", params={"limit": 0}),
    ):
        assert refused.status_code in (401, 404, 422)
        ErrorBody.model_validate(refused.json())
