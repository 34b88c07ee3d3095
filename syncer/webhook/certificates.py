"""The webhook server's TLS identity: a certificate from files (hot-reloaded) or a self-signed one of our own.

Differs from controller-runtime's certwatcher and kopf:

- Files are polled by ``stat`` each second: a mounted Secret swaps a symlink, which inotify on the file misses.
- A reload builds a whole new ``SSLContext`` off the loop and swaps it in (Python has no ``GetCertificate``); a pair
  that does not load yet keeps the previous one serving. kopf restarts its listener instead.
- With ``stage_ca_changes``, a certificate from a new CA waits ``pending`` until ``promote``, while
  ``trusted_bundle`` holds both CAs: serving it before the API server trusts it fails new connections.
- The mutual-TLS client CA reloads with it; client certificates are optional in the handshake (see ``server.py``).
- Self-signed: our own CA (EC P-256) and a one-year serving certificate for ``hosts``, made at start.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from loguru import logger
from prometheus_client import Gauge

from informers.errors import describe_error

CERT_FILE, KEY_FILE, CA_FILE = "tls.crt", "tls.key", "ca.crt"  # the names cert-manager gives a Secret's keys
_SELF_SIGNED_DAYS = 365
_log = logger.bind(component="webhook certificates")
# What an alert on expiry needs (deploy/monitoring/alerts.yaml): cert-manager exports its Certificates' expiry, but
# not what this process actually serves (a renewed Secret not reloaded yet, a self-signed certificate, a CA older
# than the leaf). controller-runtime's certwatcher exports read counts only.
_EXPIRY = Gauge("syncer_webhook_certificate_expiry_timestamp_seconds",
                "When the API server stops trusting the served webhook certificate (Unix time): the earlier of its "
                "own and its CA's expiry.")


class CertificateError(Exception):
    """The certificate cannot be used; the message names the setting to fix."""


class _RotatingContext(ssl.SSLContext):
    """The listener's context: each new handshake uses ``current``, which a reload replaces."""

    current: ssl.SSLContext

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, server_side: bool = False,
                 server_hostname: str | bytes | None = None, session: ssl.SSLSession | None = None) -> ssl.SSLObject:
        return self.current.wrap_bio(incoming, outgoing, server_side, server_hostname, session)


@dataclass(frozen=True)
class _Loaded:
    context: ssl.SSLContext
    leaf: x509.Certificate
    ca_bundle: bytes | None

    def ca_not_after(self) -> str:
        """When the first CA of the bundle expires (ISO 8601; "" without a bundle): the API server stops trusting
        the serving certificate then, however long the certificate itself has left."""
        if not self.ca_bundle:
            return ""
        try:
            authorities = x509.load_pem_x509_certificates(self.ca_bundle)
        except ValueError:  # none in it
            return ""
        return min(a.not_valid_after_utc for a in authorities).isoformat()

    def expiry(self) -> float:
        """The earlier of the leaf's and its CA's expiry, as Unix time."""
        ca = self.ca_not_after()
        ends = [self.leaf.not_valid_after_utc] + ([datetime.datetime.fromisoformat(ca)] if ca else [])
        return min(ends).timestamp()


