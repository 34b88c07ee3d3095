"""Fakes of the unit tests: an informer source whose real informers the test feeds, probe controllers, a reconcile
that records its calls, and an ApiClient whose chosen requests fail or wait."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from informers import GVR, ApiClient, Backoff, FuncHandler, Notifier, SharedIndexInformer, wait_first
from informers.metrics import InformerMetrics

A, B = GVR("a.example.com", "v1", "as"), GVR("b.example.com", "v1", "bs")
_METRICS = InformerMetrics.for_registry(CollectorRegistry())


def obj(name, ns="ns", rv="1", labels=None, owners=()):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels or {},
                         "ownerReferences": [{"kind": "Owner", "name": o} for o in owners]}}


class LocalInformer(SharedIndexInformer):
    """A real informer whose cache the test feeds (``replace``/``apply``) in place of a reflector. Its handler
    tasks run, so removing a handler yields to the loop as on a live informer; ``remove_delay`` makes that
    removal slower, and ``removals`` records, per removal, whether the informer was already being stopped."""

    def __init__(self, gvr):
        super().__init__(None, gvr, metrics=_METRICS)
        self.reflector.run = asyncio.Event().wait  # no API server: the test is the reflector
        self.remove_delay = 0.0
        self.removals = []
        self.start()

    async def remove_event_handler(self, registration):
        if registration in self.registrations:
            self.removals.append(self._stopped)
            await asyncio.sleep(self.remove_delay)
        await super().remove_event_handler(registration)


class FakeSource:
    """An InformerSource behaving like the discovering factory: ``remove`` awaits the removal hooks (with
    ``hooks``; without, it drops an informer as if no hook were registered) while no longer listing the GVR, then
    stops and drops the informer, then notifies. It watches what it serves whatever is required, and explains
    nothing."""

    def __init__(self, hooks=True):
        self.notifier = Notifier()
        self.current: dict[GVR, LocalInformer] = {}
        self.removing: set[GVR] = set()
        self.made: list[LocalInformer] = []
        self.hooks = []
        self.awaits_hooks = hooks

    def add_removal_hook(self, hook):
        self.hooks.append(hook)
        return lambda: self.hooks.remove(hook)

    def require(self, owner, gvrs):
        pass

    def release(self, owner):
        pass

    def explain(self, gvr):
        return None

    def subscribe(self, id):
        return self.notifier.subscribe(id)

    def unsubscribe(self, id):
        self.notifier.unsubscribe(id)

    def informers(self):
        listed = {g: i for g, i in self.current.items() if g not in self.removing}
        synced = {g: i for g, i in listed.items() if i.has_synced()}
        return synced, [g for g in listed if g not in synced]

    def add(self, gvr, synced=True, objects=()):
        """Serve ``gvr`` with a new informer (the one in place, if any, is dropped without a hook, as when a
        GVR is removed and re-added within one notification)."""
        inf = LocalInformer(gvr)
        self.made.append(inf)
        if synced:
            inf.replace(list(objects), "1")
        self.current[gvr] = inf
        self.notifier.notify_all()
        return inf

    def sync(self, gvr):
        inf = self.current.get(gvr)
        if inf is not None and not inf.has_synced():
            inf.replace([], "1")
            self.notifier.notify_all()

    async def remove(self, gvr):
        inf = self.current.get(gvr)
        if inf is None:
            return
        self.removing.add(gvr)
        if self.awaits_hooks:
            await asyncio.gather(*(hook(gvr) for hook in self.hooks))
        self.removing.discard(gvr)
        del self.current[gvr]
        await inf.stop()
        self.notifier.notify_all()

    async def close(self):
        for inf in self.made:
            await inf.stop()


class Probe:
    """A controller whose instances record creates, contexts, concurrent runs and exits."""

    def __init__(self, name, stop_delay=0.0, create_errors=0, exit_after=None):
        self.name = name
        self.creates = 0
        self.running = 0
        self.max_running = 0
        self.stop_delay = stop_delay
        self.create_errors = create_errors
        self.exit_after = exit_after
        self.registered = []
        self.contexts = []

    def create(self, ctx):
        self.creates += 1
        self.contexts.append(ctx)
        if self.create_errors:
            self.create_errors -= 1
            raise RuntimeError("create failed")
        for gvr in ctx.informers:
            self.registered.append(ctx.add_event_handler(gvr, FuncHandler(on_add=lambda o, i: None, name="probe")))

        async def start(ctx):
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            try:
                if self.exit_after is not None:
                    await asyncio.sleep(self.exit_after)
                    self.exit_after = None
                    return
                await asyncio.Event().wait()
            finally:
                await asyncio.shield(asyncio.sleep(self.stop_delay))  # ignores cancellation this long
                self.running -= 1
        return start


def fast_backoff():
    return Backoff(initial=0.01, cap=0.05, jitter=0.0)


class Recorder:
    """A reconcile recording (time, request) per call, answering with ``script`` (results or exceptions) first,
    then None."""

    def __init__(self, *script):
        self.calls = []
        self.script = list(script)

    async def __call__(self, req):
        self.calls.append((asyncio.get_running_loop().time(), req))
        if self.script:
            answer = self.script.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return None

    @property
    def names(self):
        return [req.name for _, req in self.calls]

    def gaps(self):
        return [b - a for (a, _), (b, _) in zip(self.calls, self.calls[1:])]


async def run_with(c, ctx, scenario):
    """Run ``c`` while ``scenario`` runs; then cancel it. A controller that ends first fails the test."""
    assert await wait_first(scenario, c.run(ctx)) == 0


Match = Callable[[str, str], bool]


class FaultyClient(ApiClient):
    """An ApiClient whose chosen requests fail (``fail``) or wait for a gate (``hold``) before being sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._faults: list[list[Any]] = []  # [match, error factory, times left]
        self._holds: list[tuple[Match, asyncio.Event]] = []
        self.injected = 0

    def fail(self, match: Match, error: Callable[[], Exception], times: int) -> None:
        self._faults.append([match, error, times])

    def hold(self, match: Match) -> asyncio.Event:
        """Matching requests wait until the returned event is set."""
        gate = asyncio.Event()
        self._holds.append((match, gate))
        return gate

    async def request_bytes(self, method: str, path: str, *args: Any, **kwargs: Any) -> bytes:
        for fault in self._faults:
            if fault[2] > 0 and fault[0](method, path):
                fault[2] -= 1
                self.injected += 1
                raise fault[1]()
        for match, gate in self._holds:
            if match(method, path):
                await gate.wait()
        return await super().request_bytes(method, path, *args, **kwargs)
