"""The credentials of a local control plane: its CA and serving certificate, the service-account key pair, and
the kubeconfigs that reach it."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def make_pki(directory: Path) -> None:
    """Write ``ca.crt``, ``apiserver.crt``/``.key`` (for localhost and 127.0.0.1) and ``sa.key``/``.pub`` into
    ``directory``."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-syncer-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(_pem_cert(ca))
    (directory / "apiserver.crt").write_bytes(_pem_cert(serving))
    (directory / "apiserver.key").write_bytes(_pem_key(key))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(_pem_key(sa_key))
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )



def member_kubeconfig(ca_file: Path, server: str, user: dict[str, Any]) -> bytes:
    """A one-context kubeconfig for ``server`` with everything inline, as a kubeconfig Secret carries it."""
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }).encode()


def write_kubeconfig(path: Path, name: str, server: str, ca_file: Path, tokens: dict[str, str]) -> None:
    """Write a kubeconfig for cluster ``name`` at ``server``, with a context and user per ``tokens`` entry (name ->
    bearer token), the first one current; readable by its owner only."""
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}} for user, token in tokens.items()],
        "contexts": [{"name": user, "context": {"cluster": name, "user": user}} for user in tokens],
        "current-context": next(iter(tokens)),
    }
    # JSON is valid YAML, and the kubernetes client and kubectl both read it.
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
