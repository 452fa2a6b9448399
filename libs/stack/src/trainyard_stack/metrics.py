"""Prometheus on this machine, scraping a running platform (``make metrics``): Debian's
``prometheus`` package (``make setup`` installs it as root), the alert rules of
deploy/prometheus/alerts.yml, and one scrape job per service whose targets are the
processes ``make up`` started (replicas included)."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .components import _LOCALHOST, ComponentError, _ManagedProcess, repo_root

RULES = Path("deploy") / "prometheus" / "alerts.yml"


def prometheus_binary() -> Path:
    found = shutil.which("prometheus")
    if found is None:
        raise ComponentError(
            "no prometheus binary: `make setup` as root installs Debian's package "
            "(apt-get install prometheus)"
        )
    return Path(found)


def prometheus_config(
    targets: Mapping[str, str], rules: Path, interval_s: float = 15.0
) -> dict[str, Any]:
    """Scrape jobs named after the services (``status-2``: a target of job ``status``),
    as deploy/prometheus/prometheus.yml names them. ``targets``: process -> base URL."""
    jobs: dict[str, list[str]] = {}
    for instance, url in sorted(targets.items()):
        service = instance.split("-", 1)[0]
        jobs.setdefault(service, []).append(url.removeprefix("http://").rstrip("/"))
    interval = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": service, "static_configs": [{"targets": hosts}]}
            for service, hosts in jobs.items()
        ],
    }


class Prometheus(_ManagedProcess):
    """A Prometheus server for ``targets`` (process -> base URL), its data in ``root``."""

    name = "prometheus"

    def __init__(
        self,
        root: Path,
        targets: Mapping[str, str],
        port: int | None = None,
        interval_s: float = 15.0,
        rules: Path | None = None,
    ) -> None:
        self.root = Path(root)
        super().__init__(port, self.root / "prometheus.log")
        self.targets = dict(targets)
        self.interval_s = interval_s
        self.rules = rules or repo_root() / RULES
        self._binary: Path | None = None

    @property
    def config_path(self) -> Path:
        return self.root / "prometheus.yml"

    def _prepare(self) -> None:
        self._binary = prometheus_binary()
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = prometheus_config(self.targets, self.rules.resolve(), self.interval_s)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _command(self) -> list[str]:
        assert self._binary is not None
        return [
            str(self._binary),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address={_LOCALHOST}:{self.port}",
            "--log.level=warn",
        ]

    def _url(self) -> str:
        return f"http://{_LOCALHOST}:{self.port}"

    def _is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self._url()}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query through the HTTP API: its ``data``, or ComponentError."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise ComponentError(f"{expr}: {exc.read().decode(errors='replace')}") from exc
        if body.get("status") != "success":
            raise ComponentError(f"{expr}: {body}")
        return dict(body["data"])
