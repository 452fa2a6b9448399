"""deploy/: the Helm chart renders (helm from the project's build) into manifests the
test cluster's API server accepts (server-side dry run), with a Deployment and Service
per service on its real port and probes, the gateway wired to the others by their
Service names, and the launcher's RBAC; and the Dockerfile's install step, done as the
image does it, gives every service and the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from trainyard_launcher.adapters.kubernetes import KubeSettings
from trainyard_stack.kube import KubeCluster, ensure_kube_binaries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "trainyard"
PORTS = {"gateway": 8080, "intake": 8081, "status": 8082, "launcher": 8083,
         "validation": 8084, "placement": 8085}  # fmt: skip


def render(*flags: str) -> list[dict]:
    helm = ensure_kube_binaries() / "helm"
    out = subprocess.run(
        [str(helm), "template", "ty", str(CHART), "--namespace", "trainyard-system", *flags],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_chart_renders_every_service_wired_and_probed() -> None:
    docs = render(
        "--set", "tasks.allowedNamespaces={team-a,team-b}",
        "--set", "tasks.namespaceUsers[0].namespace=team-b",
        "--set", "tasks.namespaceUsers[0].users={bob}",
        "--set", "tasks.namespaceUsers[1].namespace=team-a",
        "--set", "tasks.namespaceUsers[1].users={alice,bob}",
        "--set", "tasks.hostPaths={/datasets,/scratch}",
    )  # fmt: skip
    by_kind: dict[str, dict[str, dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    for service, port in PORTS.items():
        deployment = by_kind["Deployment"][f"ty-{service}"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "-m", f"trainyard_{service}"]
        assert container["ports"] == [{"name": "http", "containerPort": port}]
        assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        env = {e["name"]: e for e in container["env"]}
        assert env[f"YARD_{service.upper()}_PORT"]["value"] == str(port)
        svc = by_kind["Service"][f"ty-{service}"]
        assert svc["spec"]["ports"][0]["port"] == port
        if service != "gateway":
            assert env["YARD_NATS_URL"]["valueFrom"]["secretKeyRef"]["key"] == service
    gateway = by_kind["Deployment"]["ty-gateway"]["spec"]["template"]["spec"]["containers"][0]
    urls = {e["name"]: e.get("value") for e in gateway["env"]}
    assert urls["YARD_INTAKE_URL"] == "http://ty-intake:8081"
    assert urls["YARD_PLACEMENT_URL"] == "http://ty-placement:8085"
    launcher = by_kind["Deployment"]["ty-launcher"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in launcher["containers"][0]["env"]}
    assert env["YARD_LAUNCHER"] == "kubernetes" and env["YARD_K8S_NAMESPACES"] == "team-a,team-b"
    # What the launcher reads (KubeSettings.from_env) from the chart's rendering.
    kept = KubeSettings.from_env({"YARD_K8S_NAMESPACE_USERS": env["YARD_K8S_NAMESPACE_USERS"]})
    assert kept.namespace_users == (
        ("team-b", frozenset({"bob"})), ("team-a", frozenset({"alice", "bob"})),
    )  # fmt: skip
    assert kept.home("bob") == "team-b"  # the order given, not the keys' sorted order
    rules = by_kind["ClusterRole"]["ty-launcher"]["rules"]
    assert {"pods", "pods/log", "pods/exec", "nodes"} <= {
        r for rule in rules for r in rule["resources"]
    }
    # What the launcher does with Secrets (an MPI attempt's keys, a command's line,
    # handed to its pod), verb by verb: the API server checks each exactly.
    # Never get (every Secret of the cluster) nor delete (the owner's end does).
    secrets = {v for rule in rules if "secrets" in rule["resources"] for v in rule["verbs"]}
    assert secrets == {"create", "patch"}
    # Intake checks each job against the cluster's runtime: the local one's checks (its
    # own pod the one node, no GPU) refused every GPU job on the chart.
    for service in PORTS:
        spec = by_kind["Deployment"][f"ty-{service}"]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert (env.get("YARD_LAUNCHER") == "kubernetes") is (service != "gateway"
                                                            and service != "status")  # fmt: skip
        assert ("YARD_CLUSTER" in env) is (service in ("placement", "validation"))
        # Whether pods may mount a node path: intake and validation refuse one where
        # they may not (it was accepted, and failed every pod at its start).
        assert (env.get("YARD_K8S_HOST_PATHS") == "/datasets,/scratch") is (
            service not in ("gateway", "status")
        )
        # Not the admin token in the internet-facing pod, which never uses it.
        assert ("YARD_TOKEN" in env) is (service != "gateway")
    # One placement replica: a follower answers 503, and its Service would send it half.
    assert by_kind["Deployment"]["ty-placement"]["spec"]["replicas"] == 1
    # Only the three that talk to the Kubernetes API get a token.
    for service in PORTS:
        spec = by_kind["Deployment"][f"ty-{service}"]["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is (
            service in ("launcher", "placement", "validation")
        )
    # The streams, made by the platform's identity before the services start: theirs
    # may only look at them (each service stopped at its first start).
    job = by_kind["Job"]["ty-streams"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    [maker] = job["spec"]["template"]["spec"]["containers"]
    assert maker["command"] == ["python", "-m", "trainyard_common.streams"]
    [url] = maker["env"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "trainyard-bus", "key": "platform"}
    assert {"ty-cluster"} <= set(by_kind["ConfigMap"])
    assert {"trainyard-admin-token", "trainyard-secrets-key"} <= set(by_kind["Secret"])


def test_the_nodes_paths_pods_may_mount_are_listed_never_any() -> None:
    # tasks.hostPaths=true let pods mount any path of their node: /, the kubelet's
    # directory (every pod's Secrets), the runtime's socket.
    def launcher_env(*flags: str) -> dict[str, str]:
        [launcher] = [d for d in render(*flags) if d["metadata"]["name"] == "ty-launcher"
                      and d["kind"] == "Deployment"]  # fmt: skip
        container = launcher["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert launcher_env()["YARD_K8S_HOST_PATHS"] == ""
    assert launcher_env("--set", "tasks.hostPaths=false")["YARD_K8S_HOST_PATHS"] == ""
    listed = launcher_env("--set", "tasks.hostPaths={/datasets,/scratch}")
    assert KubeSettings.from_env(listed).pods.host_paths == ("/datasets", "/scratch")
    refused = subprocess.run(
        [str(ensure_kube_binaries() / "helm"), "template", "ty", str(CHART),
         "--set", "tasks.hostPaths=true"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0 and "no longer taken" in refused.stderr, refused.stderr


def test_the_tasks_containers_are_restricted_but_mpis_sshd_can_start() -> None:
    # Only the pods' securityContext was set: what only a container has
    # (allowPrivilegeEscalation, capabilities) was the runtime's default.
    [launcher] = [d for d in render() if d["metadata"]["name"] == "ty-launcher"
                  and d["kind"] == "Deployment"]  # fmt: skip
    container = launcher["spec"]["template"]["spec"]["containers"][0]
    pods = KubeSettings.from_env({e["name"]: e.get("value") for e in container["env"]}).pods
    assert pods.security_context == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pods.container_security_context == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    # What sshd as root needs, measured (privilege separation, port 22), and no more.
    assert pods.mpi_container_security_context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"],
                         "add": ["NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT"]},
    }  # fmt: skip


INGRESS = ("--set", "gateway.ingress.enabled=true", "--set", "gateway.ingress.host=yard.example.com",
           "--set", "gateway.ingress.tlsSecret=yard-tls")  # fmt: skip


def test_the_gateway_may_be_behind_an_ingress_with_tls() -> None:
    # kubectl sends its token only over TLS: the chart's gateway had none (the docs
    # named "Helm's ingress", which the chart did not have).
    assert not [doc for doc in render() if doc["kind"] == "Ingress"]
    [ingress] = [doc for doc in render(*INGRESS) if doc["kind"] == "Ingress"]
    assert ingress["spec"]["tls"] == [{"hosts": ["yard.example.com"], "secretName": "yard-tls"}]
    [rule] = ingress["spec"]["rules"]
    [path] = rule["http"]["paths"]
    assert rule["host"] == "yard.example.com" and path["path"] == "/"
    assert path["backend"]["service"] == {"name": "ty-gateway", "port": {"name": "http"}}


def test_the_api_server_accepts_the_rendered_chart(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    kube_cluster.kubectl("create", "namespace", "trainyard-system", check=False)
    manifests = tmp_path / "trainyard.yaml"
    manifests.write_text(yaml.safe_dump_all(render(*INGRESS)))
    applied = kube_cluster.kubectl(
        "apply", "--dry-run=server", "--namespace", "trainyard-system", "-f", str(manifests),
        check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert len(lines) == len(render(*INGRESS)) and all("(server dry run)" in line for line in lines)


def test_the_image_install_gives_every_service_and_the_cli(tmp_path: Path) -> None:
    # The Dockerfile's build stage: the lock file's packages without the dev group,
    # the workspace copied in (not editable).
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(ROOT / name, source / name)
    for tree in ("libs", "services"):
        shutil.copytree(ROOT / tree, source / tree, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "image"), "UV_LINK_MODE": "copy"}
    # uv as the Makefile installs it (python3 -m uv), or one on PATH.
    uv = [found] if (found := shutil.which("uv")) else ["python3", "-m", "uv"]
    subprocess.run(
        [*uv, "sync", "--frozen", "--no-dev", "--no-editable", "--quiet"],
        cwd=source, env=env, check=True, timeout=600,
    )  # fmt: skip
    python = tmp_path / "image" / "bin" / "python"
    modules = ", ".join(f"trainyard_{s}" for s in PORTS)
    probe = subprocess.run(
        [str(python), "-c", f"import {modules}; import pytest"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    # Every service imports; the dev tools are not in the image.
    assert "No module named 'pytest'" in probe.stderr, probe.stderr
    assert "trainyard" not in probe.stderr.replace("No module named 'pytest'", "")
    cli = subprocess.run(
        [str(tmp_path / "image" / "bin" / "yard"), "--help"], capture_output=True, text=True
    )
    assert cli.returncode == 0 and "submit" in cli.stdout


def test_the_compose_file_seals_secrets_and_isolates_tasks() -> None:
    # Job secrets travelled and were stored in clear (no YARD_SECRETS_KEY), and the
    # launcher, not root, ran every task as itself (its own environment readable).
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "compose.yaml").read_text())
    for service in PORTS:
        env = compose["services"][service]["environment"]
        assert env["YARD_SECRETS_KEY"].startswith("${YARD_SECRETS_KEY:?"), service
    launcher = compose["services"]["launcher"]
    assert launcher["user"] == "0" and launcher["environment"]["YARD_TASK_ISOLATION"] == "on"
    assert "NOT hardened" in (ROOT / "deploy" / "compose" / "compose.yaml").read_text()
