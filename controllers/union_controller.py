"""UnionController: keeps a UnionInformer in step with records, the objects of any informer (ARO-HCP's
``UnionKubeApplierInformersController``).

A record stands for one sub of the union, keyed ``key(record)``; ``factory(record)`` builds an unstarted informer
for it, or None for "not yet". Each key is looked up in the records' cache, never in an event's payload (a stale
payload could revive a record). Present with no sub, or a sub of another ``identity(record)``: a new sub joins and
starts, the one it replaces leaves first (the two never both deliver) and is stopped. Absent: the sub leaves and is
stopped. A sub is owned from the moment the factory returns it; two records with one key: the oldest holds it.
``ready()`` is the strict readiness gate. Differs from ARO-HCP: None or a failing factory is retried with backoff
(it waits for the next event) while an older sub keeps serving; a changed identity gets a new sub (it keeps the
first forever); on exit subs also leave the union (it leaves stopped ones in, still read by its lister).
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Awaitable, Callable, Hashable, Literal, Protocol

import orjson
from loguru import logger
from prometheus_client import CollectorRegistry

from informers import ClusterNotFound, FuncHandler, HandlerRegistration, SharedIndexInformer
from informers.store import Obj, last_state, object_key
from informers.union_informer import SubInformer, UnionInformer

from .context import ReconcileStats
from .keyed_loop import KeyedLoop
from .metrics import reconcile_metrics
from .ratelimiter import ItemExponentialFailureRateLimiter, RateLimiter
from .reconcile import Result
from .workqueue import WorkQueue


class ManagedSub(SubInformer, Protocol):
    """A sub whose lifecycle the controller owns (``SharedIndexInformer`` is one); a sub holding a client of its
    own (another cluster's) closes it in ``stop``."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


SubFactory = Callable[[Obj], ManagedSub | None | Awaitable[ManagedSub | None]]


def record_identity(record: Obj) -> Hashable:
    """The default identity of a record: its uid and what it says besides its metadata and status (a recreated
    record, or an edited spec or data, gets a new sub; a status write or a label does not)."""
    body = {k: v for k, v in record.items() if k not in ("metadata", "status")}
    return record["metadata"].get("uid"), orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class _Joined:
    sub: ManagedSub
    identity: Hashable


class UnionController:
    """Keeps ``union()`` in step with the records of ``records`` (an informer the caller starts and stops): one sub
    per record, named ``key(record)`` and built by ``factory(record)``, as the module docstring says.

    ``name`` names the union (its metrics), the work queue, the reconcile metrics (on ``metrics_registry``, the
    global one by default) and the log lines; ``stats`` counts the syncs (the context's ``reconcile_stats`` under a
    ControllerManager). ``rate_limiter`` paces a key's retries: by default 5 ms doubling up to 60 s, not client-go's
    1000 s, so that a record waiting on something else (a Secret not created yet) joins within a minute of it.
    A controller runs once.
    """

    def __init__(
        self, records: SharedIndexInformer, key: Callable[[Obj], str], factory: SubFactory, *,
        name: str = "union-controller", identity: Callable[[Obj], Hashable] = record_identity,
        rate_limiter: RateLimiter | None = None, metrics_registry: CollectorRegistry | None = None,
        stats: ReconcileStats | None = None,
    ) -> None:
        self.name = name
        self.stats = stats if stats is not None else ReconcileStats()
        self.queue: WorkQueue[str] = WorkQueue(name, rate_limiter or ItemExponentialFailureRateLimiter(0.005, 60.0),
                                               metrics_registry)
        self._records, self._key, self._factory, self._identity = records, key, factory, identity
        self._union = UnionInformer(name, metrics_registry=metrics_registry)
        self._metrics_registry = metrics_registry
        self._subs: dict[str, _Joined] = {}  # key -> the sub in the union, and the identity it was built for
        self._made: set[ManagedSub] = set()  # every sub handed over by the factory and not stopped yet
        self._waiting: set[str] = set()  # keys the factory said "not yet" to, since they last joined
        self._index = f"union-controller {name} {id(self):x}"  # on the records' cache, for as long as this runs
        self._indexed = False
        self._registration: HandlerRegistration | None = None
        self._state: Literal["new", "running", "stopped"] = "new"
        self._log = logger.bind(controller=name)

    def union(self) -> UnionInformer:
        """The union kept in step: register handlers on it and read its lister; it changes as records do."""
        return self._union

    def ready(self) -> bool:
        """True once the records informer has given this controller its initial records, and every record now in
        its cache has a synced sub built for the record as it is now (a factory still saying "not yet" blocks it)."""
        reg = self._registration
        if reg is None or not reg.has_synced():
            return False
        for key in {k for r in self._records.lister.list() if (k := self._key_of(r))}:
            joined, record = self._subs.get(key), self._record(key)
            if joined is None or record is None or joined.identity != self._identity(record) \
                    or not joined.sub.has_synced():
                return False
        return True

    async def run(self, workers: int = 1) -> None:
        """Keep the union in step with ``workers`` concurrent syncs (one per key at a time) until cancelled, then
        clean up as the module docstring says."""
        if self._state != "new":
            raise RuntimeError(f"{self.name} runs once: its queue is shut down for good when it stops")
        loop = KeyedLoop(self.name, self.queue, self._handle, workers=workers, stats=self.stats,
                         metrics=reconcile_metrics(self.name, self._metrics_registry), log=self._log,
                         action="sync of record {}")
        self._state = "running"
        try:
            self._ensure_index()
            self._registration = self._records.add_event_handler(FuncHandler(
                lambda obj, _initial: self._enqueue(obj), self._on_update,
                lambda obj: self._enqueue(last_state(obj))),
                name=self.name)
            await loop.run()
        finally:
            await loop.stop()  # its queue, when the loop never ran
            cleanup = asyncio.ensure_future(self._shutdown())
            try:
                await asyncio.shield(cleanup)
            except asyncio.CancelledError:  # cancelled again: the cleanup still ends before this does
                await cleanup
                raise

    async def sync_once(self, key: str) -> bool:
        """Bring the union in line with the record of ``key`` as the records' cache has it now; False when the
        factory has no sub for it yet (``run`` retries it with backoff). Raises what the factory or the union's
        handler installs raise, with the union as it was. (Called outside ``run``, it leaves this controller's index
        on the records' cache until a ``run`` ends.)"""
        if self._state == "stopped":
            raise RuntimeError(f"{self.name} has stopped")
        self._ensure_index()
        record = self._record(key, warn=True)
        if record is None:
            self._waiting.discard(key)
            await self._leave(key)
            return True
        identity = self._identity(record)
        joined = self._subs.get(key)
        if joined is not None and joined.identity == identity:
            return True
        made = self._factory(record)
        sub = await made if inspect.isawaitable(made) else made
        if sub is None:
            if key not in self._waiting:
                self._waiting.add(key)
                self._log.info("no informer for record {} yet; retrying with backoff", key)
            return False
        self._waiting.discard(key)
        if joined is not None and sub is joined.sub:  # the factory gave the same sub again
            self._subs[key] = _Joined(sub, identity)
            return True
        self._made.add(sub)
        try:
            await self._union.add(key, sub)
        except asyncio.CancelledError:
            if self._holds(key, sub):  # it joined, and the old one left: the exit stops both
                self._subs[key] = _Joined(sub, identity)
            raise
        except Exception:
            await self._stop(sub)
            raise
        self._subs[key] = _Joined(sub, identity)
        try:
            sub.start()
        except Exception:  # a factory that handed over a stopped informer, say: take it out, retry
            await self._leave(key)
            raise
        finally:
            if joined is not None:
                await self._stop(joined.sub)
        self._log.info("record {} joins the union" if joined is None else
                       "record {} changed; its new informer replaces the old one", key)
        return True

    # -- internals ---------------------------------------------------------------------------------------
    async def _handle(self, key: str) -> Result | None:
        return None if await self.sync_once(key) else Result(requeue=True)

    def _key_of(self, record: Obj, log: bool = False) -> str | None:
        """The record's key, or None (logged if ``log``) when the key function raises or gives no non-empty string:
        the index function calls it too, and must not raise into the records informer."""
        try:
            key = self._key(record)
        except Exception as e:
            key, problem = None, f"its key function raised {type(e).__name__}: {e}"
        else:
            problem = f"its key function gave {key!r}, not a non-empty string"
        if isinstance(key, str) and key:
            return key
        if log:
            self._log.warning("record {} is left out: {}", object_key(record), problem)
        return None

    def _enqueue(self, record: Obj) -> None:
        key = self._key_of(record, log=True)
        if key is not None:
            self.queue.add(key)

    def _on_update(self, old: Obj, new: Obj) -> None:
        self._enqueue(old)  # its key may have changed: the key it gave must learn that the record left it
        self._enqueue(new)

    def _ensure_index(self) -> None:
        if not self._indexed:
            self._records.add_indexers({self._index: lambda r: [k] if (k := self._key_of(r)) else []})
            self._indexed = True

    def _record(self, key: str, warn: bool = False) -> Obj | None:
        """The record holding ``key`` in the records' cache now: the oldest, when several give it."""
        found = self._records.lister.by_index(self._index, key)
        if len(found) <= 1:
            return found[0] if found else None
        found.sort(key=lambda r: (r["metadata"].get("creationTimestamp") or "", object_key(r)))
        if warn:
            self._log.warning("records {} all give key {}; the oldest, {}, holds it",
                              ", ".join(object_key(r) for r in found), key, object_key(found[0]))
        return found[0]

    def _holds(self, key: str, sub: ManagedSub) -> bool:
        try:
            return self._union.sub_lister(key)[1] is sub.lister
        except ClusterNotFound:
            return False

    async def _leave(self, key: str) -> None:
        joined = self._subs.pop(key, None)
        if joined is not None:
            await self._union.remove(key)
            await self._stop(joined.sub)
            self._log.info("record {} is gone; its informer left the union", key)

    async def _stop(self, sub: ManagedSub) -> None:
        await sub.stop()
        self._made.discard(sub)  # only once stopped: a stop cut short is done again on exit

    async def _shutdown(self) -> None:
        self._state = "stopped"
        if self._registration is not None:
            await self._records.remove_event_handler(self._registration)
            self._registration = None
        for key in self._union.clusters():
            await self._union.remove(key)
        self._subs.clear()
        for result in await asyncio.gather(*(self._stop(s) for s in list(self._made)), return_exceptions=True):
            if isinstance(result, Exception):
                self._log.opt(exception=result).error("stopping an informer failed")
        self._records.remove_indexers([self._index])
        self._indexed = False
