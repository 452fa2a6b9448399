"""/metrics on every process of a running platform, after jobs that succeed, fail and
are rejected: the figures each service owes (issue 12), every metric the dashboard and
the alert rules name really exported, and a real Prometheus (Debian's) scraping the
platform and evaluating every query of both."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from trainyard_stack.metrics import Prometheus
from trainyard_stack.platform import Platform, service_of

from .conftest import Api, unique

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "trainyard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def job(command: str) -> dict[str, Any]:
    return {
        "name": unique("metrics"),
        "roles": [{"name": "w", "command": command, "resources": {"cpu": 1, "memory_mb": 128}}],
    }


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] if p["type"] != "row" for t in p["targets"]]
    rules = yaml.safe_load(ALERTS.read_text())["groups"]
    return exprs + [rule["expr"] for group in rules for rule in group["rules"]]


def scrape(platform: Platform) -> dict[str, dict[str, Any]]:
    """Every process's families: instance -> family name -> family."""
    out = {}
    for instance in platform.procs:
        answer = httpx.get(f"{platform.service_url(instance)}/metrics", timeout=10)
        assert answer.status_code == 200, (instance, answer.text)
        out[instance] = {f.name: f for f in text_string_to_metric_families(answer.text)}
    return out


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    for f in families.values():
        for s in f.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@pytest.fixture(scope="module")
def jobs(api: Api) -> Iterator[dict[str, str]]:
    """One job that succeeds, one whose task fails, one validation rejects."""
    ids = {
        "succeeded": api.submit(job("true")),
        "failed": api.submit(job("exit 3")),
        "rejected": api.submit({**job("true"), "queue": "no-such-queue"}),
    }
    for kind, job_id in ids.items():
        assert api.wait(job_id)["state"] == kind.upper()
    yield ids


def test_every_service_exports_its_figures(platform: Platform, jobs: dict[str, str]) -> None:
    scrape(platform)  # a scrape is counted once answered: the next one shows it
    deadline = time.monotonic() + 30
    while True:
        scraped = scrape(platform)
        status = scraped["status"]
        # Jobs by state are recounted in the store every 10 s.
        if value(status, "trainyard_jobs", state="SUCCEEDED") >= 1 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert value(status, "trainyard_jobs", state="SUCCEEDED") >= 1
    assert value(status, "trainyard_jobs", state="REJECTED") >= 1
    assert value(status, "trainyard_jobs_submitted_total", dialect="native") >= 3
    assert value(status, "trainyard_jobs_accepted_total", dialect="native") >= 2
    assert value(status, "trainyard_jobs_rejected_total", dialect="native") >= 1
    for outcome in ("succeeded", "failed"):
        assert (
            value(status, "trainyard_jobs_finished_total", dialect="native", outcome=outcome) >= 1
        )
    assert value(status, "trainyard_task_exits_total", state="failed", failure_class="user") >= 1
    assert value(status, "trainyard_queue_wait_seconds_count", queue="default") >= 2

    placement = scraped["placement"]
    assert value(placement, "trainyard_node_gpus", node="node-gpu") == 2
    assert "trainyard_queue_waiting_jobs" in placement
    assert any(
        s.labels == {"queue": "default"} for s in placement["trainyard_queue_waiting_jobs"].samples
    )
    assert value(placement, "trainyard_placement_cycle_seconds_count") >= 1
    assert value(placement, "trainyard_placement_decisions_total", decision="placed") >= 2
    assert "trainyard_launcher_watched_tasks" in scraped["launcher"]

    for instance, families in scraped.items():
        # Every process counts its HTTP answers (the scrapes above among them).
        assert (
            value(
                families,
                "trainyard_http_requests_total",
                route="/metrics",
                method="GET",
                code="200",
            )
            >= 1
        ), instance
        # (intake consumes what producers publish, not what comes through HTTP)
        if service_of(instance) not in ("gateway", "intake"):
            assert value(families, "trainyard_bus_messages_total", outcome="acked") >= 1, instance
    # The front door's own routes are counted by their template, not the path asked.
    gateway = scraped["gateway"]["trainyard_http_requests"].samples
    assert not any(jobs["succeeded"] in str(s.labels) for s in gateway)


def test_every_metric_the_dashboard_and_the_alerts_name_is_exported(
    platform: Platform, jobs: dict[str, str]
) -> None:
    exported = {family(name) for families in scrape(platform).values() for name in families}
    named = {
        family(name) for expr in queries() for name in re.findall(r"\btrainyard_[a-z_]+\b", expr)
    }
    assert named, "no query names a metric"
    assert named - exported == set()


@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (make setup installs Debian's package as root)",
)
def test_a_real_prometheus_scrapes_the_platform_and_evaluates_every_query(
    platform: Platform, jobs: dict[str, str], tmp_path: Path
) -> None:
    urls = {instance: platform.service_url(instance) for instance in platform.procs}
    prometheus = Prometheus(tmp_path / "prometheus", urls, interval_s=1).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            up = prometheus.query("up")["result"]
            finished = prometheus.query("sum(trainyard_jobs_finished_total)")["result"]
            if (len(up) == len(urls) and all(r["value"][1] == "1" for r in up) and finished) or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.5)
        assert sorted(r["metric"]["job"] for r in up) == sorted(service_of(i) for i in urls)
        assert all(r["value"][1] == "1" for r in up), up
        time.sleep(3)  # a few scrapes, so that rate() has two samples in its window
        results = {expr: prometheus.query(expr)["result"] for expr in queries()}
    finally:
        prometheus.stop()
    # Every query is valid PromQL (a bad one raises above); those for what these jobs
    # did have series.
    for expr in (
        "max by (state) (trainyard_jobs)",
        "sum by (dialect) (rate(trainyard_jobs_submitted_total[5m]))",
        "sum by (outcome) (rate(trainyard_jobs_finished_total[5m]))",
        "max by (queue) (trainyard_queue_waiting_jobs)",
        "sum by (decision) (rate(trainyard_placement_decisions_total[5m]))",
        "sum by (state, failure_class) (rate(trainyard_task_exits_total[5m]))",
        "max by (durable) (trainyard_bus_consumer_pending_messages)",
        "sum by (job, code) (rate(trainyard_http_requests_total[5m]))",
    ):
        assert results[expr], expr
    states = {
        r["metric"]["state"]: float(r["value"][1])
        for r in results["max by (state) (trainyard_jobs)"]
    }
    assert states["SUCCEEDED"] >= 1 and states["FAILED"] >= 1 and states["REJECTED"] >= 1
