"""ControllerManager against a fake InformerSource (real, unstarted informers marked synced by hand)."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from controllers import ControllerManager, ManagedController
from informers import GVR, Backoff, FuncHandler, Notifier, SharedIndexInformer
from informers.metrics import InformerMetrics

A, B = GVR("a.example.com", "v1", "as"), GVR("b.example.com", "v1", "bs")
_METRICS = InformerMetrics.for_registry(CollectorRegistry())


class FakeSource:
    def __init__(self) -> None:
        self.notifier = Notifier()
        self.current: dict[GVR, SharedIndexInformer] = {}

    def subscribe(self, id):
        return self.notifier.subscribe(id)

    def unsubscribe(self, id):
        self.notifier.unsubscribe(id)

    def informers(self):
        synced = {g: i for g, i in self.current.items() if i.has_synced()}
        return synced, [g for g in self.current if g not in synced]

    def add(self, gvr, synced=True):
        inf = SharedIndexInformer(None, gvr, metrics=_METRICS)  # never started: no client needed
        if synced:
            inf.replace([], "1")
        self.current[gvr] = inf
        self.notifier.notify_all()
        return inf

    def sync(self, gvr):
        inf = self.current.get(gvr)
        if inf is not None and not inf.has_synced():
            inf.replace([], "1")
            self.notifier.notify_all()

    def remove(self, gvr):
        if self.current.pop(gvr, None) is not None:
            self.notifier.notify_all()


class Probe:
    """A controller whose instances record creates, concurrent runs and exits."""

    def __init__(self, name, stop_delay=0.0, create_errors=0, exit_after=None):
        self.name = name
        self.creates = 0
        self.running = 0
        self.max_running = 0
        self.stop_delay = stop_delay
        self.create_errors = create_errors
        self.exit_after = exit_after
        self.registered = []

    def create(self, ctx):
        self.creates += 1
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
                await asyncio.shield(asyncio.sleep(self.stop_delay))
                self.running -= 1
        return start


def fast_backoff():
    return Backoff(initial=0.01, cap=0.05, jitter=0.0)


async def settle(cond, timeout=5.0):
    for _ in range(int(timeout / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not settled")


def manager(source, probes, **kw):
    specs = {p.name: ManagedController(req, p.create) for p, req in probes}
    return ControllerManager("test", source, specs, backoff=fast_backoff,
                             metrics_registry=CollectorRegistry(), **kw)


async def test_starts_only_when_all_required_are_synced_and_stops_when_one_goes():
    src = FakeSource()
    one, two = Probe("one"), Probe("two")
    m = manager(src, [(one, [A]), (two, [A, B])])
    assert m.name == "syncer-controller-manager-test"
    src.add(A)  # already there before start: the initial pass must start it
    src.add(B, synced=False)
    await m.start()
    try:
        await settle(lambda: one.running == 1)
        await asyncio.sleep(0.05)
        assert two.running == 0
        assert m.status()["two"].not_synced == [str(B)]
        src.sync(B)
        await settle(lambda: two.running == 1)
        src.remove(B)
        await settle(lambda: two.running == 0)
        assert one.running == 1 and m.status()["two"].missing == [str(B)]
        src.add(B)
        await settle(lambda: two.running == 1)
        assert two.creates == 2  # fresh create on every start
        assert m.status()["two"].restarts == 1
    finally:
        await m.stop()
    assert one.running == two.running == 0


async def test_create_errors_and_early_exits_are_retried_with_backoff():
    src = FakeSource()
    flaky, quitter = Probe("flaky", create_errors=2), Probe("quitter", exit_after=0.01)
    m = manager(src, [(flaky, [A]), (quitter, [A])])
    src.add(A)
    await m.start()
    try:
        await settle(lambda: flaky.running == 1)
        assert flaky.creates == 3
        st_ = m.status()["flaky"]
        assert st_.failures == 2 and "create failed" in st_.last_error
        await settle(lambda: quitter.creates == 2 and quitter.running == 1)
        assert "returned" in m.status()["quitter"].last_error
    finally:
        await m.stop()


async def test_slow_stop_never_overlaps_and_handlers_are_removed():
    src = FakeSource()
    slow = Probe("slow", stop_delay=0.2)
    m = manager(src, [(slow, [A, B])])
    src.add(A)
    src.add(B)
    await m.start()
    try:
        await settle(lambda: slow.running == 1)
        a_inf = src.current[A]
        assert len(a_inf.registrations) == 1
        src.remove(B)
        src.add(B)  # back at once: the old instance is still stopping
        await settle(lambda: slow.creates == 2 and slow.running == 1)
        assert slow.max_running == 1
        # the first instance's handler left the surviving informer; only the new one's is there
        assert len(a_inf.registrations) == 1 and a_inf.registrations[0] is slow.registered[-2]
    finally:
        await m.stop()
    assert a_inf.registrations == []


async def test_stuck_controller_is_reported_and_not_restarted_until_it_exits():
    src = FakeSource()
    stuck = Probe("stuck", stop_delay=0.3)
    m = manager(src, [(stuck, [A])], stop_timeout=0.05)
    src.add(A)
    await m.start()
    try:
        await settle(lambda: stuck.running == 1)
        src.remove(A)
        await settle(lambda: m.status()["stuck"].state == "stuck")
        assert not m.health()[0]["healthy"]
        src.add(A)
        await asyncio.sleep(0.1)
        assert stuck.creates == 1  # not while the old one still runs
        await settle(lambda: stuck.creates == 2 and stuck.running == 1)
        assert stuck.max_running == 1
    finally:
        await m.stop()


async def test_replaced_informer_between_passes_restarts_the_controller():
    src = FakeSource()
    p = Probe("p")
    m = manager(src, [(p, [A])])
    src.add(A)
    await m.start()
    try:
        await settle(lambda: p.running == 1)
        src.current[A] = SharedIndexInformer(None, A, metrics=_METRICS)
        src.current[A].replace([], "1")
        src.notifier.notify_all()  # one tick for remove + re-add
        await settle(lambda: p.creates == 2 and p.running == 1)
    finally:
        await m.stop()


OPS = st.lists(st.sampled_from(["add A", "sync A", "remove A", "add B", "sync B", "remove B", "yield"]),
               max_size=25)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_flaps_converge_without_overlap_or_leaks(ops):
    async def scenario():
        before = asyncio.all_tasks()
        src = FakeSource()
        one, both = Probe("one", stop_delay=0.001), Probe("both")
        m = manager(src, [(one, [A]), (both, [A, B])])
        await m.start()
        for op in ops:
            verb, _, name = op.partition(" ")
            gvr = A if name == "A" else B
            if verb == "add":
                src.add(gvr, synced=False)
            elif verb == "sync":
                src.sync(gvr)
            elif verb == "remove":
                src.remove(gvr)
            await asyncio.sleep(0)
        synced, _ = src.informers()
        want_one, want_both = int(A in synced), int(A in synced and B in synced)
        await settle(lambda: one.running == want_one and both.running == want_both
                     and m.status()["one"].state == ("running" if want_one else "waiting"), 3)
        assert one.max_running <= 1 and both.max_running <= 1
        await m.stop()
        assert one.running == both.running == 0
        assert asyncio.all_tasks() - before == set()

    asyncio.run(scenario())
