"""DynamicSharedInformerFactory: one shared informer per GVR, created on demand, stoppable one by one.

A ``MetadataGVR`` (``gvr.only_metadata()``) is a key of its own: its informer, next to the GVR's, caches only
metadata, under the GVR's options (field selector included)."""

from __future__ import annotations

import asyncio
from typing import Mapping

from prometheus_client import CollectorRegistry

from .client import ApiClient
from .gvr import GVR
from .lister import Lister
from .metrics import InformerMetrics
from .reflector import ReflectorOptions
from .shared_informer import SharedIndexInformer, Transform
from .store import IndexFunc
from .transforms import drop_managed_fields


class DynamicSharedInformerFactory:
    """Creates and owns informers for arbitrary GVRs, all sharing one client and the same options.

    ``namespace``/``label_selector``/``field_selector`` restrict every informer server-side, and
    ``field_selectors`` the informer of one GVR (instead of ``field_selector``: controller-runtime's per-object
    cache option, ``ByObject[...].Field``). ``indexers`` and
    ``transform`` apply to every informer created; the default transform drops ``metadata.managedFields``
    (pass ``transform=None`` to keep them). The informers' metrics go to ``metrics_registry`` labelled
    ``cluster=metrics_cluster`` (see ``InformerMetrics``).
    """

    def __init__(
        self, client: ApiClient, *, namespace: str | None = None, label_selector: str | None = None,
        field_selector: str | None = None, indexers: Mapping[str, IndexFunc] | None = None,
        transform: Transform | None = drop_managed_fields, options: ReflectorOptions | None = None,
        metrics_registry: CollectorRegistry | None = None, field_selectors: Mapping[GVR, str] | None = None,
        metrics_cluster: str = "",
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.field_selectors = dict(field_selectors or {})
        self.indexers = dict(indexers or {})
        self.transform = transform
        self.options = options or ReflectorOptions()
        self.metrics = InformerMetrics.for_registry(metrics_registry).for_cluster(metrics_cluster)
        self._informers: dict[GVR, SharedIndexInformer] = {}

    def for_resource(self, gvr: GVR) -> tuple[SharedIndexInformer, Lister]:
        """The informer and lister of ``gvr``, created (not started) on first use; the same ones afterwards."""
        inf = self._informers.get(gvr)
        if inf is None:
            inf = self._informers[gvr] = SharedIndexInformer(
                self.client, gvr, namespace=self.namespace, label_selector=self.label_selector,
                field_selector=self.field_selectors.get(gvr.full, self.field_selector), indexers=self.indexers,
                transform=self.transform,
                options=self.options, metrics=self.metrics,
            )
        return inf, inf.lister

    def informers(self) -> dict[GVR, SharedIndexInformer]:
        """Every informer the factory currently holds."""
        return dict(self._informers)

    def start(self) -> None:
        """Start every informer not started yet (needs a running event loop)."""
        for inf in self._informers.values():
            if not inf.started:
                inf.start()

    async def wait_for_cache_sync(self, timeout: float | None = None) -> dict[GVR, bool]:
        """Wait (at most ``timeout`` in all) for the started informers to sync; ``{gvr: synced}``."""
        started = {g: i for g, i in self._informers.items() if i.started}
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for i in started.values()))
        return dict(zip(started, results))

    async def stop_resource(self, gvr: GVR) -> None:
        """Stop and forget the informer of one GVR (its tasks, connection, handlers and cache)."""
        inf = self._informers.pop(gvr, None)
        if inf is not None:
            await inf.stop()

    async def shutdown(self) -> None:
        """Stop every informer and wait until all have stopped."""
        informers, self._informers = list(self._informers.values()), {}
        await asyncio.gather(*(i.stop() for i in informers))
