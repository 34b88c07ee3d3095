"""Kubernetes objects for the tests: CRDs (created through the official client or our ApiClient), the example Widget
CRD under a group of its own, object bodies."""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes

from informers import GVR, ApiClient, ApiError

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WIDGET_CRD = json.loads((Path(__file__).resolve().parents[1] / "examples" / "crds" / "widget.json").read_text())


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


def unique_group(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}.example.com"


async def post_crd(api: ApiClient, group: str, plural: str = "widgets", kind: str = "Widget",
                   **kw: Any) -> dict[str, Any]:
    """The CRD of ``crd_body`` created through our ApiClient (not waited for: the tests watch it appear)."""
    return await api.request("POST", CRD_PATH, body=crd_body(group, plural, kind, **kw))


async def delete_crd(api: ApiClient, name: str) -> None:
    await api.request("DELETE", f"{CRD_PATH}/{name}")


async def crd_gone(api: ApiClient, name: str) -> bool:
    try:
        await api.request("GET", f"{CRD_PATH}/{name}")
    except ApiError as e:
        return e.status == 404
    return False


async def new_object(api: ApiClient, gvr: GVR, name: str, namespace: str = "default") -> None:
    await api.request("POST", gvr.path(namespace), body={
        "apiVersion": f"{gvr.group}/{gvr.version}", "kind": "Widget", "metadata": {"name": name}})


def install_crd(admin: kubernetes.client.ApiClient, scope: str, kind: str, plural: str) -> GVR:
    """examples/crds/widget.json (schema, status subresource) under a group of its own, with the given scope;
    returns its GVR once the server serves it."""
    group = f"rc-{uuid.uuid4().hex[:6]}.example.com"
    body = copy.deepcopy(WIDGET_CRD)
    body["metadata"]["name"] = f"{plural}.{group}"
    body["spec"].update(group=group, scope=scope, names={
        "plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"})
    kubernetes.client.ApiextensionsV1Api(admin).create_custom_resource_definition(body)
    gvr = GVR(group, "v1", plural)
    custom = kubernetes.client.CustomObjectsApi(admin)
    deadline = time.monotonic() + 30
    while True:  # the REST handler of a new resource can lag its Established condition
        try:
            custom.list_cluster_custom_object(group, "v1", plural)
            return gvr
        except kubernetes.client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def widget(gvr: GVR, name: str, namespace: str | None = None, size: int = 1, kind: str = "Widget") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": gvr.group_version, "kind": kind, "metadata": meta, "spec": {"size": size}}


def configmap(name: str, namespace: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": data}
