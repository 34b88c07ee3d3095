"""informers.tls: one client context per distinct CA and credential set, shared while used, new when a file changes."""

from __future__ import annotations

import base64
import gc
import os
import ssl
import weakref
from pathlib import Path

import pytest

from informers import ApiClient, ClientConfig, client_from_untrusted_kubeconfig
from informers.tls import H2_ALPN, client_context
from tests.tls import CA, pem


def test_one_context_per_trust_and_credential_set() -> None:
    ca, other = pem(CA.new().cert).decode(), pem(CA.new("other").cert).decode()
    cert, key = CA.new().issue("me", server=False)
    context = client_context(cadata=ca, alpn=H2_ALPN)
    assert client_context(cadata=ca, alpn=H2_ALPN) is context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    different = [client_context(cadata=other, alpn=H2_ALPN), client_context(cadata=ca),
                 client_context(cadata=ca, alpn=H2_ALPN, verify=False),
                 client_context(cadata=ca, alpn=H2_ALPN, client_cert=(cert + key).decode())]
    assert len({id(c) for c in [context, *different]}) == 5
    assert different[2].verify_mode == ssl.CERT_NONE and not different[2].check_hostname
    assert len(different[3].get_ca_certs()) == 1


def test_a_context_no_client_uses_is_not_kept() -> None:
    ca = pem(CA.new().cert).decode()
    kept = client_context(cadata=ca)
    assert client_context(cadata=ca) is kept
    ref = weakref.ref(kept)
    del kept
    gc.collect()
    assert ref() is None


def test_a_rewritten_file_gives_a_new_context(tmp_path: Path) -> None:
    path = tmp_path / "ca.crt"
    path.write_bytes(pem(CA.new().cert))
    before = client_context(cafile=str(path))
    assert client_context(cafile=str(path)) is before
    path.write_bytes(pem(CA.new("rotated").cert) + b"\n")
    os.utime(path, ns=(0, 1))  # a different modification time even on a coarse clock
    after = client_context(cafile=str(path))
    assert after is not before
    assert after.get_ca_certs()[0]["subject"] == ((("commonName", "rotated"),),)


def test_an_unusable_ca_raises_and_is_not_cached() -> None:
    with pytest.raises(ssl.SSLError):
        client_context(cadata="-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


def test_clients_of_one_ca_share_the_context_of_their_dial() -> None:
    ca_data = base64.b64encode(pem(CA.new().cert)).decode()
    kubeconfig = f"""
apiVersion: v1
kind: Config
current-context: c
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:1", certificate-authority-data: "{ca_data}"}}}}]
users: [{{name: u, user: {{token: abc}}}}]
"""
    one, two = client_from_untrusted_kubeconfig(kubeconfig), client_from_untrusted_kubeconfig(kubeconfig)
    # The context checked when the kubeconfig was read is the one both clients dial with (HTTP/2: ALPN h2).
    assert one.tls_context() is two.tls_context()
    assert one._h2_context() is one.tls_context()
    plain = ApiClient(ClientConfig("http://127.0.0.1:1"))
    assert plain.tls_context() is None
