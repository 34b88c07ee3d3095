"""Member: one registration of a cluster (a provider's config, by digest) and its life, as explicit transitions.

::

    CONNECTING -> DISCOVERING -> SYNCING -> READY -> SUPERSEDED -> STOPPING -> STOPPED
        ^   |          |            |        |                      ^
        |   +----------+------------+--> RETRYING (backoff) --+     |
        +-----------------------------------------------------+     |
    CONNECTING -> REFUSED (a kubeconfig refused: until its config changes)    any state --+

One task per member brings it up and retries it, so no member blocks another (skv2 and multicluster-runtime do this
in the watcher's worker); one not synced within ``sync_timeout`` is engaged anyway, its conditions saying what is
missing. Once engaged, Connected/Discovered/Synced follow its informers (``ready`` while all hold, else
``degraded``); ``/version`` is probed only after the watches said nothing for ``probe_interval``: no steady polling.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sequence

from loguru import logger

from informers import ApiClient, Backoff, ClusterSource, DiscoveringDynamicSharedInformerFactory, Subscription
from informers.errors import describe_error
from informers.request_metrics import NO_ANSWER
from informers.untrusted_kubeconfig import KubeconfigError
from informers.wait import wait_all, wait_first

from .cluster import Cluster, ClusterContext, ClusterHandler, Condition, ConditionType, display_name, finish
from .fence import CLOSED, Fence
from .provider import ClusterConfig


class FactoryMaker(Protocol):
    """Builds the discovering factory of member ``name`` over ``client`` (or the one a provider's namespaces
    share, named after the provider)."""

    def __call__(self, client: ApiClient, name: str) -> DiscoveringDynamicSharedInformerFactory: ...


class MemberState(enum.StrEnum):
    """Where a member is in its life (``degraded`` is only shown: an engaged member with a false condition)."""

    CONNECTING = "connecting"
    DISCOVERING = "discovering"
    SYNCING = "syncing"
    READY = "ready"  # engaged: its handlers have been told
    DEGRADED = "degraded"
    RETRYING = "retrying"
    REFUSED = "refused"
    SUPERSEDED = "superseded"  # engaged, then replaced by a new connection: its handlers moved to the successor
    STOPPING = "stopping"
    STOPPED = "stopped"


_BRINGING_UP = {MemberState.CONNECTING, MemberState.DISCOVERING, MemberState.SYNCING}
_NEXT: dict[MemberState, set[MemberState]] = {
    MemberState.CONNECTING: {MemberState.DISCOVERING, MemberState.RETRYING, MemberState.REFUSED},
    MemberState.DISCOVERING: {MemberState.SYNCING, MemberState.RETRYING},
    MemberState.SYNCING: {MemberState.READY, MemberState.RETRYING},
    MemberState.RETRYING: {MemberState.CONNECTING},
    MemberState.REFUSED: set(),
    MemberState.READY: {MemberState.SUPERSEDED},
    MemberState.SUPERSEDED: set(),
    MemberState.STOPPING: {MemberState.STOPPED},
    MemberState.STOPPED: set(),
}


@dataclass(frozen=True)
class MemberOptions:
    """How members are brought up: ``allowed_exec_commands`` for untrusted kubeconfigs; ``sync_timeout`` before a
    member is engaged anyway; ``probe_interval``: how long its watches may say nothing before ``/version`` is
    asked; ``cleanup_timeout`` bounds each handler's cleanup."""

    allowed_exec_commands: Sequence[str] = ()
    sync_timeout: float = 30.0
    connect_timeout: float = 10.0
    probe_interval: float = 300.0
    cleanup_timeout: float = 30.0


@dataclass(frozen=True)
class MemberEnv:
    """What every member of one registry shares."""

    management: ApiClient
    options: MemberOptions
    required: frozenset[Any]
    make_factory: FactoryMaker
    local_factory: DiscoveringDynamicSharedInformerFactory | None
    component: str
    # The member of a config brought up ahead, for a new member of that config to adopt (``WarmMembers.take``).
    take_warm: Callable[[ClusterConfig], Awaitable["Member | None"]] | None = None


