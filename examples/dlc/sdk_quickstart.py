"""Run a PAI-DLC job on Trainyard with the official SDK (alibabacloud-pai-dlc20201203)."""

from __future__ import annotations

import os
import time

from alibabacloud_pai_dlc20201203 import models as dlc
from alibabacloud_pai_dlc20201203.client import Client
from alibabacloud_tea_openapi.exceptions import ClientException
from alibabacloud_tea_openapi.utils_models import Config, OpenApiRequest, Params
from darabonba.runtime import RuntimeOptions

client = Client(
    Config(
        access_key_id=os.environ["DLC_AK"],
        access_key_secret=os.environ["DLC_SECRET"],
        endpoint=os.environ.get("DLC_ENDPOINT", "127.0.0.1:8080"),
        protocol="http",
    )
)

# This SDK version has no data-source methods; its signed call_api reaches the API.
params = Params(
    action="CreateDataSource",
    version="2020-12-03",
    protocol="HTTP",
    pathname="/api/v1/datasources",
    method="POST",
    auth_type="AK",
    style="ROA",
    req_body_type="json",
    body_type="json",
)
source = client.call_api(
    params,
    OpenApiRequest(
        body={
            "DataSourceType": "local",
            "DisplayName": "scratch",
            "Path": "/tmp",
            "MountPath": "/root/data/scratch",
        }
    ),
    RuntimeOptions(),
)["body"]
print("data source", source["DataSourceId"])

job = client.create_job(
    dlc.CreateJobRequest(
        display_name="hello-dlc",
        job_type="PyTorchJob",
        user_command="echo hello from DLC",
        job_specs=[
            dlc.JobSpec(
                type="Worker",
                image="python:3.11",
                pod_count=1,
                resource_config=dlc.ResourceConfig(cpu="1", memory="1Gi"),
            )
        ],
        # With the launcher's preparation step, the source is mounted at its MountPath:
        # data_sources=[dlc.CreateJobRequestDataSources(data_source_id=source["DataSourceId"])],
    )
).body
print("job", job.job_id)

while True:
    try:
        status = client.get_job(job.job_id, dlc.GetJobRequest()).body
    except ClientException as exc:  # the status view lags CreateJob by a moment
        if exc.status_code != 404:
            raise
    else:
        print(status.status)
        if status.status in ("Succeeded", "Failed", "Stopped"):
            break
    time.sleep(1)

for line in client.get_job_events(job.job_id, dlc.GetJobEventsRequest()).body.events:
    print(" ", line)
pod = status.pods[0].pod_id
print("\n".join(client.get_pod_logs(job.job_id, pod, dlc.GetPodLogsRequest()).body.logs))
