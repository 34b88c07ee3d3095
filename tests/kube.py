"""Small helpers for tests: CRDs through the official client."""

from __future__ import annotations

import time
from typing import Any

import kubernetes


def crd_body(group: str, plural: str, kind: str, versions: tuple[str, ...] = ("v1",),
             scope: str = "Namespaced") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group, "scope": scope,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {"name": v, "served": True, "storage": i == 0,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                 "subresources": {"status": {}}}
                for i, v in enumerate(versions)
            ],
        },
    }


def create_crd(client: kubernetes.client.ApiClient, group: str, plural: str, kind: str, **kw: Any) -> None:
    kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(crd_body(group, plural, kind, **kw))


def wait_established(client: kubernetes.client.ApiClient, name: str, timeout: float = 30) -> None:
    api = kubernetes.client.ApiextensionsV1Api(client)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = api.read_custom_resource_definition(name)
        for c in (crd.status and crd.status.conditions) or []:
            if c.type == "Established" and c.status == "True":
                return
        time.sleep(0.05)
    raise TimeoutError(f"CRD {name} not Established after {timeout}s")
