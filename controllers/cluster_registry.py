"""ClusterRegistry: the fleet's members, from kubeconfig Secrets on the management cluster (skv2's ClusterWatcher
and ManagerSet, multicluster-runtime's kubeconfig provider).

Secrets are selected by label (``kube-syncer.io/kubeconfig=true`` and multicluster-runtime's label by default) or by
type (skv2's ``solo.io/kubeconfig``), in the configured namespaces; the kubeconfig is under data key
``kubeconfig``; the cluster is named after the Secret, or its ``kube-syncer.io/cluster-name`` annotation. Each
member gets its own API client, its own discovering informer factory (so what runs in a cluster follows what that
cluster serves) and, through the cluster handlers, its own controllers.

Differences from the anchors, and why:

- One task per member brings it up (connect, discover, sync) and retries it with backoff. skv2 and
  multicluster-runtime do this in the watcher's worker, so one unreachable cluster delays every other; here a
  cluster that does not sync within ``sync_timeout`` is engaged anyway (its condition says what is missing: its
  other controllers need not wait for one forbidden or broken API), and no member ever blocks the registry.
- Every removal is guarded by identity: a member is only dropped if it is still the one registered under its name,
  and deleting a Secret cancels its member in whatever phase it is (connecting, retrying, syncing, running). skv2
  deletes "the cluster named X" when an old start fails, which can remove its replacement, and keeps retrying a
  cluster whose Secret is gone.
- A changed kubeconfig (rotated credentials, a new endpoint) brings a second connection up and synced first; only
  then are the handlers told (``add_cluster`` again, same name), and the old connection is stopped after. An
  identical one (by hash) changes nothing. skv2 tears the cluster down first, leaving a gap in reconciling.
- Two Secrets naming the same cluster: the oldest (``creationTimestamp``, then namespace/name) holds it, the
  others are reported as conflicts (status, log); nothing is merged or silently overwritten. skv2 keeps whichever
  event came first, so which cluster a name means depends on process history: after a restart, a failover or a
  handover of the cluster to another replica, list order decides, and the name can silently point at another
  cluster. Here every replica and every restart computes the same holder from the Secrets alone; when the
  holder changes (it goes, or an older Secret starts naming the cluster) that is a rotation to its kubeconfig.
  Secrets are processed only once their informers have listed (or ``sync_timeout`` passed), so a restart does
  not first connect to the cluster of a Secret that an older one, listed a moment later, overrules.
- The kubeconfig is untrusted input (``informers.untrusted_kubeconfig``): exec plugins only from an allow-list,
  no auth providers, no file paths, and never logged. A refused or malformed one is the member's condition, not
  a crash, and is not retried until the Secret changes.
- Conditions (Connected, Discovered, Synced, each with the last error) per member, in ``status()`` and as the
  metric ``syncer_cluster_condition{cluster,condition}``. Once a member is engaged they follow its informers:
  Connected turns false as soon as a watch fails to reach the server and true as soon as the watches work again
  (the ``/version`` probe only decides for a member whose watches say nothing), and ``state`` is ``ready`` exactly
  while every condition holds (``degraded`` when one does not).
- No polling per member at steady state: the watches are the liveness signal. A member is asked ``/version``
  only after its watches said nothing (no event, bookmark or answer) for ``probe_interval``, above the
  bookmark cadence and the watches' inactivity timeout by default, so only a member without a working watch
  is ever asked (and one whose probe failed, until it answers). A cut connection shows as a watch failing to
  reconnect; a silently dead one, once the watch's inactivity timeout reopens it.
- The members' informer metrics are on the registry's ``metrics_registry``, labelled ``cluster`` with the
  member's name (``""`` for the local one, as the sidecar's own informers), and leave with the member.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import re
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Sequence

from loguru import logger
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from informers import (
    GVR, ApiClient, Backoff, DiscoveringDynamicSharedInformerFactory, FuncHandler, ResourceClient,
    SharedIndexInformer, Supervisor, drop_managed_fields, object_key,
)
from informers.errors import describe_error
from informers.metrics import MetricSet
from informers.request_metrics import NO_ANSWER
from informers.store import DeletedFinalStateUnknown, Obj
from informers.union_lister import ClusterNotFound
from informers.untrusted_kubeconfig import KubeconfigError, KubeconfigInvalid, client_from_untrusted_kubeconfig, \
    kubeconfig_hash
from informers.wait import wait_first

from .cluster import (
    LOCAL_CLUSTER, Cluster, ClusterContext, ClusterHandler, ClusterRemovedHandler, Condition, ConditionType,
    NamedLocks, display_name, finish,
)
from .fence import CLOSED, OPEN, Fence, fenced
from .workqueue import QueueShutDown, WorkQueue

SECRETS = GVR("", "v1", "secrets")
_BY_CLUSTER = "cluster-name"  # the index of the Secret informers: the cluster name a Secret gives
DEFAULT_LABEL_SELECTORS = ("kube-syncer.io/kubeconfig=true", "sigs.k8s.io/multicluster-runtime-kubeconfig=true")
DEFAULT_SECRET_TYPES = ("solo.io/kubeconfig",)
NAME_ANNOTATION = "kube-syncer.io/cluster-name"
# A Secret's own name always is one; an annotation must be too (names are compared exactly, as Kubernetes does).
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

FactoryMaker = Callable[[ApiClient, str], DiscoveringDynamicSharedInformerFactory]
# Sharding: the fence under which this replica may run a cluster now, or None when another replica should.
Gate = Callable[[str], Fence | None]


@dataclass(frozen=True)
class RegistryOptions:
    """Where the kubeconfig Secrets are and how members are brought up (``namespaces`` empty: all);
    ``probe_interval``: how long a member's watches may say nothing before ``/version`` is asked."""

    namespaces: Sequence[str] = ()
    label_selectors: Sequence[str] = DEFAULT_LABEL_SELECTORS
    secret_types: Sequence[str] = DEFAULT_SECRET_TYPES
    data_key: str = "kubeconfig"
    name_annotation: str = NAME_ANNOTATION
    include_local: bool = False
    allowed_exec_commands: Sequence[str] = ()
    sync_timeout: float = 30.0
    connect_timeout: float = 10.0
    probe_interval: float = 300.0
    cleanup_timeout: float = 30.0


