"""Certificates for the TLS tests: a small CA issuing serving and client certificates, written as a cert-manager
Secret is mounted, and a client TLS context trusting it."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key: Any) -> bytes:
    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


@dataclass
class CA:
    """A CA that issues serving and client certificates."""

    key: Any
    cert: x509.Certificate

    @classmethod
    def new(cls, name: str = "test-ca") -> "CA":
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def issue(self, cn: str, server: bool = True) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for 127.0.0.1/localhost (server) or a client named ``cn``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return pem(builder.sign(self.key, hashes.SHA256())), pem_key(key)

    def write_secret(self, directory: Path, cn: str = "webhook") -> bytes:
        """Write tls.crt, tls.key and ca.crt as a mounted Secret has them; returns the certificate PEM."""
        cert, key = self.issue(cn)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tls.crt").write_bytes(cert)
        (directory / "tls.key").write_bytes(key)
        (directory / "ca.crt").write_bytes(pem(self.cert))
        return cert


def mount_secret(directory: Path, ca: CA, cn: str = "webhook") -> bytes:
    """Write tls.crt, tls.key and ca.crt as the kubelet updates a mounted Secret: into a new directory, then one
    atomic rename of the ``..data`` symlink that the files link through. Returns the certificate PEM."""
    cert, key = ca.issue(cn)
    directory.mkdir(parents=True, exist_ok=True)
    version = Path(tempfile.mkdtemp(prefix="..version-", dir=directory))
    for name, data in (("tls.crt", cert), ("tls.key", key), ("ca.crt", pem(ca.cert))):
        (version / name).write_bytes(data)
    (directory / "..data_tmp").symlink_to(version.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    return cert


def der_of(cert_pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)


def client_context(ca_pem: bytes, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


