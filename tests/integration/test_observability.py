"""deploy/'s observability files: the alert rules and Prometheus's configuration as
Debian's promtool reads them (with the rules' own cases), and the Grafana dashboard's
shape. That every query names a metric the services really export, and that a real
Prometheus evaluates them all, is tests/e2e/test_metrics.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trainyard_stack.metrics import prometheus_config

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "trainyard.json"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (make setup installs Debian's prometheus as root)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_the_alert_rules_and_the_configuration_pass_promtool() -> None:
    for args in (("check", "rules", "alerts.yml"), ("check", "config", "prometheus.yml")):
        done = promtool(*args)
        assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_alert_fires_in_its_case_and_not_in_the_healthy_one() -> None:
    done = promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    }
    cases = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    tested = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check["exp_alerts"]
    }
    assert tested == alerts, f"alerts without a firing case: {alerts - tested}"


@needs_promtool
def test_the_configuration_make_metrics_writes_passes_promtool(tmp_path: Path) -> None:
    config = prometheus_config(
        {"status": "http://127.0.0.1:8082", "status-2": "http://127.0.0.1:9002",
         "gateway": "http://127.0.0.1:8080"},
        PROMETHEUS / "alerts.yml",
        interval_s=1,
    )  # fmt: skip
    jobs = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    assert jobs == {"gateway": ["127.0.0.1:8080"], "status": ["127.0.0.1:8082", "127.0.0.1:9002"]}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def dashboard_panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_the_dashboard_is_provisioned_and_every_panel_queries_prometheus() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "trainyard"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    source = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = source["datasources"][0]["uid"]
    provider = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "trainyard.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    compose = (ROOT / "deploy" / "compose" / "compose.yaml").read_text()
    assert "../grafana/dashboards:/var/lib/grafana/dashboards" in compose
    panels = dashboard_panels()
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            # Every query reads Trainyard's own metrics.
            assert re.search(r"\btrainyard_[a-z_]+", target["expr"]), target["expr"]
    # The figures the dashboard must show (issue 12): one panel each at least.
    queried = " ".join(t["expr"] for p in panels for t in p["targets"])
    for name in (
        "trainyard_jobs_submitted_total", "trainyard_jobs_accepted_total",
        "trainyard_jobs_rejected_total", "trainyard_jobs_finished_total", "trainyard_jobs",
        "trainyard_queue_waiting_jobs", "trainyard_queue_wait_seconds_bucket",
        "trainyard_placement_cycle_seconds_bucket", "trainyard_placement_decisions_total",
        "trainyard_gpus_allocated", "trainyard_task_exits_total", "trainyard_job_retries_total",
        "trainyard_job_interruptions_total", "trainyard_bus_consumer_pending_messages",
        "trainyard_bus_redeliveries_total", "trainyard_bus_dead_letters_total",
        "trainyard_http_requests_total", "trainyard_http_request_duration_seconds_bucket",
    ):  # fmt: skip
        assert re.search(rf"\b{name}\b", queried), name


def test_the_latency_panel_tells_the_services_apart() -> None:
    """Grouped by route alone, a template two services share (their /healthz, /metrics)
    was one series, and the gateway, which forwards everything under one route
    (/{path:path}), was mixed with what it forwards to: each service's own."""
    latency = [
        target["expr"]
        for panel in dashboard_panels()
        for target in panel["targets"]
        if "trainyard_http_request_duration_seconds_bucket" in target["expr"]
    ]
    assert latency
    for expr in latency:
        grouped = re.search(r"sum by \(([^)]*)\)", expr)
        assert grouped is not None, expr
        assert {"job", "route", "le"} <= {g.strip() for g in grouped.group(1).split(",")}, expr