class MemberState(enum.StrEnum):
    """Where a member is in its life."""

    CONNECTING = "connecting"
    DISCOVERING = "discovering"
    SYNCING = "syncing"
    READY = "ready"
    DEGRADED = "degraded"  # engaged (its controllers run), but a condition is false: unreachable, not synced
    RETRYING = "retrying"
    REFUSED = "refused"
    STOPPING = "stopping"


class _Member:
    """One registration of a cluster: a Secret's kubeconfig (by hash) and the task that keeps it."""

    def __init__(self, name: str, source: str, data: bytes | None, replaces: "_Member | None" = None) -> None:
        self.name = name
        self.source = source
        self.data = data
        self.digest = kubeconfig_hash(data) if data is not None else ""
        self.replaces = replaces
        self.replaced = False
        self.cancelled = False
        self.told: list[ClusterHandler] = []  # the handlers add_cluster was called on, in order
        self.state = MemberState.CONNECTING
        self.conditions = {t: Condition(t) for t in ConditionType}
        self.attempts = 0
        # The client's recoveries before the probe request that failed: a later success of any of its requests
        # (a watch reopened) means the server answers again. None while the probe has nothing against it.
        self.probe_failed_at: int | None = None
        self.watch_failed = False  # Connected is false because a watch could not reach the server
        self.task: asyncio.Task[None] | None = None
        self.client: ApiClient | None = None
        self.factory: DiscoveringDynamicSharedInformerFactory | None = None
        self.cluster: Cluster | None = None
        self.ctx: ClusterContext | None = None
        self.fence: Fence = OPEN
        self.up = asyncio.Event()  # set once the handlers have been told

    @property
    def local(self) -> bool:
        return self.source == "local"


@dataclass
class _Conflict:
    """A Secret that does not register its cluster, and why."""

    secret: str
    cluster: str
    holder: str
    message: str


