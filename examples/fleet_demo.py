"""A fleet of three local clusters, step by step: member clusters join and leave through kubeconfig Secrets, a
per-cluster controller runs only where its CRD is installed, and a fleet controller reports across them all.

    python examples/fleet_demo.py                    # about 20 s; starts (and stops) three control planes
    python examples/fleet_demo.py --log-level INFO   # with the runtime's own log on stderr

``management`` holds the kubeconfig Secrets (namespace ``fleet-system``, label ``kube-syncer.io/kubeconfig=true``)
and the fleet report; ``east`` and ``west`` are the members. Wired in this process as ``syncer run`` wires them
with ``[clusters] enabled``: a ClusterRegistry, the per-cluster controller of ``examples/plugins/widget_status.py``
(ClusterControllers) and the fleet controller of ``examples/plugins/fleet_report.py`` (a FleetLoop).

  a. east joins (its Secret is created): its conditions, and widget-status waiting there for the Widget CRD;
  b. the Widget CRD in east only: widget-status runs in east, the report lists east; a Widget there is counted;
  c. west joins, then gets the CRD: the report lists both, west with no Widgets;
  d. east's Secret is rotated to another credential: the new connection comes up before the old one goes, so
     east never leaves the fleet, and a Widget created after the swap is reconciled through the new connection;
  e. west leaves (its Secret is deleted): the report lists east only.

Every step waits (bounded) for the state it describes; the script exits 1 naming the step that timed out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loguru import logger  # noqa: E402

from controllers.cluster_controllers import ClusterControllers  # noqa: E402
from controllers.cluster_registry import ClusterRegistry  # noqa: E402
from controllers.member import MemberOptions  # noqa: E402
from controllers.providers.secrets import SecretOptions, SecretProvider  # noqa: E402
from controllers.fleet import FleetLoop  # noqa: E402
from examples.plugins import fleet_report, widget_status  # noqa: E402
from examples.plugins.widget_status import WIDGETS  # noqa: E402
from informers import GVR, ApiClient, NotFound, ResourceClient  # noqa: E402
from syncer.logs import setup_logging  # noqa: E402
from syncer.testing import ControlPlane  # noqa: E402

NAMESPACE = "fleet-system"
SECRETS = GVR("", "v1", "secrets")
CONFIGMAPS = GVR("", "v1", "configmaps")
CRD = json.loads((Path(__file__).parent / "crds" / "widget.json").read_text())
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
STEP_TIMEOUT = 60.0
START = time.monotonic()


class StepFailed(Exception):
    """A step's state did not come about (in time)."""


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:6.1f}s] {text}", flush=True)


async def wait_for(what: str, check: Callable[[], Any | Awaitable[Any]], timeout: float = STEP_TIMEOUT) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise StepFailed(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.1)


def kubeconfig(cp: ControlPlane, token: str) -> bytes:
    """A member's kubeconfig as a Secret carries it: everything inline, a bearer token for credential."""
    ca = base64.b64encode(cp.ca_file.read_bytes()).decode()
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fleet",
        "clusters": [{"name": cp.name, "cluster": {"server": cp.url, "certificate-authority-data": ca}}],
        "users": [{"name": "fleet", "user": {"token": token}}],
        "contexts": [{"name": "fleet", "context": {"cluster": cp.name, "user": "fleet"}}],
    }).encode()


async def put_secret(api: ApiClient, cluster: str, data: bytes) -> None:
    body = {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": cluster, "namespace": NAMESPACE, "labels": {"kube-syncer.io/kubeconfig": "true"}},
            "data": {"kubeconfig": base64.b64encode(data).decode()}}
    await ResourceClient(api, SECRETS, namespaced=True).apply(body, field_manager="fleet-demo", force=True)