class ServingCertificates:
    """The server's certificate: from ``cert_dir`` (``tls.crt``, ``tls.key`` and, for the configurations'
    ``caBundle``, ``ca.crt``) or, when ``cert_dir`` is empty, self-signed for ``hosts``. ``client_ca_file``, if
    given, verifies client certificates. ``load()`` once, then ``reload()`` whenever convenient; with
    ``stage_ca_changes``, a certificate of another CA waits for ``promote()``."""

    def __init__(self, cert_dir: str, hosts: Sequence[str], client_ca_file: str = "",
                 stage_ca_changes: bool = False) -> None:
        self.cert_dir = cert_dir
        self.hosts = tuple(hosts)
        self.client_ca_file = client_ca_file
        self.stage_ca_changes = stage_ca_changes
        self.context = _RotatingContext(ssl.PROTOCOL_TLS_SERVER)
        self.reloads = 0
        self.last_error = ""
        self._loaded: _Loaded | None = None
        self._pending: _Loaded | None = None
        self._signature: tuple[Any, ...] | None = None
        self._scratch: str | None = None  # the self-signed PEM files (ssl loads certificates from files only)

    @property
    def source(self) -> str:
        """Where the certificate comes from."""
        return f"files in {self.cert_dir}" if self.cert_dir else "self-signed"

    @property
    def ca_bundle(self) -> bytes | None:
        """The PEM CA bundle that verifies the serving certificate (None: ``cert_dir`` has no ``ca.crt``)."""
        return self._current.ca_bundle

    @property
    def pending(self) -> object | None:
        """The certificate of a new CA loaded but not served yet (None: none); a token for ``promote``."""
        return self._pending

    @property
    def trusted_bundle(self) -> bytes | None:
        """The CA bundle the clients need now: the current CA and, while a certificate of a new one is pending,
        that one too (None: ``cert_dir`` has no ``ca.crt``)."""
        current = self._current.ca_bundle
        if self._pending is None or current is None or self._pending.ca_bundle is None:
            return current
        return current.rstrip(b"\n") + b"\n" + self._pending.ca_bundle

    def promote(self, pending: object) -> bool:
        """Serve the pending certificate if it is still ``pending`` (not replaced by a newer one meanwhile), once
        the clients trust ``trusted_bundle``; True if it was swapped in."""
        if not isinstance(pending, _Loaded) or pending is not self._pending:
            return False
        self._pending = None
        self._serve(pending)
        return True

    @property
    def leaf_der(self) -> bytes:
        """The serving certificate now in use, DER-encoded (to recognise it in a handshake)."""
        return self._current.leaf.public_bytes(serialization.Encoding.DER)

    @property
    def _current(self) -> _Loaded:
        if self._loaded is None:
            raise RuntimeError("certificates not loaded yet")
        return self._loaded

    async def load(self) -> None:
        """Load or generate the certificate (CertificateError naming the setting if it cannot be used)."""
        if self.cert_dir:
            signature = self._files_signature()
            try:
                loaded = await asyncio.to_thread(self._load_files)
            except (OSError, ssl.SSLError, ValueError) as e:
                raise CertificateError(f"setting 'webhooks.cert_dir': cannot load {CERT_FILE}/{KEY_FILE} from "
                                       f"{self.cert_dir}: {_reason(e)}") from None
        else:
            self._scratch = tempfile.mkdtemp(prefix="kube-syncer-webhook-")
            signature = None
            try:
                loaded = await asyncio.to_thread(self._self_signed, self._scratch)
            except ValueError as e:
                raise CertificateError(f"setting 'webhooks.hosts': {e}") from None
            except (OSError, ssl.SSLError) as e:  # only the client CA file can be wrong here
                raise CertificateError(f"setting 'webhooks.client_ca_file': cannot load {self.client_ca_file}: "
                                       f"{_reason(e)}") from None
        self._signature = signature
        self._swap(loaded)

    async def reload(self) -> bool:
        """Load the files' certificate if any of them changed since the last load, and swap it in (or, of a new CA
        with ``stage_ca_changes``, keep it ``pending``); True if one was loaded.

        A pair that does not load (e.g. the certificate written and the key not yet) keeps the current one in
        use and is tried again at the next call; ``last_error`` says why meanwhile."""
        if not self.cert_dir:
            return False
        signature = self._files_signature()
        if signature == self._signature:
            return False
        try:
            loaded = await asyncio.to_thread(self._load_files)
        except (OSError, ssl.SSLError, ValueError) as e:
            error = f"cannot reload the certificate from {self.cert_dir}: {_reason(e)}; still serving the previous one"
            if error != self.last_error:
                _log.warning(error)
            self.last_error = error
            return False
        self._signature, self.last_error = signature, ""
        if self.stage_ca_changes and loaded.ca_bundle is not None and \
                self._current.ca_bundle not in (None, loaded.ca_bundle):
            self._pending = loaded
            _log.info("loaded a serving certificate of a new CA from {}: serving the previous one until the API "
                      "server trusts both CAs", self.cert_dir)
        else:
            self._pending = None
            self._serve(loaded)
        return True

    def status(self) -> dict[str, Any]:
        """Source, expiry (the certificate's and its CA's), reload count and last reload error."""
        leaf = self._loaded.leaf if self._loaded else None
        return {"source": self.source, "subject": leaf.subject.rfc4514_string() if leaf else "",
                "not_after": leaf.not_valid_after_utc.isoformat() if leaf else "",
                "ca_not_after": self._loaded.ca_not_after() if self._loaded else "", "reloads": self.reloads,
                "client_certificates": "verified" if self.client_ca_file else "not required",
                "rotation": "pending: a certificate of a new CA waits until the API server trusts both CAs"
                if self._pending else "", "last_error": self.last_error}

    def close(self) -> None:
        """Remove the self-signed files."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    # -- helpers ------------------------------------------------------------------------------------------
    def _swap(self, loaded: _Loaded) -> None:
        """New handshakes get ``loaded``."""
        self._loaded = loaded
        self.context.current = loaded.context
        _EXPIRY.set(loaded.expiry())

    def _serve(self, loaded: _Loaded) -> None:
        """Swap a reloaded certificate in."""
        self._swap(loaded)
        self.reloads += 1
        _log.info("reloaded the serving certificate from {} (expires {})", self.cert_dir,
                  loaded.leaf.not_valid_after_utc.isoformat())

    def _files_signature(self) -> tuple[Any, ...]:
        """What changes when any file changes, including a Secret's symlink swap (a new inode)."""
        paths = [Path(self.cert_dir, n) for n in (CERT_FILE, KEY_FILE, CA_FILE)]
        if self.client_ca_file:
            paths.append(Path(self.client_ca_file))
        out: list[tuple[int, int, int] | None] = []
        for p in paths:
            try:
                st = p.stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def _load_files(self) -> _Loaded:
        """(In a thread.) A context from the files; raises if they are missing, unreadable or do not match (with
        ``stage_ca_changes``, also if ``ca.crt`` does not verify ``tls.crt``: files written one after the other)."""
        cert, key, ca = (Path(self.cert_dir, n) for n in (CERT_FILE, KEY_FILE, CA_FILE))
        context = self._context(cert, key)
        chain = x509.load_pem_x509_certificates(cert.read_bytes())
        bundle = ca.read_bytes() if ca.is_file() else None
        if self.stage_ca_changes and bundle is not None:
            _check_issued(chain[-1], x509.load_pem_x509_certificates(bundle))
        return _Loaded(context, chain[0], bundle)

    def _self_signed(self, directory: str) -> _Loaded:
        """(In a thread: key generation and signing are CPU work.) Our CA and a serving certificate it signed."""
        names: list[x509.GeneralName] = []
        for host in self.hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        if not names:
            raise ValueError("a self-signed certificate needs at least one host name or IP address")
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=_SELF_SIGNED_DAYS)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-syncer webhook CA")])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-syncer webhook")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        cert_path, key_path = Path(directory, CERT_FILE), Path(directory, KEY_FILE)
        cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        key_path.touch(mode=0o600)
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return _Loaded(self._context(cert_path, key_path), leaf, ca.public_bytes(serialization.Encoding.PEM))

    def _context(self, cert: Path, key: Path) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, key)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
        return context


def _check_issued(top: x509.Certificate, authorities: list[x509.Certificate]) -> None:
    """Raise ValueError unless the top of the chain is one of ``authorities`` or signed by one of them."""
    for authority in authorities:
        if top == authority:
            return
        try:
            top.verify_directly_issued_by(authority)
            return
        except (ValueError, TypeError, InvalidSignature):
            continue
    raise ValueError(f"{CERT_FILE} is not issued by a certificate of {CA_FILE}")


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return describe_error(e)

