"""The seed's Jupyter pattern (openpai-scm-submit-job.md §3.1) end to end: a task role
asks for a port with portList, its command serves on $PAI_CONTAINER_HOST_<label>_PORT_LIST,
and a person reaches it at the host and port the job's view shows."""

from __future__ import annotations

import time

import httpx
import pytest

from .conftest import Api

pytestmark = pytest.mark.e2e


def notebook_job(name: str) -> dict:
    # The seed's JSON, with an HTTP server standing in for `jupyter notebook --port=...`.
    return {
        "jobName": name,
        "image": "sitonholy/ai:16.04-9.0-3.5-pmt",
        "authFile": "",
        "dataDir": "",
        "outputDir": "",
        "codeDir": "",
        "retryCount": 0,
        "taskRoles": [
            {
                "name": "task_1",
                "taskNumber": 1,
                "cpuNumber": 1,
                "memoryMB": 512,
                "shmMB": 64,
                "gpuNumber": 0,
                "storageGB": 5,
                "minFailedTaskCount": None,
                "minSucceededTaskCount": None,
                "command": "echo notebook > index.html && python3 -m http.server "
                "$PAI_CONTAINER_HOST_jupyter_PORT_LIST --bind 0.0.0.0",
                "portList": [{"label": "jupyter", "beginAt": 0, "portNumber": 1}],
            }
        ],
        "jobEnvs": {},
        "extras": {},
    }


def test_a_notebook_port_is_reachable_where_the_job_view_says(api: Api) -> None:
    job_id = api.submit(notebook_job("jupyter_e2e"))
    view = api.wait(job_id, {"RUNNING", "FAILED", "SUCCEEDED", "STOPPED"})
    assert view["state"] == "RUNNING", view
    [task] = view["tasks"]
    # Its own port, and the http and ssh ports OpenPAI gives every task role.
    assert sorted(g["label"] for g in task["ports"]) == ["http", "jupyter", "ssh"]
    [group] = [g for g in task["ports"] if g["label"] == "jupyter"]
    assert len(group["ports"]) == 1
    url = f"http://{task['host_ip']}:{group['ports'][0]}/index.html"
    deadline = time.monotonic() + 30
    answer = None
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, timeout=2)
            break
        except httpx.TransportError:
            time.sleep(0.2)  # the server is still starting
    assert answer is not None and answer.status_code == 200, url
    assert answer.text == "notebook\n"

    api.stop(job_id)
    assert api.wait(job_id)["state"] == "STOPPED"
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=2)  # nothing of the task serves after its end
