"""ControllerContext: what a managed controller is given, and what is cleaned up after it; ReconcileContext: what
one reconcile is given.

controller-runtime hands a reconciler one manager-wide client that serves every type through its scheme. Objects
here are dicts and no scheme knows where they go, so a context makes a ``ResourceClient`` per GVR on demand
(sharing one ``RESTMapper`` for the scopes) over the context's API client, which is the fenced view when the
controller runs in a leadership term: every write of an ended term is refused, whichever client made it. The
ReconcileContext is made per request, so that its logger names the request and its ``client`` and ``lister()``
default to the controller's primary resource.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loguru import logger

from informers import GVR, ApiClient, HandlerRegistration, InformerSource, Lister, SharedIndexInformer
from informers.mapper import RESTMapper
from informers.resource import ResourceClient, WriteObserver

from .cluster import display_name
from .events import EventRecorder
from .fence import OPEN, Fence, fenced
from .read_your_writes import DEFAULT_READ_YOUR_WRITES
from .reconcile import Request

if TYPE_CHECKING:
    from loguru import Logger


@dataclass
class ReconcileStats:
    """What a controller reports about its reconciles (the Controller helper does it for every request), for
    the manager's status: how many finished, how many failed, and the last failure (text, wall-clock time)."""

    total: int = 0
    errors: int = 0
    last_error: str = ""
    last_error_at: float | None = None

    def record_success(self) -> None:
        """A reconcile finished without raising."""
        self.total += 1

    def record_error(self, error: BaseException) -> None:
        """A reconcile raised ``error``."""
        self.total += 1
        self.errors += 1
        self.last_error = f"{type(error).__name__}: {error}"
        self.last_error_at = time.time()


class ControllerContext:
    """The synced informers of a controller's required GVRs, and handler registration undone when the controller stops.

    ``client`` writes (refused with ``FenceError`` once ``fence``, the controller's term, no longer holds);
    ``reconcile_stats`` is shared by a managed controller's instances; ``cluster`` is the member (None in single-cluster
    mode); ``read_your_writes`` bounds the wait for a request's earlier writes (0: none). Without a ``source`` only
    ``informers`` can be looked up.
    """

    def __init__(self, name: str, informers: dict[GVR, SharedIndexInformer], source: InformerSource | None = None,
                 client: ApiClient | None = None, workers: int = 1, resync_period: float | None = None,
                 fence: Fence = OPEN, reconcile_stats: ReconcileStats | None = None,
                 cluster: str | None = None, priority_queue: bool = True,
                 read_your_writes: float = DEFAULT_READ_YOUR_WRITES) -> None:
        self.name = name
        self.cluster = cluster
        self.informers = informers
        self.source = source
        self.fence = fence
        self.client = fenced(client, fence) if client is not None else None
        self.workers = workers
        self.resync_period = resync_period
        self.priority_queue = priority_queue
        self.read_your_writes = read_your_writes
        self._write_observer: WriteObserver | None = None
        self.reconcile_stats = reconcile_stats if reconcile_stats is not None else ReconcileStats()
        self.log = logger.bind(controller=name) if cluster is None else \
            logger.bind(controller=name, cluster=display_name(cluster))
        self._registrations: list[HandlerRegistration] = []
        self._mapper: RESTMapper | None = None
        self._clients: dict[GVR, ResourceClient] = {}

    def informer(self, gvr: GVR) -> SharedIndexInformer:
        """The informer of a required GVR (or any GVR the source has synced); KeyError names a missing one."""
        inf = self.informers.get(gvr) or (self.source.informers()[0].get(gvr) if self.source is not None else None)
        if inf is None:
            # The metadata-only cache is another informer: requiring the GVR does not bring it.
            hint = " (require gvr.only_metadata() among the controller's GVRs)" if gvr.metadata_only else ""
            raise KeyError(f"controller {self.name}: no synced informer for {gvr}{hint}")
        return inf

    def require_client(self) -> ApiClient:
        """``client``, or a RuntimeError saying how to give the controller one."""
        if self.client is None:
            raise RuntimeError(f"controller {self.name} has no API client: pass client= to the ControllerManager "
                               "(the sidecar does)")
        return self.client

    @property
    def mapper(self) -> RESTMapper:
        """The RESTMapper of this controller instance (made on first use; it discovers on its first lookup)."""
        if self._mapper is None:
            self._mapper = RESTMapper(self.require_client())
        return self._mapper

    def resource_client(self, gvr: GVR) -> ResourceClient:
        """The ResourceClient of ``gvr`` over ``client`` (one per GVR; a ``MetadataGVR``'s is its GVR's), whose
        writes name the controller as their field manager unless a call names another."""
        gvr = gvr.full
        found = self._clients.get(gvr)
        if found is None:
            found = self._clients[gvr] = ResourceClient(self.require_client(), gvr, field_manager=self.name,
                                                        mapper=self.mapper, observer=self._write_observer)
        return found

    def observe_writes(self, observer: WriteObserver) -> None:
        """Have every ``resource_client`` (made already or later) tell ``observer`` of its writes."""
        self._write_observer = observer
        for client in self._clients.values():
            client.observer = observer

    def informers_of(self, gvr: GVR) -> list[SharedIndexInformer]:
        """The informers this controller may read ``gvr``'s objects from: its whole one and its metadata-only one,
        those it has."""
        found = []
        for key in (gvr.full, gvr.full.only_metadata()):
            try:
                found.append(self.informer(key))
            except KeyError:
                pass
        return found

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


class ReconcileContext:
    """What a reconcile gets besides its request: clients, listers, an event recorder and a logger.

    - ``client``: the ``ResourceClient`` of the controller's primary resource (the GVR given to ``for_``);
      ``clients(gvr)``: that of any other GVR. Both write through the controller's (fenced) API client and name
      the controller as field manager unless a call names another.
    - ``lister(gvr)``: the cache of a watched or required GVR (the primary resource's by default).
    - ``events``: the controller's ``EventRecorder`` (``rc.events.event(obj, "Normal", reason, action, note)``).
    - ``log``: a loguru logger bound to the controller and the request.
    - ``request`` and ``ctx`` (the ControllerContext).
    """

    __slots__ = ("request", "ctx", "gvr", "_events", "_log")

    def __init__(self, request: Request, ctx: ControllerContext, gvr: GVR | None,
                 events: EventRecorder | None) -> None:
        self.request = request
        self.ctx = ctx
        self.gvr = gvr
        self._events = events
        self._log: Logger | None = None

    @property
    def client(self) -> ResourceClient:
        """The ResourceClient of the primary resource."""
        return self.ctx.resource_client(self._primary())

    def clients(self, gvr: GVR) -> ResourceClient:
        """The ResourceClient of ``gvr``."""
        return self.ctx.resource_client(gvr)

    def lister(self, gvr: GVR | None = None) -> Lister:
        """The lister of ``gvr``'s informer (the primary resource's by default)."""
        return self.ctx.informer(gvr or self._primary()).lister

    @property
    def events(self) -> EventRecorder:
        """The controller's event recorder."""
        if self._events is None:
            raise RuntimeError(f"controller {self.ctx.name} records no events: it has no API client (pass client= "
                               "to the ControllerManager)")
        return self._events

    @property
    def log(self) -> Logger:
        """A logger bound to the controller and the request (bound on first use: most reconciles log nothing)."""
        if self._log is None:
            self._log = self.ctx.log.bind(request=self.request.key)
        return self._log

    def _primary(self) -> GVR:
        if self.gvr is None:
            raise RuntimeError(f"controller {self.ctx.name} has no primary resource: declare it with for_(gvr)")
        return self.gvr
