"""A real Kubernetes control plane on this machine, for the tests and ``make kube-up``.

etcd (embedded), kube-apiserver, kube-controller-manager and kube-scheduler from the
project's own build of Kubernetes (``tools/kube``: one binary, each component its own
process), and KWOK for the nodes and the pods' lifecycles (no kubelet or container
runtime can run here, and no image can be pulled). DESIGN §7 has what this rests on.

The API server speaks HTTPS only, on 127.0.0.1, with a CA and serving certificate made
here, a token file whose one user is in ``system:masters``, RBAC, and service-account
keys. The controller manager is not optional: it makes each namespace's ``default``
service account (pods are refused without it), writes headless Services'
EndpointSlices and garbage-collects by owner references.

Nodes come from the project's cluster file (``NodeSpec``): each a ``v1/Node`` annotated
for KWOK with its CPUs, memory, ``nvidia.com/gpu`` and the GPU model label
``nvidia.com/gpu.product``. Pods bound to them (``spec.nodeName``) run until deleted,
unless annotated: ``kwok.trainyard.dev/run-duration`` (a Go duration such as ``1500ms``)
ends them then, ``Succeeded``, or ``Failed`` with ``kwok.trainyard.dev/exit-code``.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from trainyard_common.cluster import NodeSpec

from .components import ComponentError, free_port, repo_root

RUN_DURATION = "kwok.trainyard.dev/run-duration"
EXIT_CODE = "kwok.trainyard.dev/exit-code"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
KWOK_NODE = "kwok.x-k8s.io/node"


@functools.cache
def ensure_kube_binaries() -> Path:
    """Build (or reuse) trainyard-kube, kwok and helm; the directory holding them.
    ``TRAINYARD_KUBE_BIN_DIR`` names a directory with prebuilt ones instead."""
    if override := os.environ.get("TRAINYARD_KUBE_BIN_DIR"):
        return Path(override)
    script = repo_root() / "tools" / "kube" / "build.sh"
    if shutil.which("go") is None:
        raise ComponentError("the Go toolchain ('go') is needed to build tools/kube")
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=3600, check=False
    )
    if proc.returncode != 0:
        raise ComponentError(f"building the Kubernetes binaries failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- certificates


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


def make_pki(directory: Path) -> None:
    """A CA, the API server's serving certificate (for 127.0.0.1, localhost and the
    in-cluster names) and the service-account signing key pair."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard-kube-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    server_key = _key()
    names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
        *(
            x509.DNSName(n)
            for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        ),
    ]
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / "ca.crt", ca.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(directory / "ca.key", _pem_key(ca_key))
    _write(directory / "apiserver.crt", server.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(directory / "apiserver.key", _pem_key(server_key))
    sa_key = _key()
    _write(directory / "sa.key", _pem_key(sa_key))
    _write(
        directory / "sa.pub",
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )


# --------------------------------------------------------------------------- the stages

STAGES: list[dict[str, Any]] = [
    # From KWOK's stock stages (kustomize/stage/node/fast, node/heartbeat-with-lease,
    # pod/fast): nodes become Ready and keep a heartbeat; a bound pod becomes Running;
    # a deleted pod goes.
    {
        "name": "node-initialize",
        "resource": "Node",
        "match": [{"key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                   "operator": "NotIn", "values": ["True"]}],
        "template": "node",
    },
    {
        "name": "node-heartbeat",
        "resource": "Node",
        "match": [{"key": ".status.phase", "operator": "In", "values": ["Running"]},
                  {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                   "operator": "In", "values": ["True"]}],
        "delay": {"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000},
        "template": "node",
    },
    {
        "name": "pod-ready",
        "resource": "Pod",
        "match": [{"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                  {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                  {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                   "operator": "NotIn", "values": ["True"]}],
        "template": "running",
    },
    {
        "name": "pod-delete",
        "resource": "Pod",
        "match": [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
        "delete": True,
    },
    # Ours: a running pod ends when its run-duration annotation says, as its exit-code
    # annotation says (KWOK's own pod-complete only ends pods of a batch Job).
    *(
        {
            "name": name,
            "resource": "Pod",
            "match": [{"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                      {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                      {"key": f'.metadata.annotations["{RUN_DURATION}"]', "operator": "Exists"},
                      *exit_code],
            "duration_from": RUN_DURATION,
            "template": template,
        }
        for name, template, exit_code in (
            ("pod-complete", "succeeded",
             [{"key": f'.metadata.annotations["{EXIT_CODE}"]', "operator": "DoesNotExist"}]),
            ("pod-complete-zero", "succeeded",
             [{"key": f'.metadata.annotations["{EXIT_CODE}"]', "operator": "In", "values": ["0"]}]),
            ("pod-fail", "failed",
             [{"key": f'.metadata.annotations["{EXIT_CODE}"]', "operator": "Exists"},
              {"key": f'.metadata.annotations["{EXIT_CODE}"]', "operator": "NotIn",
               "values": ["0"]}]),
        )
    ),
]  # fmt: skip

_NODE_STATUS = """
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
allocatable:
{{ with .status.allocatable }}
{{ YAML . 1 }}
{{ end }}
capacity:
{{ with .status.capacity }}
{{ YAML . 1 }}
{{ end }}
nodeInfo:
  architecture: amd64
  containerRuntimeVersion: kwok
  kernelVersion: kwok
  kubeProxyVersion: kwok
  kubeletVersion: kwok
  operatingSystem: linux
phase: Running
"""

_POD_RUNNING = """
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _pod_ended(phase: str, exit_code: str, reason: str) -> str:
    return f"""
{{{{ $now := Now }}}}
{{{{ $annotations := or .metadata.annotations dict }}}}
conditions:
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: Ready
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: ContainersReady
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: {exit_code}
      finishedAt: {{{{ $now | Quote }}}}
      reason: {reason}
      startedAt: {{{{ $now | Quote }}}}
{{{{ end }}}}
phase: {phase}
"""


_TEMPLATES = {
    "node": _NODE_STATUS,
    "running": _POD_RUNNING,
    "succeeded": _pod_ended("Succeeded", "0", "Completed"),
    "failed": _pod_ended("Failed", f'{{{{ index $annotations "{EXIT_CODE}" }}}}', "Error"),
}


def stage_objects() -> list[dict[str, Any]]:
    """KWOK Stage objects for its ``--config``."""
    objects = []
    for stage in STAGES:
        spec: dict[str, Any] = {
            "resourceRef": {"apiGroup": "v1", "kind": stage["resource"]},
            "selector": {"matchExpressions": stage["match"]},
        }
        if "delay" in stage:
            spec["delay"] = stage["delay"]
        if "duration_from" in stage:
            expression = f'.metadata.annotations["{stage["duration_from"]}"]'
            spec["delay"] = {
                "durationMilliseconds": 1000,
                "durationFrom": {"expressionFrom": expression},
            }
        spec["next"] = (
            {"delete": True}
            if stage.get("delete")
            else {"statusTemplate": _TEMPLATES[stage["template"]]}
        )
        objects.append(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Stage",
                "metadata": {"name": stage["name"]},
                "spec": spec,
            }
        )
    return objects


# --------------------------------------------------------------------------- nodes


def node_object(node: NodeSpec) -> dict[str, Any]:
    """The ``v1/Node`` KWOK keeps for a node of the cluster file."""
    resources = {
        "cpu": f"{int(node.cpu * 1000)}m",
        "memory": f"{node.memory_mb}Mi",
        "pods": "110",
    }
    labels = {"kubernetes.io/hostname": node.name, "type": "kwok"}
    if node.gpus > 0:
        resources[GPU_RESOURCE] = str(node.gpus)
        if node.gpu_type:
            labels[GPU_PRODUCT_LABEL] = node.gpu_type
    labels.update({label.name: label.value for label in node.labels})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {KWOK_NODE: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


# --------------------------------------------------------------------------- the cluster


@dataclass
class _Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]


@dataclass
class KubeCluster:
    """The control plane and KWOK under ``directory``; ``start()``, ``stop()``."""

    directory: Path
    nodes: list[NodeSpec] = field(default_factory=list)
    port: int = 0
    token: str = ""
    _procs: list[_Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.directory / "pki" / "ca.crt"

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def binary(self, name: str) -> Path:
        return ensure_kube_binaries() / name

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary("trainyard-kube")), "kubectl", "--kubeconfig", str(self.kubeconfig),
             *args],
            capture_output=True, text=True, check=check, timeout=120,
        )  # fmt: skip

    # -- start / stop ----------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> Self:
        binaries = ensure_kube_binaries()
        kube = str(binaries / "trainyard-kube")
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        pki = self.directory / "pki"
        pki.mkdir(exist_ok=True)
        if not (pki / "ca.crt").exists():
            make_pki(pki)
        self.token = self._token(pki)
        self.port = free_port()
        etcd_port, peer_port = free_port(), free_port()
        self._spawn("etcd", [
            kube, "etcd", "--data-dir", str(self.directory / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        ])  # fmt: skip
        self._spawn("kube-apiserver", [
            kube, "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=0",
        ])  # fmt: skip
        self._write_kubeconfig()
        self._wait_ready(timeout)
        self._spawn("kube-controller-manager", [
            kube, "kube-controller-manager",
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=false",
            # Pods of a node that is gone are deleted soon (the launcher calls it node-lost).
            "--terminated-pod-gc-threshold=10000",
            "--profiling=false",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            kube, "kube-scheduler",
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false",
            "--profiling=false",
        ])  # fmt: skip
        stages = self.directory / "kwok-stages.yaml"
        stages.write_text(yaml.safe_dump_all(stage_objects()))
        self._spawn("kwok", [
            str(binaries / "kwok"),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE}=fake",
            "--node-ip=127.0.0.1",
            f"--node-port={free_port()}",
            f"--server-address=127.0.0.1:{free_port()}",
            "--cidr=10.244.0.1/16",
        ])  # fmt: skip
        self._wait_default_service_account(timeout)
        for node in self.nodes:
            self.add_node(node)
        self._write_state()
        return self

    def _token(self, pki: Path) -> str:
        path = pki / "tokens.csv"
        if path.exists():
            return path.read_text().split(",", 1)[0]
        token = secrets.token_urlsafe(32)
        _write(path, f'{token},trainyard-admin,trainyard-admin,"system:masters"\n'.encode())
        return token

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "trainyard", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "trainyard-admin", "user": {"token": self.token}}],
            "contexts": [{"name": "trainyard", "context": {
                "cluster": "trainyard", "user": "trainyard-admin", "namespace": "default"}}],
            "current-context": "trainyard",
        }  # fmt: skip
        _write(self.kubeconfig, yaml.safe_dump(config).encode())

    def _write_state(self) -> None:
        state = {"url": self.url, "pids": {p.name: p.proc.pid for p in self._procs}}
        _write(self.directory / "cluster.json", json.dumps(state, indent=1).encode())

    def _spawn(self, name: str, argv: list[str]) -> None:
        logs = self.directory / "logs"
        logs.mkdir(exist_ok=True)
        log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives with the child
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self._procs.append(_Proc(name, proc, log))

    def _check_alive(self) -> None:
        for p in self._procs:
            if p.proc.poll() is not None:
                tail = (self.directory / "logs" / f"{p.name}.log").read_text(errors="replace")
                raise ComponentError(f"{p.name} exited ({p.proc.returncode}):\n{tail[-3000:]}")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.client(timeout=2) as http:
            while True:
                self._check_alive()
                try:
                    if http.get("/readyz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise ComponentError(f"kube-apiserver not ready after {timeout:.0f}s")
                time.sleep(0.2)

    def _wait_default_service_account(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.client(timeout=5) as http:
            while True:
                self._check_alive()
                answer = http.get("/api/v1/namespaces/default/serviceaccounts/default")
                if answer.status_code == 200:
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise ComponentError("no default service account: the controller manager?")
                time.sleep(0.2)

    def add_node(self, node: NodeSpec) -> None:
        with self.client() as http:
            answer = http.post("/api/v1/nodes", json=node_object(node))
            if answer.status_code not in (200, 201, 409):
                raise ComponentError(f"node {node.name}: {answer.status_code} {answer.text}")

    def delete_node(self, name: str) -> None:
        with self.client() as http:
            http.delete(f"/api/v1/nodes/{name}")

    def stop(self, timeout: float = 15.0) -> None:
        """Every process gone, in the reverse order of their start."""
        for p in reversed(self._procs):
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in reversed(self._procs):
            try:
                p.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
            p.log.close()
        self._procs.clear()
        (self.directory / "cluster.json").unlink(missing_ok=True)

    @property
    def pids(self) -> list[int]:
        return [p.proc.pid for p in self._procs]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
