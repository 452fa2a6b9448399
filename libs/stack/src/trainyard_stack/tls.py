"""The certificate the gateway's Kubernetes API is served with: a CA of the platform's
own (``<data>/tls/ca.crt``, what a kubeconfig trusts: ``yard kubeconfig``) and a server
certificate it signs for this machine's names. Made once, on the first start; a server
certificate near its end, or one without this host's names, is made again."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)


def _names() -> list[x509.GeneralName]:
    hosts = {"localhost", socket.gethostname()}
    found: list[x509.GeneralName] = [x509.DNSName(h) for h in sorted(hosts) if h]
    found += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    return found


def _ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > _now():
            return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _current(path: Path, ca: x509.Certificate) -> bool:
    """The server certificate is this CA's, good for a while, and names this host."""
    if not path.exists():
        return False
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    if cert.issuer != ca.subject or cert.not_valid_after_utc - _now() < RENEW_BEFORE:
        return False
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(names) == set(_names())


def ensure_tls(data_dir: Path) -> TlsFiles:
    directory = data_dir / "tls"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert, ca_key = _ca(directory)
    files = TlsFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    if _current(files.cert, ca_cert) and files.key.exists():
        return files
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainyard-gateway")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(_names()), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(files.key, key)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files