async def new_admin_token(api: ApiClient, account: str) -> str:
    """A token of a new ServiceAccount bound to cluster-admin: the credential east is rotated to."""
    await api.request("POST", "/api/v1/namespaces/default/serviceaccounts", body={"metadata": {"name": account}})
    await api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
        "metadata": {"name": f"{account}-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}]})
    review = await api.request("POST", f"/api/v1/namespaces/default/serviceaccounts/{account}/token",
                               body={"spec": {"expirationSeconds": 3600}})
    return str(review["status"]["token"])


async def create_widget(api: ApiClient, name: str, size: int) -> None:
    await api.request("POST", WIDGETS.path("default"), body={
        "apiVersion": "examples.kube-syncer.io/v1", "kind": "Widget", "metadata": {"name": name},
        "spec": {"size": size}})


async def widget_ready(api: ApiClient, name: str) -> str | None:
    """The message of the Widget's Ready condition once widget-status has reconciled it."""
    widget = await api.request("GET", WIDGETS.path("default", name))
    for condition in (widget.get("status") or {}).get("conditions") or []:
        if condition["type"] == "Ready" and condition["status"] == "True":
            return str(condition["message"])
    return None


class Fleet:
    """What ``syncer run`` starts in multi-cluster mode, for the demo's two plugins."""

    def __init__(self, management: ApiClient) -> None:
        self.management = management
        per_cluster = widget_status.syncer_controllers({})
        fleet = fleet_report.syncer_fleet_controllers({"namespace": NAMESPACE})
        required = {gvr for spec in per_cluster.values() for gvr in spec.required_gvrs}
        required |= {spec.gvr for spec in fleet.values()}
        secrets = SecretProvider(management, SecretOptions(namespaces=(NAMESPACE,)))
        self.registry = ClusterRegistry(management, [secrets], MemberOptions(probe_interval=2.0), required=required)
        self.controllers = ClusterControllers(per_cluster, name="demo")
        [(name, spec)] = fleet.items()
        self.loop = FleetLoop(name, spec, self.registry.clients, management=management)
        self._runner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.registry.register_cluster_handler(self.controllers)
        await self.registry.register_cluster_handler(self.loop)
        self._runner = asyncio.create_task(self.loop.run(), name="fleet loop")
        await self.registry.start()

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        stuck = await self.controllers.stop()
        await self.registry.stop()
        if stuck:
            raise RuntimeError(f"controllers did not stop: {', '.join(stuck)}")

    def member(self, cluster: str) -> dict[str, Any] | None:
        return next((m for m in self.registry.status()["clusters"] if m["name"] == cluster), None)

    def controller_state(self, cluster: str) -> str | None:
        """The state of widget-status in ``cluster`` (None: not running there at all)."""
        rows = self.controllers.status().get(cluster) or []
        return next((str(r["state"]) for r in rows if r["name"] == "widget-status"), None)

    async def report(self) -> dict[str, str] | None:
        try:
            cm = await self.management.request("GET", CONFIGMAPS.path(NAMESPACE, fleet_report.REPORT))
        except NotFound:
            return None
        return dict(cm.get("data") or {})

    async def report_is(self, expected: dict[str, str]) -> bool:
        return await self.report() == expected

    def show_member(self, cluster: str) -> None:
        m = self.member(cluster)
        if m is None:
            say(f"  {cluster}: not registered")
            return
        say(f"  {cluster}: state={m['state']} ready={m['ready']} attempts={m['attempts']} "
            f"rotating={m['rotation'] is not None} ({m['source']})")
        for c in m["conditions"]:
            say(f"    {c['type']:<10} {c['status']:<7} {c['reason']}{': ' + c['message'] if c['message'] else ''}")


async def demo(management: ControlPlane, east: ControlPlane, west: ControlPlane) -> None:
    async with ApiClient.from_kubeconfig(str(management.kubeconfig)) as mgmt, \
            ApiClient.from_kubeconfig(str(east.kubeconfig)) as east_api, \
            ApiClient.from_kubeconfig(str(west.kubeconfig)) as west_api:
        await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        fleet = Fleet(mgmt)
        await fleet.start()
        try:
            await steps(fleet, mgmt, east, east_api, west, west_api)
        finally:
            await fleet.stop()


async def steps(fleet: Fleet, mgmt: ApiClient, east: ControlPlane, east_api: ApiClient, west: ControlPlane,
                west_api: ApiClient) -> None:
    say("the fleet runs; no member cluster yet")
    say(f"  report: {await wait_for('the first report', fleet.report)}")

    say("(a) east joins: Secret fleet-system/east created on management")
    await put_secret(mgmt, "east", kubeconfig(east, east.admin_token))
    await wait_for("east to be ready", lambda: (fleet.member("east") or {}).get("ready"))
    fleet.show_member("east")
    await wait_for("widget-status to wait in east", lambda: fleet.controller_state("east") == "waiting")
    say("  widget-status in east: waiting (east does not serve Widgets)")

    say("(b) the Widget CRD installed in east only")
    await east_api.request("POST", CRD_PATH, body=CRD)
    await wait_for("widget-status to run in east", lambda: fleet.controller_state("east") == "running")
    await wait_for("the report to list east", lambda: fleet.report_is({"clusters": "east", "east": "0"}))
    say(f"  widget-status: east {fleet.controller_state('east')}; fleet loop's clusters: "
        f"{fleet.loop.union.clusters()}; report: {await fleet.report()}")
    await create_widget(east_api, "w1", 3)
    say("  widget default/w1 created in east")
    await wait_for("the report to count w1", lambda: fleet.report_is({"clusters": "east", "east": "1"}))
    say(f"  report: {await fleet.report()}")
    say(f"  w1 Ready in east: {await wait_for('widget-status to reconcile w1', lambda: widget_ready(east_api, 'w1'))}")

    say("(c) west joins: Secret fleet-system/west created")
    await put_secret(mgmt, "west", kubeconfig(west, west.admin_token))
    await wait_for("west to be ready", lambda: (fleet.member("west") or {}).get("ready"))
    fleet.show_member("west")
    await wait_for("widget-status to wait in west", lambda: fleet.controller_state("west") == "waiting")
    say(f"  widget-status: east {fleet.controller_state('east')}, west {fleet.controller_state('west')}; "
        f"report: {await fleet.report()}")
    say("  the Widget CRD installed in west")
    await west_api.request("POST", CRD_PATH, body=CRD)
    await wait_for("widget-status to run in west", lambda: fleet.controller_state("west") == "running")
    await wait_for("the report to list both",
                   lambda: fleet.report_is({"clusters": "east,west", "east": "1", "west": "0"}))
    say(f"  widget-status: east {fleet.controller_state('east')}, west {fleet.controller_state('west')}; "
        f"report: {await fleet.report()}")

    say("(d) east's Secret rotated to the token of a new ServiceAccount (cluster-admin)")
    token = await new_admin_token(east_api, "fleet-rotated")
    before = fleet.registry.cluster("east")
    # The fleet loop logs every cluster leaving it: one for east during the rotation would be a gap (the new
    # connection's informer joining in place of the old one is logged too, and is what should happen).
    changes: list[str] = []
    sink = logger.add(lambda m: changes.append(m.record["message"]), level="INFO",
                      filter=lambda r: r["message"].startswith("cluster east ") and "fleet controller" in r["message"])
    try:
        await put_secret(mgmt, "east", kubeconfig(east, token))
        await wait_for("east's new connection to take over", lambda: fleet.registry.cluster("east") is not before
                       and (fleet.member("east") or {}).get("rotation", 0) is None)
        await wait_for("widget-status to run on east's new connection",
                       lambda: fleet.controller_state("east") == "running")
        await asyncio.sleep(1.0)  # the old connection's teardown, had it taken east out of the fleet
    finally:
        logger.remove(sink)
    fleet.show_member("east")
    if any("leaves" in c for c in changes):
        raise StepFailed(f"east left the fleet loop during the rotation: {changes}")
    say(f"  fleet loop: {'; '.join(changes) or 'no change logged'}")
    say(f"  east stayed in the fleet throughout (union: {fleet.loop.union.clusters()}, "
        f"clusters up: {fleet.registry.list_clusters()})")
    await create_widget(east_api, "w2", 5)
    say("  widget default/w2 created in east")
    say(f"  w2 Ready in east: {await wait_for('widget-status to reconcile w2', lambda: widget_ready(east_api, 'w2'))}")
    await wait_for("the report to count w2",
                   lambda: fleet.report_is({"clusters": "east,west", "east": "2", "west": "0"}))
    say(f"  report: {await fleet.report()}")

    say("(e) west leaves: Secret fleet-system/west deleted")
    await mgmt.request("DELETE", SECRETS.path(NAMESPACE, "west"))
    await wait_for("west to leave", lambda: fleet.registry.list_clusters() == ["east"] and fleet.member("west") is None)
    await wait_for("the report to list east only", lambda: fleet.report_is({"clusters": "east", "east": "2"}))
    say(f"  clusters up: {fleet.registry.list_clusters()}; widget-status runs in: {sorted(fleet.controllers.status())}")
    say(f"  report: {await fleet.report()}")


def in_parallel(planes: list[ControlPlane], action: Callable[[ControlPlane], object]) -> None:
    """``action`` on every plane at once (each start or stop waits on its own processes); the first error."""
    with ThreadPoolExecutor(len(planes)) as pool:
        for future in [pool.submit(action, cp) for cp in planes]:
            future.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="WARNING", help="the runtime's log on stderr (default WARNING)")
    args = parser.parse_args()
    setup_logging(args.log_level)
    planes = [ControlPlane(name=name) for name in ("management", "east", "west")]
    try:
        say("starting three local control planes: management, east, west")
        in_parallel(planes, ControlPlane.start)
        for cp in planes:
            say(f"  {cp.name} at {cp.url}")
        asyncio.run(demo(*planes))
    except StepFailed as e:
        say(f"FAILED: {e}")
        return 1
    finally:
        in_parallel(planes, ControlPlane.stop)
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
