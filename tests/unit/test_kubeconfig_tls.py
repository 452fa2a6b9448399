"""The platform's CA and server certificate (made once, reused, made again when the
server's is near its end), and the kubeconfig `yard kubeconfig` writes from them."""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from trainyard_sdk.kubeconfig import KubeconfigError, kubeconfig, locate
from trainyard_stack import tls


def test_the_server_certificate_is_the_cas_and_names_this_host(tmp_path: Path) -> None:
    files = tls.ensure_tls(tmp_path)
    assert oct(os.stat(files.key).st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert any(str(ip) == "127.0.0.1" for ip in names.get_values_for_type(x509.IPAddress))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.cert, files.key)  # the key is the certificate's
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it


def test_made_once_and_made_again_only_near_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tls.ensure_tls(tmp_path)
    pem = first.cert.read_bytes()
    assert tls.ensure_tls(tmp_path).cert.read_bytes() == pem  # a restart keeps it
    ca = first.ca_cert.read_bytes()
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=tls.SERVER_DAYS - 10)
    monkeypatch.setattr(tls, "_now", lambda: later)
    renewed = tls.ensure_tls(tmp_path)
    assert renewed.cert.read_bytes() != pem and renewed.ca_cert.read_bytes() == ca


def test_a_kubeconfig_embeds_the_ca_and_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = tls.ensure_tls(tmp_path)
    config = kubeconfig("https://127.0.0.1:6443", files.ca_cert.read_bytes(), "tok", "ml")
    cluster = config["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == files.ca_cert.read_bytes()
    assert config["users"][0]["user"] == {"token": "tok"}
    assert config["contexts"][0]["context"]["namespace"] == "ml"
    # Found from the running platform's state file when not given.
    run = tmp_path / "run"
    run.mkdir()
    (run / "platform.json").write_text(
        json.dumps({"kubernetes": {"server": "https://127.0.0.1:7443", "ca": str(files.ca_cert)}})
    )
    monkeypatch.setenv("YARD_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("YARD_KUBE_URL", raising=False)
    monkeypatch.delenv("YARD_KUBE_CA", raising=False)
    assert locate(None, None)[0] == "https://127.0.0.1:7443"
    with pytest.raises(KubeconfigError, match="https"):
        locate("http://127.0.0.1:8080", None)
    with pytest.raises(KubeconfigError, match="cannot be read"):
        locate("https://x", str(tmp_path / "missing.crt"))