class ClusterRegistry:
    """The members of the fleet, kept in step with the kubeconfig Secrets of ``management``.

    ``required``: the GVRs some controller needs in every cluster (each member's factory watches those, see the
    factory's ``watch="required"``); ``make_factory(client, name)`` builds a member's factory (by default one
    watching only what is required); ``local_factory`` is the management cluster's own, reused for the local
    member. ``fence``: the leadership term, applied to ``clients``.

    ``gate`` (sharding, see ``syncer/shards.py``): the fence of each cluster while this replica owns it, None
    for the others; Secrets of clusters not owned here are known (``candidates()``) but not connected to, until
    ``engage`` (after the gate opened) or ``disengage`` (after it closed) is called.
    """

    def __init__(
        self, management: ApiClient, options: RegistryOptions = RegistryOptions(), *, required: Iterable[GVR] = (),
        make_factory: FactoryMaker | None = None, local_factory: DiscoveringDynamicSharedInformerFactory | None = None,
        fence: Fence = OPEN, supervisor: Supervisor | None = None, metrics_registry: CollectorRegistry | None = None,
        name: str = "clusters", gate: Gate | None = None,
    ) -> None:
        self.management = management
        self.options = options
        self.required = frozenset(required)
        self.name = name
        self.fence = fence
        self._gate: Gate = gate or (lambda _: fence)
        self.clients = ClusterClients(self, fence)
        self._make_factory = make_factory or partial(_default_factory, metrics_registry)
        self._local_factory = local_factory
        self._supervisor = supervisor or Supervisor(name)
        self._handlers: list[ClusterHandler] = []
        self._members: dict[str, _Member] = {}  # cluster name -> its current member
        self._claims: dict[str, str] = {}  # secret key -> the (valid) cluster name it names, held or not
        self._conflicts: dict[str, _Conflict] = {}  # secret key -> why it is not registered
        self._tasks: set[asyncio.Task[None]] = set()
        self._leaving: dict[str, set[asyncio.Task[None]]] = {}  # cluster name -> its cancelled members' tasks
        # Per cluster name: its handler calls (add, cleanups, remove) run one at a time, in order; another
        # cluster's never wait for them (a slow controller stop in one delays no other).
        self._lock_for = NamedLocks()
        self._queue: WorkQueue[str] = WorkQueue()
        self._informers = [self._secret_informer(ns, sel, typ) for ns in _or_all(options.namespaces)
                           for sel, typ in [*((s, None) for s in options.label_selectors),
                                            *((None, t) for t in options.secret_types)]]
        self._started = False
        self._log = logger.bind(component=name)
        _Collector.for_registry(metrics_registry).registries.add(self)

    def _secret_informer(self, namespace: str | None, selector: str | None, type: str | None) -> SharedIndexInformer:
        inf = SharedIndexInformer(self.management, SECRETS, namespace=namespace, label_selector=selector,
                                  field_selector=f"type={type}" if type else None, transform=drop_managed_fields)
        inf.add_indexers({_BY_CLUSTER: lambda obj: [self._cluster_name(obj)]})
        inf.add_event_handler(FuncHandler(lambda obj, _initial: self._enqueue(obj),
                                          lambda _old, new: self._enqueue(new), self._enqueue), name=self.name)
        return inf

    # -- public ------------------------------------------------------------------------------------------
    async def register_cluster_handler(self, handler: ClusterHandler) -> None:
        """``handler.add_cluster`` for every member now engaged, then for every future one."""
        self._handlers.append(handler)
        for name in list(self._members):
            async with self._lock_for(name):  # decided under the lock: an engagement may be finishing
                m = self._members.get(name)
                engaged = m if m is None or m.ctx is not None else m.replaces
                if engaged is not None:
                    await self._tell(engaged, handler)

    def unregister_cluster_handler(self, handler: ClusterHandler) -> None:
        """Tell ``handler`` about no more clusters (its cleanups already registered still run when their cluster
        goes; a handler that leaves earlier detaches itself, as ``FleetLoop.close`` does)."""
        if handler in self._handlers:
            self._handlers.remove(handler)

    async def _tell(self, m: _Member, handler: ClusterHandler) -> None:
        """``add_cluster`` on ``handler`` for the engaged ``m``, once (under the member's name lock)."""
        if m.ctx is None or m.cluster is None or m.ctx.cancelled() or m.cancelled or m.replaced or \
                handler in m.told:
            return
        m.told.append(handler)
        await _call(handler.add_cluster, m.ctx, m.name, m.cluster)

    def cluster(self, name: str) -> Cluster:
        """The cluster ``name`` as engaged now; ClusterNotFound if it is not registered or not up yet."""
        member = self._members.get(name)
        engaged = member if member is None or member.cluster is not None else member.replaces
        if engaged is None or engaged.cluster is None or engaged.ctx is None or engaged.ctx.cancelled():
            raise ClusterNotFound(f"no cluster {display_name(name)!r} is registered and up (registered: "
                                  f"{', '.join(map(display_name, self.list_clusters())) or 'none'})")
        return engaged.cluster

    def list_clusters(self) -> list[str]:
        """The names of the members that are up (engaged), sorted."""
        names = []
        for name, m in self._members.items():
            engaged = m if m.ctx is not None else m.replaces
            if engaged is not None and engaged.ctx is not None and not engaged.ctx.cancelled():
                names.append(name)
        return sorted(names)

    def candidates(self) -> set[str]:
        """Every cluster named by a Secret (or the local one, if included), engaged here or not."""
        names = set(self._claims.values()) | set(self._members)
        return names | {LOCAL_CLUSTER} if self.options.include_local else names

    async def engage(self, name: str) -> None:
        """Connect to cluster ``name`` now that the gate lets this replica run it; return once its handlers have
        been told (while it is retrying, this waits)."""
        if name == LOCAL_CLUSTER and self.options.include_local and name not in self._members:
            self._add(_Member(LOCAL_CLUSTER, "local", None))
        self._settle(name)
        # Until the member registered under the name is up (one replacing it meanwhile counts), or none is.
        while (member := self._members.get(name)) is not None and not member.up.is_set():
            await wait_first(member.up.wait(), timeout=1.0)

    async def disengage(self, name: str) -> None:
        """Stop cluster ``name`` here (handlers' cleanups, informers, connections), awaited; the gate has closed."""
        member = self._members.get(name)
        if member is not None:
            self._remove(member, "another replica runs it now")
        leaving = self._leaving.get(name)
        if leaving:  # this one, or one whose Secret went just before
            await asyncio.wait(set(leaving))

    def synced(self) -> bool:
        """True once every Secret informer has synced and every Secret they hold has been processed once (skv2's
        users asked for "all initial clusters are registered"; members may still be connecting)."""
        return all(inf.has_synced() for inf in self._informers) and len(self._queue) == 0 and \
            self._queue.processing == 0

    def status(self) -> dict[str, Any]:
        """``{"clusters": [...], "conflicts": [...]}``: every member with its state and conditions, and under
        ``rotation`` those of the new connection a changed kubeconfig is bringing up (None otherwise)."""
        clusters = []
        for name, m in sorted(self._members.items()):
            # While a new connection comes up, the old one still serves: the cluster is what the old one is.
            serving = m.replaces if m.ctx is None and m.replaces is not None else m
            doc = self._member_status(serving)
            doc["rotation"] = self._member_status(m) if serving is not m else None
            clusters.append({"name": name, "display_name": display_name(name), **doc})
        conflicts = [{"secret": c.secret, "cluster": c.cluster, "message": c.message}
                     for c in sorted(self._conflicts.values(), key=lambda c: c.secret)]
        return {"clusters": clusters, "conflicts": conflicts}

    def _member_status(self, m: _Member) -> dict[str, Any]:
        conditions = self._conditions(m)
        state = _shown_state(m, conditions)
        return {"source": m.source, "state": state.value, "ready": state is MemberState.READY,
                "attempts": m.attempts, "conditions": [c.as_dict() for c in conditions]}

    async def start(self) -> None:
        """Start watching the Secrets (and bring up the local member if configured)."""
        if self._started:
            return
        self._started = True
        if self.options.include_local and self._gate(LOCAL_CLUSTER) is not None:
            self._add(_Member(LOCAL_CLUSTER, "local", None))
        for inf in self._informers:
            inf.start()
        self._supervisor.spawn(f"{self.name} secrets", self._work)

    async def stop(self) -> None:
        """Stop watching, then stop every member (handlers' cleanups, informers, connections), awaited."""
        await self._supervisor.cancel(f"{self.name} secrets")
        self._queue.shutdown()
        await asyncio.gather(*(inf.stop() for inf in self._informers))
        for m in list(self._members.values()):
            self._remove(m, "the registry is stopping")
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._started = False

    # -- secrets -> members ------------------------------------------------------------------------------
    def _enqueue(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self._queue.add(obj.key if isinstance(obj, DeletedFinalStateUnknown) else object_key(obj))

    async def _work(self, _: Any) -> None:
        # Holders are decided on whole lists: see the module docstring.
        timeout = self.options.sync_timeout
        listed = await asyncio.gather(*(inf.wait_for_sync(timeout) for inf in self._informers))
        if not all(listed):
            self._log.warning("kubeconfig secrets not listed within {:g}s ({}); registering those listed so far",
                              timeout, ", ".join(_describe(inf) for inf, ok in zip(self._informers, listed) if not ok))
        while True:
            try:
                key = await self._queue.get()
            except QueueShutDown:
                return
            try:
                self._sync(key)
                self._queue.forget(key)
            except Exception:
                self._log.exception("processing kubeconfig secret {} failed; retrying", key)
                self._queue.add_rate_limited(key)
            finally:
                self._queue.done(key)

    def _find(self, key: str) -> Obj | None:
        namespace, _, name = key.rpartition("/")
        for inf in self._informers:
            obj = inf.lister.get(name, namespace or None)
            if obj is not None:
                return obj
        return None

    def _sync(self, key: str) -> None:
        """Bring the members in line with the Secret ``key`` as the cache has it now (never an event's payload)."""
        secret = self._find(key)
        previous = self._claims.pop(key, None)
        conflict = self._conflicts.pop(key, None)
        name = None
        if secret is not None:
            name = self._cluster_name(secret)
            if not _CLUSTER_NAME.match(name):
                self._conflicts[key] = _Conflict(key, name, "", f"annotation {self.options.name_annotation} names "
                                                 f"cluster {name!r}, which is not a DNS-1123 subdomain (lowercase)")
                name = None
            else:
                self._claims[key] = name
                if conflict is not None and conflict.holder and conflict.cluster == name:
                    self._conflicts[key] = conflict  # still contending: kept (and not logged again) if it loses
        for cluster in dict.fromkeys(n for n in (previous, name) if n is not None):
            self._settle(cluster)

    def _cluster_name(self, secret: Obj) -> str:
        meta = secret["metadata"]
        return str((meta.get("annotations") or {}).get(self.options.name_annotation) or meta["name"])

    def _claimants(self, name: str) -> list[tuple[str, Obj]]:
        """The Secrets in the caches that name cluster ``name``, by key, the oldest first (then by namespace and
        name). The caches, not the Secrets processed so far: a holder is the same whatever the order of
        events. metav1.Time is serialized in UTC at second precision (RFC 3339): the strings order as the times."""
        found = {object_key(obj): obj for inf in self._informers for obj in inf.lister.by_index(_BY_CLUSTER, name)}
        return sorted(found.items(), key=lambda item: (item[1]["metadata"].get("creationTimestamp") or "",
                                                       *item[0].rpartition("/")[::2]))

    def _settle(self, name: str) -> None:
        """Give cluster ``name`` to the oldest Secret naming it (the others are conflicts), and bring its member
        in line with that Secret: registered, rotated to its kubeconfig, or removed if no Secret names it."""
        member = self._members.get(name)
        claimants = self._claimants(name)
        if not claimants:
            if member is not None and not member.local:
                key = _secret_key(member)
                self._remove(member, "its secret names another cluster" if self._find(key) is not None
                             else "its secret is gone")
            return
        (key, secret), others = claimants[0], claimants[1:]
        source = f"secret {key}"
        self._conflicts.pop(key, None)
        for other, _ in others:
            self._note_conflict(other, name, source)
        if self._gate(name) is None:  # another replica's (one engaged here leaves by ``disengage``)
            return
        data = _kubeconfig_bytes(secret, self.options.data_key)
        digest = kubeconfig_hash(data) if data is not None else ""
        if member is None:
            self._log.info("cluster {} registered from {}", display_name(name), source)
            self._add(_Member(name, source, data))
            return
        if member.source == source and member.digest == digest:
            return  # an identical kubeconfig: nothing restarts
        if member.source == source:
            self._log.info("cluster {}: kubeconfig changed; connecting anew before replacing the connection",
                           display_name(name))
        else:
            self._log.warning("cluster {}: {} holds it now (the oldest Secret naming it; was {}); connecting with "
                              "its kubeconfig before replacing the connection", display_name(name), source,
                              member.source)
        # The engaged member stays until the new one is up; a pending replacement is dropped for the newest,
        # detached first so that cancelling it does not reach the engaged one.
        engaged = member if member.ctx is not None else member.replaces
        if member is not engaged:
            member.replaces = None
            self._cancel(member)
            if engaged is not None and engaged.source == source and engaged.digest == digest:
                self._members[name] = engaged  # back to what is running: nothing to connect
                return
        self._add(_Member(name, source, data, replaces=engaged))

    def _note_conflict(self, key: str, name: str, holder: str) -> None:
        """Secret ``key`` names cluster ``name``, which ``holder`` holds: a conflict, logged once per holder."""
        conflict = self._conflicts.get(key)
        if conflict is not None and conflict.cluster == name and conflict.holder == holder:
            return
        self._conflicts[key] = _Conflict(key, name, holder, f"cluster name {display_name(name)!r} is held by "
                                         f"{holder}, the oldest Secret naming it")
        self._log.error("secret {} names cluster {!r}, which {} holds (the oldest Secret naming it); it is ignored "
                        "while that one does (rename one, or set annotation {})", key, display_name(name), holder,
                        self.options.name_annotation)

    def _add(self, m: _Member) -> None:
        fence = self._gate(m.name)
        m.fence = fence if fence is not None else CLOSED  # never reached: engaged only through an open gate
        self._members[m.name] = m
        m.task = self._spawn(self._run(m), f"cluster {display_name(m.name)}")

    def _spawn(self, work: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _remove(self, m: _Member, why: str) -> None:
        """Drop ``m`` (and the member it was replacing) if it is still the one registered under its name."""
        if self._members.get(m.name) is not m:
            return
        del self._members[m.name]
        self._log.info("cluster {} leaves ({})", display_name(m.name), why)
        self._cancel(m)

    def _cancel(self, m: _Member) -> None:
        """Cancel ``m`` and every member it is still replacing, each once (a second cancellation would cut its
        teardown short)."""
        member: _Member | None = m
        while member is not None and not member.cancelled:
            member.cancelled = True
            member.state = MemberState.STOPPING
            if member.task is not None and not member.task.done():
                member.task.cancel()
                leaving = self._leaving.setdefault(member.name, set())
                leaving.add(member.task)
                member.task.add_done_callback(partial(self._left, member.name))
            member = member.replaces

    def _left(self, name: str, task: asyncio.Task[None]) -> None:
        leaving = self._leaving.get(name)
        if leaving is not None:
            leaving.discard(task)
            if not leaving:
                del self._leaving[name]

    # -- one member --------------------------------------------------------------------------------------
    async def _run(self, m: _Member) -> None:
        backoff = Backoff(initial=1.0, cap=60.0)
        try:
            while True:
                m.attempts += 1
                try:
                    cluster = await self._bring_up(m)
                    break
                except KubeconfigError as e:
                    m.state = MemberState.REFUSED
                    m.conditions[ConditionType.CONNECTED].set(False, type(e).__name__, str(e))
                    self._log.error("cluster {}: {}", display_name(m.name), e)
                    await asyncio.Future()  # until the Secret changes (a new member) or goes (cancelled)
                except Exception as e:
                    delay = backoff.next()
                    m.state = MemberState.RETRYING
                    self._condition_for(m).set(False, type(e).__name__, describe_error(e))
                    self._log.warning("cluster {}: {} failed ({}); retrying in {:.1f}s", display_name(m.name),
                                      self._phase(m), describe_error(e), delay)
                    await self._release(m)
                    await asyncio.sleep(delay)
            await self._engage(m, cluster)
            await self._probe(m)
        finally:
            await self._teardown(m)

    def _phase(self, m: _Member) -> str:
        return {MemberState.DISCOVERING: "discovery", MemberState.SYNCING: "sync"}.get(m.state, "connecting")

    def _condition_for(self, m: _Member) -> Condition:
        """The condition the current phase decides."""
        t = {MemberState.DISCOVERING: ConditionType.DISCOVERED, MemberState.SYNCING: ConditionType.SYNCED}.get(
            m.state, ConditionType.CONNECTED)
        return m.conditions[t]

    async def _bring_up(self, m: _Member) -> Cluster:
        o = self.options
        m.state = MemberState.CONNECTING
        if m.local:
            client = self.management
        elif m.data is None:
            raise KubeconfigInvalid(m.source, f"data key {o.data_key!r}", "is missing")
        else:
            client = client_from_untrusted_kubeconfig(m.data, allowed_exec_commands=o.allowed_exec_commands,
                                                      source=m.source)
            client.http2 = self.management.http2  # the process's choice (setting ``http2``) holds for members
        m.client = client
        version = await client.request("GET", "/version", timeout=o.connect_timeout)
        m.conditions[ConditionType.CONNECTED].set(True, "Connected", f"Kubernetes {version.get('gitVersion', '?')}")
        m.state = MemberState.DISCOVERING
        factory = m.factory = (self._local_factory if m.local and self._local_factory is not None
                               else self._make_factory(client, m.name))
        require = getattr(factory, "require", None)
        if require is not None:
            require(self.name, self.required)
        async with asyncio.timeout(o.sync_timeout):
            await factory.start()
        m.conditions[ConditionType.DISCOVERED].set(True, "Discovered", f"{len(factory.status())} GVRs served")
        m.state = MemberState.SYNCING
        cluster = Cluster(m.name, m.source, client, factory, m.fence)
        if not await self._wait_synced(cluster, o.sync_timeout):
            missing = ", ".join(map(str, cluster.not_synced(self.required)))
            m.conditions[ConditionType.SYNCED].set(False, "SyncTimeout", f"not synced within {o.sync_timeout:g}s: "
                                                   f"{missing}; engaged anyway, still waiting")
            self._log.warning("cluster {}: informers not synced within {:g}s ({}); starting its controllers anyway",
                              display_name(m.name), o.sync_timeout, missing)
        return cluster

    async def _wait_synced(self, cluster: Cluster, timeout: float) -> bool:
        """Wait until every required GVR the cluster serves has a synced informer; False after ``timeout``."""
        sub_id = f"{self.name} sync {id(cluster)}"
        subscription = cluster.factory.subscribe(sub_id)

        async def synced() -> None:
            async for _ in subscription:
                if not cluster.not_synced(self.required):
                    return

        try:
            return await wait_first(synced(), timeout=timeout) == 0
        finally:
            cluster.factory.unsubscribe(sub_id)

    async def _engage(self, m: _Member, cluster: Cluster) -> None:
        """Tell the handlers (the member becomes the cluster), then stop the member it replaces."""
        async with self._lock_for(m.name):
            old = m.replaces
            if old is not None:
                old.replaced = True  # from here on the handlers hear of m: the old one never gets remove_cluster
            m.cluster = cluster
            m.ctx = ClusterContext(m.name)
            m.state = MemberState.READY
            for handler in list(self._handlers):  # one registered meanwhile is told by its registration
                await self._tell(m, handler)
            m.replaces = None
            m.up.set()
            if old is not None:
                self._cancel(old)
        self._log.info("cluster {} is up ({})", display_name(m.name), m.conditions[ConditionType.CONNECTED].message)
        if old is not None and old.task is not None:
            await asyncio.wait({old.task})  # a cancellation of ours must not reach the old member's teardown

    async def _probe(self, m: _Member) -> None:
        """Keep the Connected condition current; informers reconnect by themselves. A member the server said
        anything for (a watch event or bookmark, an answer to any request) since the last round has shown it is
        there: only a quiet one is asked, so a fleet's idle cost does not grow by a request per member."""
        assert m.client is not None
        connected = m.conditions[ConditionType.CONNECTED]
        heard = _heard(m)
        while True:
            await asyncio.sleep(self.options.probe_interval)
            before, heard = heard, _heard(m)
            if heard != before and connected.status:
                continue
            answers = m.client.recoveries
            try:
                await m.client.request("GET", "/version", timeout=self.options.connect_timeout)
            except Exception as e:
                if connected.status:
                    self._log.warning("cluster {}: not reachable ({})", display_name(m.name), describe_error(e))
                connected.set(False, type(e).__name__, describe_error(e))
                m.probe_failed_at, m.watch_failed = answers, False
            else:
                if connected.status is False:
                    self._log.info("cluster {}: reachable again", display_name(m.name))
                connected.set(True, "Connected", connected.message if connected.reason == "Connected" else "")
                m.probe_failed_at, m.watch_failed = None, False
            heard = _heard(m)  # the probe's own answer says nothing about the next round

    async def _teardown(self, m: _Member) -> None:
        m.state = MemberState.STOPPING
        try:
            if m.ctx is not None:
                m.ctx.cancel()  # at once: whatever waits for the lock already sees the cluster gone
                async with self._lock_for(m.name):
                    await m.ctx.run_cleanups(self.options.cleanup_timeout)
                    if not m.replaced:
                        for handler in m.told:
                            if isinstance(handler, ClusterRemovedHandler) and handler in self._handlers:
                                await finish(_bounded_call(self.options.cleanup_timeout, handler.remove_cluster,
                                                           m.name))
        finally:
            await self._release(m)
            self._log.debug("cluster {}: member from {} stopped", display_name(m.name), m.source)

    async def _release(self, m: _Member) -> None:
        """Stop the member's factory and close its client (neither when they are the management cluster's), to
        the end even if cancelled meanwhile (a Secret deleted while a retry releases)."""
        await finish(self._release_now(m))

    async def _release_now(self, m: _Member) -> None:
        factory, client = m.factory, m.client
        try:
            if factory is not None and factory is self._local_factory:
                release = getattr(factory, "release", None)
                if release is not None:
                    release(self.name)  # the sidecar's own factory outlives the member
            elif factory is not None:
                await factory.shutdown()
            if client is not None and client is not self.management:
                await client.close()
        except Exception:  # a failed release must not end the member's task: it would never retry or stop
            self._log.exception("cluster {}: stopping its informers or closing its connections failed",
                                display_name(m.name))
        finally:
            m.factory = m.client = None

    def _follow_watches(self, m: _Member, cluster: Cluster) -> None:
        """Connected as the engaged member's watches have it: false while one cannot reach the server, true again
        once none fails and the server has answered since (a watch reopened, or any other request after the
        probe's failure). A probe failure that no watch contradicts stands (the watches of a silently cut
        connection may not have noticed yet)."""
        connected = m.conditions[ConditionType.CONNECTED]
        failing = cluster.unreachable()
        if failing is not None:
            gvr, e = failing
            if connected.status:
                self._log.warning("cluster {}: not reachable (watching {}: {})", display_name(m.name), gvr,
                                  describe_error(e))
            connected.set(False, type(e).__name__, f"watching {gvr}: {describe_error(e)}")
            m.watch_failed = True
        elif connected.status is False and (m.watch_failed or (
                m.probe_failed_at is not None and cluster.client.recoveries > m.probe_failed_at)):
            self._log.info("cluster {}: reachable again (its watches work)", display_name(m.name))
            connected.set(True, "Connected", "watching")
            m.probe_failed_at, m.watch_failed = None, False

    def _conditions(self, m: _Member) -> list[Condition]:
        """The member's conditions, made live from its watches and discovery once it is engaged (read by
        ``status()`` and the metrics, so both show what the informers see at that moment)."""
        conditions = m.conditions
        if m.cluster is not None and m.ctx is not None and not m.ctx.cancelled():
            self._follow_watches(m, m.cluster)
            problems = m.cluster.factory.supervisor.problems()
            if problems:
                conditions[ConditionType.DISCOVERED].set(False, "DiscoveryFailing", "; ".join(
                    f"{h.name}: {h.last_error}" for h in problems))
            elif conditions[ConditionType.DISCOVERED].status is False:
                conditions[ConditionType.DISCOVERED].set(True, "Discovered")
            missing = m.cluster.not_synced(self.required)
            if missing:
                conditions[ConditionType.SYNCED].set(False, "NotSynced", "informers not synced or failing: " +
                                                     ", ".join(map(str, missing)))
            else:
                conditions[ConditionType.SYNCED].set(True, "Synced")
        return [conditions[t] for t in ConditionType]


class ClusterClients:
    """The multi-cluster client (skv2's ``mcClient``): a member's API client by cluster name, behind the same
    fence as the controllers' own (writes are refused once the leadership term ends)."""

    def __init__(self, registry: ClusterRegistry, fence: Fence = OPEN) -> None:
        self._registry = registry
        self._fence = fence

    def cluster(self, name: str) -> ApiClient:
        """The API client of cluster ``name``; ClusterNotFound if it is not up."""
        cluster = self._registry.cluster(name)
        return fenced(cluster.client, cluster.fence if cluster.fence is not OPEN else self._fence)

    def resource(self, name: str, gvr: GVR, field_manager: str | None = None) -> ResourceClient:
        """A ResourceClient of ``gvr`` in cluster ``name``."""
        return ResourceClient(self.cluster(name), gvr, field_manager=field_manager)

    def list_clusters(self) -> list[str]:
        """The clusters that are up, sorted."""
        return self._registry.list_clusters()


def _default_factory(metrics_registry: CollectorRegistry | None, client: ApiClient,
                     name: str) -> DiscoveringDynamicSharedInformerFactory:
    return DiscoveringDynamicSharedInformerFactory(client, watch="required", name=f"discovery {display_name(name)}",
                                                   metrics_registry=metrics_registry, metrics_cluster=name)


def _heard(m: _Member) -> tuple[int, int]:
    """What the member's server has said so far: the watch events (bookmarks included) of its running
    informers, and the answers to its client's requests."""
    events = m.factory.events_received() if m.factory is not None else 0
    answers = sum(n for (code, _), n in m.client.request_counts.codes.items() if code != NO_ANSWER) \
        if m.client is not None else 0
    return events, answers


def _shown_state(m: _Member, conditions: list[Condition]) -> MemberState:
    """The state as ``status()`` and the metrics show it: an engaged member is ``ready`` only while every
    condition holds, so that state and readiness never disagree."""
    if m.state is MemberState.READY and not all(c.status for c in conditions):
        return MemberState.DEGRADED
    return m.state


def _secret_key(m: _Member) -> str:
    return m.source.removeprefix("secret ")


def _describe(inf: SharedIndexInformer) -> str:
    r = inf.reflector
    where = f"namespace {r.namespace}" if r.namespace else "all namespaces"
    return f"{where} {' '.join(f'{k}={v}' for k, v in r.selectors.items())}"


def _or_all(namespaces: Sequence[str]) -> list[str | None]:
    return list(namespaces) or [None]


def _kubeconfig_bytes(secret: Obj, key: str) -> bytes | None:
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return b"\x00not base64"  # the loader reports it as malformed, per member, like any other bad kubeconfig



async def _bounded_call(timeout: float, fn: Callable[..., Any], *args: Any) -> None:
    try:
        async with asyncio.timeout(timeout):
            await _call(fn, *args)
    except TimeoutError:
        logger.error("cluster handler {} did not return within {:g}s", getattr(fn, "__qualname__", fn), timeout)


async def _call(fn: Callable[..., Any], *args: Any) -> None:
    """Call a handler method (sync or async); a failure is logged, never raised into the registry."""
    try:
        result = fn(*args)
        if asyncio.iscoroutine(result):
            await result
    except Exception:
        logger.exception("cluster handler {} failed", getattr(fn, "__qualname__", fn))


class _Collector(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.registries: "weakref.WeakSet[ClusterRegistry]" = weakref.WeakSet()
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        conditions = GaugeMetricFamily("syncer_cluster_condition", "1 if the member cluster's condition is true, 0 "
                                       "if false (absent while unknown).", labels=["cluster", "condition"])
        members = GaugeMetricFamily("syncer_clusters", "Member clusters by state.", labels=["state"])
        counts = dict.fromkeys((s.value for s in MemberState), 0)
        for registry in list(self.registries):
            for name, m in sorted(registry._members.items()):
                member_conditions = registry._conditions(m)
                counts[_shown_state(m, member_conditions).value] += 1
                for c in member_conditions:
                    if c.status is not None:
                        conditions.add_metric([display_name(name), c.type.value], float(c.status))
        for state, n in counts.items():
            members.add_metric([state], n)
        yield from (conditions, members)
