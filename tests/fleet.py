"""Member clusters for the multi-cluster tests: kubeconfig Secrets on the management plane (the registry's source
of members), a registry's options over them, and what its status says of one member."""

from __future__ import annotations

import base64
import time
from typing import Any

from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions
from controllers.provider import ClusterProvider
from controllers.providers.secrets import SecretOptions, SecretProvider
from informers import GVR, ApiClient
from syncer.testing import ControlPlane

SECRETS = GVR("", "v1", "secrets")
LABELS = {"kube-syncer.io/kubeconfig": "true"}


def kubeconfig(cp: ControlPlane, token: str | None = None, server: str | None = None,
               user: dict[str, Any] | None = None) -> bytes:
    return cp.member_kubeconfig(token, server, user)


async def put_secret(api: ApiClient, namespace: str, name: str, data: bytes, annotations: dict[str, str] | None = None,
                     labels: dict[str, str] | None = None) -> None:
    body = {"metadata": {"name": name, "labels": labels or LABELS, "annotations": annotations or {}},
            "data": {"kubeconfig": base64.b64encode(data).decode()}}
    try:
        await api.request("POST", SECRETS.path(namespace), body=body)
    except Exception:
        await api.request("PUT", SECRETS.path(namespace, name), body=body)


async def delete_secret(api: ApiClient, namespace: str, name: str) -> None:
    await api.request("DELETE", SECRETS.path(namespace, name))


def secrets(api: ApiClient, *namespaces: str) -> list[ClusterProvider]:
    """The kubeconfig-Secret provider over ``namespaces``."""
    return [SecretProvider(api, SecretOptions(namespaces=namespaces))]


def options(api: ApiClient, ns: str, **kw: Any) -> tuple[list[ClusterProvider], MemberOptions]:
    """The providers and member options of a registry over the Secrets of ``ns``."""
    return secrets(api, ns), MemberOptions(sync_timeout=kw.pop("sync_timeout", 20.0),
                                           probe_interval=kw.pop("probe_interval", 0.5), **kw)


def member(registry: ClusterRegistry, name: str) -> dict[str, Any] | None:
    return next((c for c in registry.status()["clusters"] if c["name"] == name), None)


async def created(api: ApiClient, namespace: str, name: str) -> str:
    secret = await api.request("GET", SECRETS.path(namespace, name))
    return str(secret["metadata"]["creationTimestamp"])


def past(timestamp: str) -> bool:
    """Whether the clock has left the second of ``timestamp`` (an object created now is younger)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) > timestamp
