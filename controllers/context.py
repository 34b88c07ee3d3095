"""ControllerContext: what a managed controller is given, and what is cleaned up after it."""

from __future__ import annotations

from typing import Any

from loguru import logger

from informers import GVR, ApiClient, HandlerRegistration, InformerSource, SharedIndexInformer


class ControllerContext:
    """The synced informers of a controller's required GVRs, plus handler registration that is undone when the
    controller stops (so a stopped controller never leaves handlers on informers that survive it).

    ``client`` is the API client (to write objects), ``workers`` and ``resync_period`` the process defaults.
    """

    def __init__(self, name: str, informers: dict[GVR, SharedIndexInformer], source: InformerSource,
                 client: ApiClient | None = None, workers: int = 1, resync_period: float | None = None) -> None:
        self.name = name
        self.informers = informers
        self.source = source
        self.client = client
        self.workers = workers
        self.resync_period = resync_period
        self.log = logger.bind(controller=name)
        self._registrations: list[HandlerRegistration] = []

    def informer(self, gvr: GVR) -> SharedIndexInformer:
        """The informer of a required GVR (or any GVR the source has synced); KeyError names a missing one."""
        inf = self.informers.get(gvr) or self.source.informers()[0].get(gvr)
        if inf is None:
            raise KeyError(f"controller {self.name}: no synced informer for {gvr}")
        return inf

    def add_event_handler(self, informer: SharedIndexInformer | GVR, handler: Any,
                          resync_period: float | None = None) -> HandlerRegistration:
        """Register ``handler`` on an informer; it is removed automatically when the controller stops."""
        inf = informer if isinstance(informer, SharedIndexInformer) else self.informer(informer)
        own = getattr(handler, "name", "")
        reg = inf.add_event_handler(handler, resync_period if resync_period is not None else self.resync_period,
                                    name=self.name if own in ("", self.name) else f"{self.name}/{own}")
        self._registrations.append(reg)
        return reg

    @property
    def registrations(self) -> list[HandlerRegistration]:
        """Handler registrations made through this context and still in place."""
        return list(self._registrations)

    async def release(self) -> None:
        """Remove every handler registered through this context (idempotent)."""
        regs, self._registrations = self._registrations, []
        for reg in regs:
            await reg.informer.remove_event_handler(reg)