class Member:
    """One registration of ``config.name`` under ``fence``; ``predecessor``: the engaged member it will replace."""

    def __init__(self, config: ClusterConfig, fence: Fence, predecessor: "Member | None" = None) -> None:
        self.config = config
        self.name = config.name
        self.fence = fence
        self.predecessor = predecessor
        self.successor: Member | None = None  # set when superseded: its handlers hear of the successor instead
        self.state = MemberState.CONNECTING
        self.settled = asyncio.Event()  # set once engaged or stopping: what ``engage`` waits for
        self.conditions = {t: Condition(t) for t in ConditionType}
        self.attempts = 0
        # The client's recoveries before the probe request that failed: a later success of any of its requests
        # (a watch reopened) means the server answers again. None while the probe has nothing against it.
        self.probe_failed_at: int | None = None
        self.watch_failed = False  # Connected is false because a watch could not reach the server
        self.task: asyncio.Task[None] | None = None
        self.client: ApiClient | None = None
        self.factory: ClusterSource | None = None
        self.cluster: Cluster | None = None
        self.ctx: ClusterContext | None = None
        self.told: list[ClusterHandler] = []  # the handlers add_cluster was called on, in order

    # -- transitions -------------------------------------------------------------------------------------
    def to(self, state: MemberState) -> None:
        """Move to ``state``; a move the diagram does not have is a bug (raises). Stopping is allowed from
        anywhere but the end, and only once: a second cancellation would cut the teardown short."""
        allowed = _NEXT[self.state] | ({MemberState.STOPPING} if self.state not in
                                       (MemberState.STOPPING, MemberState.STOPPED) else set())
        if state not in allowed:
            raise RuntimeError(f"member {display_name(self.name)}: no transition {self.state} -> {state}")
        self.state = state
        if state in (MemberState.READY, MemberState.STOPPING):
            self.settled.set()

    @property
    def engaged(self) -> bool:
        """Its handlers have been told and it is neither superseded nor stopping."""
        return self.state is MemberState.READY and self.ctx is not None and not self.ctx.cancelled()

    @property
    def ending(self) -> bool:
        """Cancelled: stopping or stopped."""
        return self.state in (MemberState.STOPPING, MemberState.STOPPED)

    @property
    def serving(self) -> "Member | None":
        """The member that serves the cluster now: this one once engaged, else the one it is replacing."""
        return self if self.cluster is not None else self.predecessor

    # -- life --------------------------------------------------------------------------------------------
    async def run(self, env: MemberEnv, engage: Callable[["Member"], Awaitable[None]],
                  teardown: Callable[["Member"], Awaitable[None]]) -> None:
        """Bring the member up (retrying), ``engage`` it, keep its Connected condition current, and ``teardown``
        when cancelled (to the end, whatever happens meanwhile)."""
        log = logger.bind(component=env.component)
        backoff = Backoff(initial=1.0, cap=60.0)
        try:
            while True:
                self.attempts += 1
                try:
                    cluster = await self._bring_up(env)
                    break
                except KubeconfigError as e:
                    self.to(MemberState.REFUSED)
                    self.conditions[ConditionType.CONNECTED].set(False, type(e).__name__, str(e))
                    log.error("cluster {}: {}", display_name(self.name), e)
                    await asyncio.Future()  # until its config changes (a new member) or goes (cancelled)
                except Exception as e:
                    delay = backoff.next()
                    phase = {MemberState.DISCOVERING: "discovery", MemberState.SYNCING: "sync"}.get(
                        self.state, "connecting")
                    self._condition_of_phase().set(False, type(e).__name__, describe_error(e))
                    self.to(MemberState.RETRYING)
                    log.warning("cluster {}: {} failed ({}); retrying in {:.1f}s", display_name(self.name), phase,
                                describe_error(e), delay)
                    await self.release(env)
                    await asyncio.sleep(delay)
                    self.to(MemberState.CONNECTING)
            self.cluster = cluster
            await engage(self)
            await self._keep_current(env, cluster)
        finally:
            await teardown(self)

    def _condition_of_phase(self) -> Condition:
        t = {MemberState.DISCOVERING: ConditionType.DISCOVERED, MemberState.SYNCING: ConditionType.SYNCED}.get(
            self.state, ConditionType.CONNECTED)
        return self.conditions[t]

    async def _bring_up(self, env: MemberEnv) -> Cluster:
        o = env.options
        warm = await env.take_warm(self.config) if env.take_warm is not None else None
        client, factory = self._adopt(warm) if warm is not None else await self._connect(env)
        self.to(MemberState.SYNCING)
        cluster = Cluster(self.name, self.config.source, client, factory, self.fence)
        if not await _wait_synced(cluster, env.required, o.sync_timeout, f"{env.component} sync {id(cluster)}"):
            missing = ", ".join(map(str, cluster.not_synced(env.required)))
            self.conditions[ConditionType.SYNCED].set(False, "SyncTimeout", f"not synced within {o.sync_timeout:g}s:"
                                                      f" {missing}; engaged anyway, still waiting")
            logger.bind(component=env.component).warning(
                "cluster {}: informers not synced within {:g}s ({}); starting its controllers anyway",
                display_name(self.name), o.sync_timeout, missing)
        return cluster

    async def _connect(self, env: MemberEnv) -> tuple[ApiClient, ClusterSource]:
        """CONNECTING -> DISCOVERING: a client that reached the server, and the factory of the required informers,
        started."""
        o = env.options
        client = self.client = connect(self.config, env.management, o.allowed_exec_commands)
        factory = self.factory = self.config.connection.informers(env, client, self.name)
        factory.require(env.component, env.required)

        answered = asyncio.Event()

        async def hello() -> None:
            try:
                version = await client.request("GET", "/version", timeout=o.connect_timeout)
            finally:
                answered.set()
            self.conditions[ConditionType.CONNECTED].set(True, "Connected",
                                                         f"Kubernetes {version.get('gitVersion', '?')}")
            self.to(MemberState.DISCOVERING)

        async def discover() -> None:
            try:
                async with asyncio.timeout(o.sync_timeout):
                    await factory.start()
            except Exception:
                await answered.wait()  # /version's outcome first: a refused discovery is then told as discovery's
                raise

        # Together, on the connection the first of them dials: discovery does not wait a round trip for /version
        # (whose failure, the usual one, cancels discovery's retries).
        await wait_all(hello(), discover())
        served = len(factory.last_pass.resources) if factory.last_pass is not None else 0
        self.conditions[ConditionType.DISCOVERED].set(True, "Discovered", f"{served} GVRs served")
        return client, factory

    def _adopt(self, warm: "Member") -> tuple[ApiClient, ClusterSource]:
        """CONNECTING -> DISCOVERING on what ``warm`` (of this config, brought up ahead) has: its client, factory
        and conditions become this member's, to release or serve (nothing is connected, nothing listed)."""
        assert warm.client is not None and warm.factory is not None
        client, factory = self.client, self.factory = warm.client, warm.factory
        warm.client = warm.factory = None
        for t in (ConditionType.CONNECTED, ConditionType.DISCOVERED):
            self.conditions[t] = warm.conditions[t]
        self.to(MemberState.DISCOVERING)
        return client, factory

    async def warm_up(self, env: MemberEnv) -> None:
        """Bring the member up to synced informers (or ``sync_timeout``: its adopter waits on) and no further:
        never engaged, so nothing reads or writes through it; a member of the same config adopts it
        (``WarmMembers``), or it is released."""
        await self._connect(env)
        self.to(MemberState.SYNCING)
        assert self.client is not None and self.factory is not None
        cluster = Cluster(self.name, self.config.source, self.client, self.factory, CLOSED)
        await _wait_synced(cluster, env.required, env.options.sync_timeout, f"{env.component} warm {id(self)}")

    async def _keep_current(self, env: MemberEnv, cluster: Cluster) -> None:
        """Keep the conditions current while engaged, where they change: on its factory's notifications (an
        informer added, synced, failed or recovered), when the server answers again after a failed probe, when a
        discovery pass would count as wedged, every second while Discovered is false, and by the ``/version``
        probe. A member the server said anything for (a watch event or bookmark, an answer to any request) since
        the last round has shown it is there: only a quiet one is probed, so a fleet's idle cost does not grow by
        a request per member."""
        client = cluster.client
        log = logger.bind(component=env.component)
        connected = self.conditions[ConditionType.CONNECTED]
        loop = asyncio.get_running_loop()
        sub_id = f"{env.component} conditions {id(self)}"
        changes = cluster.factory.subscribe(sub_id)
        try:
            heard = self.heard()
            probe_at = loop.time() + env.options.probe_interval
            while True:
                look_again = self._refresh(cluster, env.required)
                wait = probe_at - loop.time()
                if look_again is not None:
                    wait = min(wait, look_again)
                if self.probe_failed_at is not None:
                    await wait_first(_next(changes), client.answered_again(self.probe_failed_at),
                                     timeout=max(wait, 0))
                else:
                    try:
                        async with asyncio.timeout(max(wait, 0)):
                            await _next(changes)
                    except TimeoutError:
                        pass
                if loop.time() < probe_at:
                    continue
                probe_at = loop.time() + env.options.probe_interval
                before, heard = heard, self.heard()
                if heard != before and connected.status:
                    continue
                answers = client.recoveries
                try:
                    await client.request("GET", "/version", timeout=env.options.connect_timeout)
                except Exception as e:
                    if connected.status:
                        log.warning("cluster {}: not reachable ({})", display_name(self.name), describe_error(e))
                    connected.set(False, type(e).__name__, describe_error(e))
                    self.probe_failed_at, self.watch_failed = answers, False
                else:
                    if connected.status is False:
                        log.info("cluster {}: reachable again", display_name(self.name))
                    connected.set(True, "Connected", connected.message if connected.reason == "Connected" else "")
                    self.probe_failed_at, self.watch_failed = None, False
                heard = self.heard()  # the probe's own answer says nothing about the next round
        finally:
            cluster.factory.unsubscribe(sub_id)

    async def release(self, env: MemberEnv) -> None:
        """Stop the member's factory and close its client (neither when they are the management cluster's), to
        the end even if cancelled meanwhile (a config gone while a retry releases)."""
        await finish(self._release_now(env))

    async def _release_now(self, env: MemberEnv) -> None:
        factory, client = self.factory, self.client
        try:
            if env.local_factory is not None and factory is env.local_factory:
                env.local_factory.release(env.component)  # the sidecar's own factory outlives the member
            elif factory is not None:
                await factory.shutdown()
            if client is not None and client is not env.management:
                await client.close()
        except Exception:  # a failed release must not end the member's task: it would never retry or stop
            logger.bind(component=env.component).exception(
                "cluster {}: stopping its informers or closing its connections failed", display_name(self.name))
        finally:
            self.factory = self.client = None

    # -- what it shows -----------------------------------------------------------------------------------
    def heard(self) -> tuple[int, int]:
        """What the member's server has said so far: the watch events (bookmarks included) of its running
        informers, and the answers to its client's requests."""
        events = self.factory.events_received() if self.factory is not None else 0
        answers = sum(n for (code, _), n in self.client.request_counts.codes.items() if code != NO_ANSWER) \
            if self.client is not None else 0
        return events, answers

    def _refresh(self, cluster: Cluster, required: Iterable[Any]) -> float | None:
        """Set the conditions from the watches and discovery as they are now; in how many seconds to look again
        without a notification (None: at the next one)."""
        conditions = self.conditions
        self._follow_watches(cluster)
        supervisor = cluster.factory.supervisor
        problems = supervisor.problems()
        if problems:
            conditions[ConditionType.DISCOVERED].set(False, "DiscoveryFailing", "; ".join(
                f"{h.name}: {h.last_error}" for h in problems))
        elif conditions[ConditionType.DISCOVERED].status is False:
            conditions[ConditionType.DISCOVERED].set(True, "Discovered")
        missing = cluster.not_synced(required)
        if missing:
            conditions[ConditionType.SYNCED].set(False, "NotSynced", "informers not synced or failing: " +
                                                 ", ".join(map(str, missing)))
        else:
            conditions[ConditionType.SYNCED].set(True, "Synced")
        # Nothing says when a wedged pass ends, or when a busy one becomes wedged: time says.
        return 1.0 if problems else supervisor.next_wedge_in()

    def _follow_watches(self, cluster: Cluster) -> None:
        """Connected as the engaged member's watches have it: false while one cannot reach the server, true again
        once none fails and the server has answered since (a watch reopened, or any other request after the
        probe's failure). A probe failure that no watch contradicts stands (the watches of a silently cut
        connection may not have noticed yet)."""
        connected = self.conditions[ConditionType.CONNECTED]
        failing = cluster.unreachable()
        if failing is not None:
            gvr, e = failing
            if connected.status:
                logger.warning("cluster {}: not reachable (watching {}: {})", display_name(self.name), gvr,
                               describe_error(e))
            connected.set(False, type(e).__name__, f"watching {gvr}: {describe_error(e)}")
            self.watch_failed = True
        elif connected.status is False and (self.watch_failed or (
                self.probe_failed_at is not None and cluster.client.recoveries > self.probe_failed_at)):
            logger.info("cluster {}: reachable again (its watches work)", display_name(self.name))
            connected.set(True, "Connected", "watching")
            self.probe_failed_at, self.watch_failed = None, False

    def shown_state(self, conditions: list[Condition]) -> MemberState:
        """The state as ``status()`` and the metrics show it: an engaged member is ``ready`` only while every
        condition holds, so that state and readiness never disagree; a superseded one is stopping."""
        if self.state is MemberState.READY and not all(c.status for c in conditions):
            return MemberState.DEGRADED
        if self.state in (MemberState.SUPERSEDED, MemberState.STOPPED):
            return MemberState.STOPPING
        return self.state

    def current_conditions(self) -> list[Condition]:
        """The conditions, in their order (kept current by the member's own task: reading changes nothing)."""
        return [self.conditions[t] for t in ConditionType]

    def status(self) -> dict[str, Any]:
        """Its ``/status`` row (without the name)."""
        conditions = self.current_conditions()
        state = self.shown_state(conditions)
        return {"source": self.config.source, "state": state.value, "ready": state is MemberState.READY,
                "attempts": self.attempts, "conditions": [c.as_dict() for c in conditions]}


def connect(config: ClusterConfig, management: ApiClient, allowed_exec_commands: Sequence[str]) -> ApiClient:
    """A client for ``config``, as its connection kind makes it (``provider.py``): the management client for the
    local cluster and its namespaces, a file's context loaded as kubectl would (trusted), or an untrusted kubeconfig
    under its rules; a new client speaks HTTP/2 as the management client does (the process's ``http2``)."""
    client = config.connection.client(config.source, management, allowed_exec_commands)
    if client is not management:
        client.http2 = management.http2
    return client


async def _next(changes: Subscription) -> None:
    """The next change; once the subscription has ended (its factory shut down), never."""
    try:
        await anext(changes)
    except StopAsyncIteration:
        await asyncio.Future()


async def _wait_synced(cluster: Cluster, required: frozenset[Any], timeout: float, sub_id: str) -> bool:
    """Wait until every required GVR the cluster serves has a synced informer; False after ``timeout``."""
    subscription = cluster.factory.subscribe(sub_id)

    async def synced() -> None:
        async for _ in subscription:
            if not cluster.not_synced(required):
                return

    try:
        return await wait_first(synced(), timeout=timeout) == 0
    finally:
        cluster.factory.unsubscribe(sub_id)
