"""TLS client contexts: one per distinct trust and credential set in the process, shared by every client that has it.

Making an ``ssl.SSLContext`` and loading a CA into it costs about as much CPU as the TLS handshake it is for
(OpenSSL 3 builds its providers and decoders per context): a fleet member's client made two (one to check its
kubeconfig's CA, one per dial), 0.27 ms each, ~6 % of the CPU of bringing a member up. client-go caches its TLS transports by
the same kind of key (``tlsCacheKey``: CA, client certificate and key, insecure flag, ...); here only the context is
shared, never a connection. Entries live while a client holds their context (weak values): a CA or credential set
that no client uses any more is not kept, and the key holds digests, not the key material.

A file (CA, client certificate, key) is keyed by its path and its ``stat`` (inode, size, modification time): a
file rewritten in place (a rotated CA, a renewed certificate) gives a new context on the next dial, as a fresh
context per dial did. A context returned here must not be changed: ALPN is part of the key and set here.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import weakref
from typing import Sequence

from .credentials import load_client_certificate

H2_ALPN = ("h2", "http/1.1")  # what an HTTP/2 client offers: the server may still choose HTTP/1.1

_contexts: weakref.WeakValueDictionary[tuple[object, ...], ssl.SSLContext] = weakref.WeakValueDictionary()


def client_context(*, cafile: str | None = None, cadata: str | None = None, client_cert: str | None = None,
                   cert_file: str | None = None, key_file: str | None = None, verify: bool = True,
                   alpn: Sequence[str] = ()) -> ssl.SSLContext:
    """The shared client context that trusts ``cafile`` and ``cadata`` (PEM; neither: the system's trust store),
    presents ``client_cert`` (certificate and key, PEM text) or else ``cert_file``/``key_file``, checks the
    server's certificate and name unless ``verify`` is False, and offers ``alpn``.

    Raise ``ssl.SSLError`` (or ``OSError`` for a file) as ``ssl.create_default_context`` and ``load_cert_chain``
    do when a CA or certificate is unusable; nothing is cached then.
    """
    key = (_file_key(cafile), _digest(cadata), _digest(client_cert), _file_key(cert_file), _file_key(key_file),
           verify, tuple(alpn))
    context = _contexts.get(key)
    if context is None:
        context = ssl.create_default_context(cafile=cafile or None, cadata=cadata)
        if client_cert is not None:
            load_client_certificate(context, client_cert)
        elif cert_file:
            context.load_cert_chain(cert_file, key_file)
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if alpn:
            context.set_alpn_protocols(list(alpn))
        _contexts[key] = context
    return context


def _digest(text: str | None) -> bytes | None:
    return hashlib.sha256(text.encode()).digest() if text is not None else None


def _file_key(path: str | None) -> tuple[str, int, int, int] | None:
    if not path:
        return None
    st = os.stat(path)
    return path, st.st_ino, st.st_size, st.st_mtime_ns
