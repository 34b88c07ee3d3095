"""Cluster providers in the sidecar, from the settings: kubeconfig files and Secrets at once, a cluster name both
give (the provider listed first holds it; the other claim is a reported conflict), and the name falling back to
the other provider when the first stops giving it; the management cluster's namespaces as members."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from controllers import ControllerContext, ManagedController
from informers import ApiClient
from syncer.plugins import Plugins
from syncer.runtime import Syncer
from controllers.providers.kubeconfig_files import KubeconfigFilesOptions
from controllers.providers.namespaces import HostNamespacesOptions
from syncer.settings import Clusters, Settings
from syncer.testing import ControlPlane

from tests.helpers import CONFIGMAPS, eventually, free_port

SECRETS = "/api/v1/namespaces/{}/secrets"


def idle_controller() -> ManagedController:
    def create(ctx: ControllerContext) -> Any:
        async def start(ctx: ControllerContext) -> None:
            await asyncio.Event().wait()
        return start
    return ManagedController([CONFIGMAPS], create)


def write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


async def test_files_and_secrets_at_once_the_first_listed_holds_a_name(
        control_plane: ControlPlane, member_plane: ControlPlane, api: ApiClient, namespace: str,
        tmp_path: Path) -> None:
    plane = json.loads(member_plane.kubeconfig.read_text())  # contexts admin and restricted, certificate inline
    admin = next(c for c in plane["contexts"] if c["name"] == "admin")
    path = tmp_path / "fleet.yaml"
    write(path, {**plane, "contexts": [{"name": "east", "context": admin["context"]}]})
    for name in ("east", "west"):
        await api.request("POST", SECRETS.format(namespace), body={
            "metadata": {"name": name, "labels": {"kube-syncer.io/kubeconfig": "true"}},
            "data": {"kubeconfig": base64.b64encode(member_plane.member_kubeconfig()).decode()}})
    settings = replace(Settings(), kubeconfig=str(control_plane.kubeconfig), include=("core/configmaps",),
                       http_bind=f"127.0.0.1:{free_port()}", shutdown_timeout=10.0,
                       clusters=Clusters(enabled=True, providers=("kubeconfig-files", "secrets"),
                                         namespaces=(namespace,), sync_timeout=20.0,
                                         kubeconfig_files=KubeconfigFilesOptions(paths=(str(path),),
                                                                                 reload_interval=0.1)))
    syncer = Syncer(settings, ApiClient.from_kubeconfig(str(control_plane.kubeconfig)),
                    Plugins({"idle": idle_controller()}), identity="providers")
    stop = asyncio.Event()
    run = asyncio.create_task(syncer.run(stop))

    def members() -> dict[str, dict[str, Any]]:
        return {m["name"]: m for m in syncer.status()["clusters"]["clusters"]}

    try:
        await eventually(lambda: run.done() or {n: m["ready"] for n, m in members().items()} ==
                         {"east": True, "west": True}, 60, "east and west ready")
        assert not run.done(), run
        assert members()["east"]["source"] == f"file {path} context east"
        assert members()["west"]["source"] == f"secret {namespace}/west"
        [conflict] = syncer.status()["clusters"]["conflicts"]
        assert conflict["claim"] == f"secret {namespace}/east" and conflict["cluster"] == "east"
        assert "listed before secrets" in conflict["message"]
        write(path, {**plane, "contexts": []})  # the file gives east no more: the Secret's claim takes over
        await eventually(lambda: members().get("east", {}).get("source") == f"secret {namespace}/east" and
                         members()["east"]["ready"], 60, "east to rotate to its Secret")
        assert syncer.status()["clusters"]["conflicts"] == []
        assert {"east", "west"} <= {row["name"].split(" (cluster ")[1].rstrip(")")
                                    for row in syncer.status()["controllers"] if row["state"] == "running"}
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


async def test_namespaces_of_the_management_cluster_as_members(control_plane: ControlPlane, api: ApiClient) -> None:
    tenant = uuid.uuid4().hex[:8]
    names = [f"tenant-{tenant}-{i}" for i in "ab"]
    for name in names:
        await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name, "labels": {"t": tenant}}})
    settings = replace(Settings(), kubeconfig=str(control_plane.kubeconfig), include=("core/configmaps",),
                       http_bind=f"127.0.0.1:{free_port()}", shutdown_timeout=10.0,
                       clusters=Clusters(enabled=True, providers=("host-namespaces",), sync_timeout=20.0,
                                         host_namespaces=HostNamespacesOptions(label_selector=f"t={tenant}")))
    syncer = Syncer(settings, ApiClient.from_kubeconfig(str(control_plane.kubeconfig)),
                    Plugins({"idle": idle_controller()}), identity="namespaces")
    stop = asyncio.Event()
    run = asyncio.create_task(syncer.run(stop))

    def members() -> dict[str, dict[str, Any]]:
        return {m["name"]: m for m in syncer.status()["clusters"]["clusters"]}

    try:
        await eventually(lambda: run.done() or {n: m["ready"] for n, m in members().items()} ==
                         {n: True for n in names}, 60, "both namespaces ready")
        assert not run.done(), run
        assert {n: m["source"] for n, m in members().items()} == {n: f"namespace {n}" for n in names}
        await eventually(lambda: set(names) <= {row["name"].split(" (cluster ")[1].rstrip(")")
                                                for row in syncer.status()["controllers"]
                                                if row["state"] == "running"}, 30, "the controller in each")
        await api.request("DELETE", f"/api/v1/namespaces/{names[1]}")
        await eventually(lambda: set(members()) == {names[0]}, 30, "the deleted namespace to leave")
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await api.request("DELETE", f"/api/v1/namespaces/{names[0]}")
