"""OpenPAI's official JavaScript SDK (@microsoft/openpai-js-sdk 0.1.5, pinned in tools/js),
unchanged, against the whole platform: submission (and a used name's 409), the job and
its attempts, a task and where its logs are, the job's events, the cluster's info and its
virtual clusters (the queues), and a stop."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from trainyard_stack.platform import Platform

from .conftest import unique

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "tools" / "js" / "node_modules" / "@microsoft" / "openpai-js-sdk"


@pytest.mark.skipif(
    shutil.which("node") is None or not SDK.exists(),
    reason="node or the OpenPAI JS SDK is missing (make setup installs tools/js)",
)
def test_the_openpai_js_sdk_works_unchanged(platform: Platform) -> None:
    name = unique("paisdk")
    # At the rest server's own path, as OpenPAI's clients are configured
    # (https://<host>/rest-server): nothing was served there.
    done = subprocess.run(
        ["node", str(Path(__file__).with_name("openpai_sdk.js")), f"{platform.url}/rest-server",
         platform.token, "admin", name, "default"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)

    assert "ok" in out["create"], out["create"]
    assert out["firstGet"]["ok"]["name"] == name, out["firstGet"]  # no 404 after the 202
    # The SDK raises OpenPAI's error message (its code stays in the body).
    # "Job ${frameworkName} already exists." (rest-server controllers/v2/job.js).
    assert out["createAgain"] == {"status": 409, "data": f"Error: Job admin~{name} already exists."}
    status = out["job"]["ok"]
    assert status["jobStatus"]["state"] == "SUCCEEDED", status
    assert [t["taskState"] for t in status["taskRoles"]["worker"]["taskStatuses"]] == [
        "SUCCEEDED",
        "SUCCEEDED",
    ]
    assert out["attempt"]["ok"]["jobStatus"]["attemptId"] == 0
    assert out["missingAttempt"]["status"] == 404
    assert out["config"]["ok"]["name"] == name
    assert name in [j["name"] for j in out["list"]["ok"]]

    task = out["task"]["ok"]
    assert (task["taskRoleName"], task["taskIndex"], task["taskState"]) == (
        "worker",
        1,
        "SUCCEEDED",
    )
    assert task["attempts"][0]["containerExitCode"] == 0
    assert out["missingTask"]["status"] == 404
    locations = {loc["name"]: loc["uri"] for loc in out["taskLogs"]["ok"]["locations"]}
    log = httpx.get(locations["stdout"], headers={"Authorization": f"Bearer {platform.token}"})
    assert log.status_code == 200 and log.text.strip() == "hello from worker 1", log.text

    events = out["events"]["ok"]
    assert events["totalCount"] == len(events["data"]) > 0
    assert {"Scheduled", "Completed"} <= {e["reason"] for e in events["data"]}
    assert "ok" in out["attemptsHealthz"]
    [attempt] = out["attempts"]["ok"]
    assert (attempt["attemptIndex"], attempt["state"], attempt["isLatest"]) == (
        0,
        "SUCCEEDED",
        True,
    )
    assert attempt["totalTaskNumber"] == 2
    assert out["attemptZero"]["ok"]["frameworkName"] == f"admin~{name}"

    assert out["info"]["ok"]["launcherType"] == "k8s"
    vcs = out["virtualClusters"]["ok"]
    assert "default" in vcs and vcs["default"]["resourcesTotal"]["GPUs"] == 2
    assert out["virtualCluster"]["ok"] == vcs["default"]
    assert out["missingVirtualCluster"] == {
        "status": 404,
        "data": "Error: Virtual cluster nope is not found.",
    }
    assert out["skuTypes"]["ok"]["TITANX"]["gpu"] == 1
    # Tags: added and removed by the owner, shown by the job, filtered by the list.
    assert out["v1Stop"]["ok"] == {
        "status": 202,
        "message": f"Execute job admin~{name} successfully.",
    }, out["v1Stop"]
    assert out["addTag"]["ok"]["message"] == f"Add tag nightly for job admin~{name} successfully."
    assert sorted(out["tagged"]["ok"]["tags"]) == ["keep", "nightly"]
    assert [j["name"] for j in out["listTagged"]["ok"]] == [name]
    assert name not in [j["name"] for j in out["listNotTagged"]["ok"]]
    assert name in [j["name"] for j in out["listKeyword"]["ok"]]
    assert out["listNoKeyword"]["ok"] == []
    ordered = [j["name"] for j in out["listOrdered"]["ok"]]
    assert ordered == sorted(ordered) and name in ordered
    assert "ok" in out["deleteTag"], out["deleteTag"]
    assert out["untagged"]["ok"]["tags"] == ["keep"]
    assert out["tagMissingJob"]["status"] == 404
    # Accounts: the caller's record and everyone's to an admin; users and groups are not
    # kept here (refused, saying how users are made); tokens: the caller's own, a new
    # application token that works and is revoked; no storages.
    me = out["me"]["ok"]
    assert (me["username"], me["admin"], me["grouplist"]) == (
        "admin",
        True,
        ["default", "admingroup"],
    )
    assert "default" in me["virtualCluster"]
    assert "admin" in [u["username"] for u in out["users"]["ok"]]
    assert out["missingUser"]["status"] == 404
    for refused in ("createUser", "updateUser", "updateSelf", "deleteUser", "userGroup",
                    "deleteUserGroup", "userGrouplist", "createGroup", "updateGroup",
                    "deleteGroup"):  # fmt: skip
        assert out[refused]["status"] == 400, (refused, out[refused])
        assert "tokens an admin issues" in out[refused]["data"], out[refused]
    assert [g["groupname"] for g in out["groups"]["ok"]] == ["default", "admingroup"]
    assert out["group"]["ok"]["extension"]["acls"]["admin"] is True
    assert out["missingGroup"]["status"] == 404
    assert "admin" in [u["username"] for u in out["members"]["ok"]]
    assert out["tokens"]["ok"] == {"tokens": [platform.token]}
    app_token = out["appToken"]["ok"]["token"]
    assert out["appToken"]["ok"]["application"] is True
    assert out["withAppToken"]["ok"]["name"] == name
    assert out["appTokens"]["ok"] == {"tokens": [app_token]}
    assert out["revoke"]["ok"] == {"message": "revoke successfully"}
    assert out["afterRevoke"]["status"] == 401
    # Tokens only, and said so (the SDK's login keeps no message of a refusal).
    for sign_in in ("basicLogin", "basicLogout", "oidcLogin"):
        assert out[sign_in]["status"] == 400, (sign_in, out[sign_in])
    assert "signs in with a token" in str(out["basicLogout"]["data"]), out["basicLogout"]
    assert out["storages"]["ok"] == {"storages": []}
    assert out["missingStorage"]["status"] == 404
    assert "ok" in out["stop"], out["stop"]
    assert out["missingJob"]["status"] == 404
