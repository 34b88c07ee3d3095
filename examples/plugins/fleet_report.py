"""Example fleet plugin: a report, on the management cluster, of the Widgets in every member cluster.

With ``[clusters] enabled``, its one fleet controller, ``fleet-widgets``, sees the Widgets (``examples/crds/
widget.json``) of every member cluster that serves the Widget CRD, and keeps a ConfigMap named ``fleet-widgets``
on the management cluster saying which clusters those are and how many Widgets each has::

    data: {"clusters": "east,west", "east": "1", "west": "0"}

Settings (``[plugin_settings.fleet_report]``): ``namespace``, where the ConfigMap is (default ``default``).

What it shows:

- ``reconcile(cluster, request)`` and ``reconcile_deletion`` get one Widget of one cluster, but the report is
  about all of them: each recomputes it whole from the union's caches (``ctx.union.clusters()``,
  ``ctx.lister.list_for_cluster``), which costs no API call;
- the report is written with server-side apply, as field manager ``fleet-report``: a cluster that leaves is
  dropped from ``data`` just by not being in the applied object, with no read and no merge;
- a cluster joining or leaving the union sends no Widget event (a CRD installed with no Widgets, a kubeconfig
  Secret deleted), so the report also follows the union's membership (see ``follow_membership``).

Like every write of a fleet controller, the report goes through ``ctx.management``, which refuses writes once
this replica's leadership term is over.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from typing import Any

from controllers import Request
from controllers.fleet import FleetContext, FleetController
from informers import GVR, Backoff, ResourceClient

WIDGETS = GVR("examples.kube-syncer.io", "v1", "widgets")
CONFIGMAPS = GVR("", "v1", "configmaps")
REPORT = "fleet-widgets"
FIELD_MANAGER = "fleet-report"
MEMBERSHIP_POLL = 1.0

# The membership follower of each FleetLoop (its context), so that a reconciler created anew replaces it.
_followers: "weakref.WeakKeyDictionary[FleetContext, asyncio.Task[None]]" = weakref.WeakKeyDictionary()


class FleetReport:
    """The reconciler: every call rewrites the whole report, if it changed."""

    def __init__(self, ctx: FleetContext, namespace: str) -> None:
        if ctx.management is None:
            raise RuntimeError("fleet_report writes its report to the management cluster, and has no client for it")
        self.ctx = ctx
        self.namespace = namespace
        self.configmaps = ResourceClient(ctx.management, CONFIGMAPS, namespaced=True, field_manager=FIELD_MANAGER)
        # Workers and the membership follower write in turn, each from what it reads once it has the lock, so an
        # older report is never applied after a newer one.
        self._lock = asyncio.Lock()
        # Status writes of the per-cluster widget controller send Widget events too; most change no count, and
        # skipping those spares the management apiserver. The cost: a report deleted by hand comes back at the
        # next change (or the next term, which starts with nothing written).
        self._written: dict[str, str] | None = None

    def report(self) -> dict[str, str]:
        """The report as the caches have it now (one synchronous read: no cluster can leave halfway)."""
        clusters = self.ctx.union.clusters()
        counts = {_data_key(c): str(len(self.ctx.lister.list_for_cluster(c))) for c in clusters}
        return {"clusters": ",".join(counts), **counts}

    async def write(self) -> None:
        async with self._lock:
            data = self.report()
            if data == self._written:
                return
            await self.configmaps.apply({"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": REPORT, "namespace": self.namespace}, "data": data},
                                        force=True)
            self._written = data
            self.ctx.log.info("fleet report: {}", data)

    async def reconcile(self, cluster: str, request: Request) -> None:
        await self.write()

    async def reconcile_deletion(self, cluster: str, request: Request) -> None:
        await self.write()

    async def follow_membership(self) -> None:
        """Rewrite the report whenever the union's clusters change.

        Widget events cover counts, not membership. Requeueing Widget requests (``Result(requeue_after=...)``)
        would not do either: a cluster with no Widgets has no request to requeue, and a request of a cluster
        that left is dropped. Comparing a short list once a second costs next to nothing, and nothing is written
        unless the report changed."""
        seen: list[str] | None = None
        backoff = Backoff(initial=MEMBERSHIP_POLL, cap=30.0)
        while True:
            clusters = self.ctx.union.clusters()
            delay = MEMBERSHIP_POLL
            if clusters != seen:
                try:
                    await self.write()
                    seen = clusters
                    backoff.reset()
                except Exception as e:  # the management cluster unreachable, say: try again, more slowly
                    delay = backoff.next()
                    self.ctx.log.warning("fleet report not written ({}: {}); retrying in {:.1f}s",
                                         type(e).__name__, e, delay)
            await asyncio.sleep(delay)


def _data_key(cluster: str) -> str:
    """The cluster's name as a ConfigMap data key: a Secret's name already is one, but a name from an annotation
    need not be, nor is the local cluster's (empty)."""
    return re.sub(r"[^-._a-zA-Z0-9]", "", cluster) or "local"


def syncer_fleet_controllers(settings: dict[str, Any]) -> dict[str, FleetController]:
    """The plugin hook: one fleet controller over the Widgets of every member cluster."""
    namespace = settings.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"setting 'namespace' must be a namespace name, not {namespace!r}")

    def create(ctx: FleetContext) -> FleetReport:
        reconciler = FleetReport(ctx, namespace)
        # create() runs in the task of FleetLoop.run, which ends with the leadership term (or the loop's
        # shutdown): the follower ends with it, so a new term's reconciler never writes beside an old one. A
        # supervisor restarting a failed run does so in that same task, and calls create() again: hence the
        # previous follower of the loop is cancelled here.
        owner = asyncio.current_task()
        if owner is None:
            raise RuntimeError("fleet_report must be created by a running FleetLoop")
        previous = _followers.pop(ctx, None)
        if previous is not None:
            previous.cancel()
        follower = _followers[ctx] = asyncio.create_task(reconciler.follow_membership(),
                                                         name=f"{ctx.name} membership")
        owner.add_done_callback(lambda _: follower.cancel())
        return reconciler

    return {REPORT: FleetController(WIDGETS, create)}
