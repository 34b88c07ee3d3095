"""ControllerManager against a fake InformerSource whose informers are real ones fed by the test."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loguru import logger
from prometheus_client import CollectorRegistry

from controllers import (
    Controller, ControllerManager, ItemExponentialFailureRateLimiter, ManagedController,
)
from controllers.health import HealthItem
from informers import Backoff, FuncHandler
from informers.discovery import NOTHING_PROVIDES, not_served
from tests.fakes import A, B, FakeSource, Probe, fast_backoff, obj
from tests.helpers import nothing_within, settle


def manager(source, probes, **kw):
    specs = {p.name: ManagedController(req, p.create) for p, req in probes}
    kw.setdefault("backoff", fast_backoff)
    return ControllerManager("test", source, specs, metrics_registry=CollectorRegistry(), **kw)


async def test_starts_only_when_all_required_are_synced_and_stops_when_one_goes(sources):
    src = sources()
    one, two = Probe("one"), Probe("two")
    m = manager(src, [(one, [A]), (two, [A, B])])
    assert m.name == "syncer-controller-manager-test"
    src.add(A)  # already there before start: the initial pass must start it
    src.add(B, synced=False)
    await m.start()
    try:
        await settle(lambda: one.running == 1 and m.status()["two"].not_synced == [str(B)])
        assert two.creates == 0 and m.status()["two"].state == "waiting"
        src.sync(B)
        await settle(lambda: two.running == 1)
        await src.remove(B)
        await settle(lambda: two.running == 0)
        assert one.running == 1 and m.status()["two"].missing == [f"{B} (not served)"]
        src.add(B)
        await settle(lambda: two.running == 1)
        assert two.creates == 2  # fresh create on every start
        assert m.status()["two"].restarts == 1
    finally:
        assert await m.stop() == []
    assert one.running == two.running == 0 and m.alive() == []


async def test_create_errors_and_early_exits_are_retried_with_backoff(sources):
    src = sources()
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


async def test_a_failure_waits_its_backoff_even_if_a_pass_runs_during_the_release(sources):
    # Defect: the instance was forgotten before its handlers were released and the failure recorded, so a pass
    # during the release started the next instance at once, which the late failure then marked "backoff" for good.
    src = sources()
    inf = src.add(A)
    inf.remove_delay = 0.2
    quitter = Probe("quitter", exit_after=0.0)
    m = manager(src, [(quitter, [A])], backoff=lambda: Backoff(initial=0.5, cap=0.5, jitter=0.0))
    loop = asyncio.get_running_loop()
    await m.start()
    try:
        await settle(lambda: inf.removals == [False])  # the first instance returned and is releasing its handler
        exited = loop.time()
        src.notifier.notify_all()  # a pass now
        await settle(lambda: quitter.creates == 2)
        assert loop.time() - exited >= 0.45
        await settle(lambda: m.status()["quitter"].state == "running")
        assert m.health() == [HealthItem("quitter", True, "")]
    finally:
        await m.stop()


async def test_stops_are_concurrent_and_do_not_hold_back_other_starts(sources):
    src = sources(hooks=False)
    slow1, slow2, other = Probe("slow1", stop_delay=1.0), Probe("slow2", stop_delay=1.0), Probe("other")
    m = manager(src, [(slow1, [A]), (slow2, [A]), (other, [B])])
    src.add(A)
    src.add(B, synced=False)
    await m.start()
    try:
        await settle(lambda: slow1.running == slow2.running == 1)
        await src.remove(A)
        src.sync(B)  # the same pass stops two slow controllers and may start another
        await settle(lambda: other.running == 1, 0.5)
        assert m.status()["slow1"].state == m.status()["slow2"].state == "stopping"
        await settle(lambda: slow1.running == slow2.running == 0, 1.6)  # together: 1 s, not 2
    finally:
        await m.stop()


async def test_stopping_during_an_async_create_releases_its_handlers(sources):
    src = sources()
    inf = src.add(A)
    entered = asyncio.Event()

    async def create(ctx):
        ctx.add_event_handler(A, FuncHandler(name="half-made"))
        entered.set()
        await asyncio.Event().wait()

    m = ControllerManager("test", src, {"hang": ManagedController([A], create)}, backoff=fast_backoff,
                          metrics_registry=CollectorRegistry())
    await m.start()
    await asyncio.wait_for(entered.wait(), 5)
    assert len(inf.registrations) == 1
    state_before = m.status()["hang"].state
    stuck = await m.stop()
    assert inf.registrations == []
    assert state_before == "starting" and stuck == [] and m.status()["hang"].state == "waiting"


async def test_a_hung_create_times_out_is_retried_and_blocks_nobody(sources):
    src = sources()
    a_inf = src.add(A)
    src.add(B)
    hung_creates = 0

    async def hang(ctx):
        nonlocal hung_creates
        hung_creates += 1
        ctx.add_event_handler(A, FuncHandler(name="hung"))
        await asyncio.Event().wait()

    gone, other = Probe("gone"), Probe("other")
    specs = {"gone": ManagedController([B], gone.create), "hung": ManagedController([A], hang),
             "other": ManagedController([A], other.create)}
    m = ControllerManager("test", src, specs, start_timeout=0.3, backoff=fast_backoff,
                          metrics_registry=CollectorRegistry())
    await m.start()
    try:
        await settle(lambda: other.running == 1 and gone.running == 1, 1)  # listed after the hung one
        assert m.status()["hung"].state == "starting"
        await src.remove(B)  # listed before it: still follows its GVR
        await settle(lambda: gone.running == 0 and m.status()["gone"].state == "waiting", 1)
        await settle(lambda: hung_creates >= 2, 3)
        hung = m.status()["hung"]
        assert hung.failures >= 1 and hung.last_error == "create: TimeoutError: create() did not return within 0.3s"
        assert hung.state in ("starting", "backoff")
        assert len([r for r in a_inf.registrations if r.name == "hung"]) == 1  # the timed-out one's was released
        passes = m.passes
        src.notifier.notify_all()
        await settle(lambda: m.passes > passes, 1)
    finally:
        await m.stop()


async def test_reconcile_errors_show_in_the_status(sources):
    src = sources()
    src.add(A, objects=[obj("x")])

    async def reconcile(req):
        raise ValueError(f"cannot reconcile {req}")

    def create(ctx):
        return Controller("failing", reconcile, rate_limiter=ItemExponentialFailureRateLimiter(0.01, 0.02),
                          metrics_registry=CollectorRegistry()).watch(A).run

    m = ControllerManager("test", src, {"failing": ManagedController([A], create)},
                          metrics_registry=CollectorRegistry())
    await m.start()
    try:
        await settle(lambda: m.status()["failing"].reconciles.errors >= 3)
        d = m.status()["failing"].as_dict()
        assert d["state"] == "running" and d["healthy"]
        assert d["reconcile_errors"] >= 3 and d["reconciles"] >= d["reconcile_errors"]
        assert d["last_reconcile_error"] == "ValueError: cannot reconcile ns/x" and d["last_reconcile_error_at"] > 0
    finally:
        await m.stop()


async def test_removal_hook_stops_dependent_controllers_before_the_informer_goes(sources):
    src = sources()
    a_inf = src.add(A)
    slow, bystander = Probe("slow", stop_delay=0.2), Probe("bystander")
    m = manager(src, [(slow, [A]), (bystander, [B])])
    await m.start()
    try:
        await settle(lambda: slow.running == 1)
        await src.remove(A)
        # stopped while the cache was whole, its handler removed by its own clean-up, not by the teardown;
        # and not restarted on the informer being removed when its stop woke a pass
        assert slow.running == 0 and a_inf.removals == [False] and slow.creates == 1
        assert m.status()["slow"].state == "waiting"
        src.add(A)
        await settle(lambda: slow.running == 1 and slow.creates == 2)
    finally:
        await m.stop()
    assert src.hooks == []


async def test_the_fence_reaches_every_context(sources):
    src = sources()
    src.add(A)
    p = Probe("p")

    class Term:
        def valid(self):
            return True

        def remaining(self):
            return 10.0

    term = Term()
    m = manager(src, [(p, [A])], fence=term)
    await m.start()
    try:
        await settle(lambda: p.running == 1)
        assert p.contexts[-1].fence is term
    finally:
        await m.stop()


async def test_the_priority_queue_setting_reaches_every_context(sources):
    src = sources()
    src.add(A)
    on, off = Probe("on"), Probe("off")
    managers = [manager(src, [(on, [A])]), manager(src, [(off, [A])], priority_queue=False)]
    for m in managers:
        await m.start()
    try:
        await settle(lambda: on.running == off.running == 1)
        assert (on.contexts[-1].priority_queue, off.contexts[-1].priority_queue) == (True, False)
    finally:
        for m in managers:
            await m.stop()


async def test_no_controller_starts_once_the_term_has_ended(sources):
    src = sources()
    src.add(A)
    p = Probe("p")

    class Ended:
        def valid(self):
            return False

        def remaining(self):
            return 0.0

    m = manager(src, [(p, [A])], fence=Ended())
    await m.start()
    try:
        await settle(lambda: m.passes >= 1)
        await nothing_within(lambda: p.creates > 0, 0.2)
    finally:
        await m.stop()


async def test_stuck_controller_is_reported_and_not_restarted_until_it_exits(sources):
    src = sources()
    stuck = Probe("stuck", stop_delay=0.5)
    m = manager(src, [(stuck, [A])], stop_timeout=0.05)
    src.add(A)
    await m.start()
    try:
        await settle(lambda: stuck.running == 1)
        await src.remove(A)
        assert m.status()["stuck"].state == "stuck" and m.alive() == ["stuck"]
        assert not m.health()[0].healthy
        src.add(A)
        await settle(lambda: m.status()["stuck"].missing == [])  # a pass saw A back
        assert stuck.creates == 1  # not while the old one still runs
        await settle(lambda: stuck.creates == 2 and stuck.running == 1)
        assert stuck.max_running == 1
    finally:
        await m.stop()
        await settle(lambda: m.alive() == [])  # the second instance is as slow to stop


async def test_stop_returns_the_controllers_still_alive_after_the_timeout(sources):
    src = sources()
    stuck, fine = Probe("stuck", stop_delay=0.5), Probe("fine")
    m = manager(src, [(stuck, [A]), (fine, [A])], stop_timeout=0.05)
    src.add(A)
    await m.start()
    await settle(lambda: stuck.running == fine.running == 1)
    assert sorted(m.alive()) == ["fine", "stuck"]
    assert await m.stop() == ["stuck"]
    assert m.status()["stuck"].state == "stuck" and fine.running == 0
    await settle(lambda: m.alive() == [] and m.status()["stuck"].state == "waiting")
    assert stuck.running == 0


async def test_replaced_informer_between_passes_restarts_the_controller(sources):
    src = sources()
    p = Probe("p")
    m = manager(src, [(p, [A])])
    src.add(A)
    await m.start()
    try:
        await settle(lambda: p.running == 1)
        src.add(A)  # removed and re-added within one tick: a new informer
        await settle(lambda: p.creates == 2 and p.running == 1)
        assert p.contexts[-1].informers[A] is src.current[A]
    finally:
        await m.stop()


OPS = st.lists(st.sampled_from(["add A", "sync A", "remove A", "replace A", "add B", "sync B", "remove B",
                                "yield"]), max_size=25)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.booleans())
def test_random_flaps_converge_without_overlap_or_leaks(ops, hooks):
    async def scenario():
        before = asyncio.all_tasks()
        src = FakeSource(hooks)
        one, both = Probe("one", stop_delay=0.001), Probe("both")
        m = manager(src, [(one, [A]), (both, [A, B])])
        await m.start()
        for op in ops:
            verb, _, name = op.partition(" ")
            gvr = A if name == "A" else B
            if verb == "add" and gvr not in src.current or verb == "replace":
                src.add(gvr, synced=False)
            elif verb == "sync":
                src.sync(gvr)
            elif verb == "remove":
                await src.remove(gvr)
            await asyncio.sleep(0)
        synced, _ = src.informers()
        want_one, want_both = int(A in synced), int(A in synced and B in synced)
        await settle(lambda: one.running == want_one and both.running == want_both
                     and m.status()["one"].state == ("running" if want_one else "waiting"), 3)
        assert one.max_running <= 1 and both.max_running <= 1
        assert await m.stop() == []
        assert one.running == both.running == 0
        await src.close()
        assert asyncio.all_tasks() - before == set()

    asyncio.run(scenario())


async def test_a_metadata_only_requirement_waits_for_that_informer_not_the_full_one(sources):
    src = sources()
    probe = Probe("meta")
    m = manager(src, [(probe, [A.only_metadata()])])
    src.add(A)
    src.add(A.only_metadata(), synced=False)
    await m.start()
    try:
        await settle(lambda: m.status()["meta"].not_synced == [f"{A} (metadata)"])
        await nothing_within(lambda: probe.creates, 0.05)
        src.sync(A.only_metadata())
        await settle(lambda: probe.running == 1)
        assert list(probe.contexts[0].informers) == [A.only_metadata()]
        await src.remove(A)  # the full informer going is none of its business
        await nothing_within(lambda: probe.running == 0, 0.05)
        await src.remove(A.only_metadata())
        await settle(lambda: probe.running == 0)
        assert m.status()["meta"].missing == [f"{A} (metadata) (not served)"]
    finally:
        assert await m.stop() == []



class _ExplainingSource(FakeSource):
    """A FakeSource that explains as the discovering factory does a GVR that nothing provides."""

    def explain(self, gvr):
        return None if gvr in self.current else not_served(gvr.full, self.current)


async def test_a_gvr_the_plugin_says_the_user_installs_is_waited_for_at_info_naming_what_provides_it():
    # A first run before the user applied the CRD that the plugin names: INFO, and what to apply. A GVR that
    # nothing provides and no plugin names (a typo) stays a WARNING.
    src = _ExplainingSource()
    widgets, typo = Probe("widgets"), Probe("typo")
    hint = "the CRD in crds/a.json (kubectl apply -f crds/a.json)"
    m = ControllerManager("test", src, {"widgets": ManagedController([A], widgets.create, provided_by={A: hint}),
                                        "typo": ManagedController([B], typo.create)},
                          backoff=fast_backoff, metrics_registry=CollectorRegistry())
    records: list[dict] = []
    sink = logger.add(lambda msg: records.append(msg.record), level="INFO",
                      filter=lambda r: "waits for" in r["message"])
    await m.start()
    try:
        await settle(lambda: len(records) == 2)
        lines = sorted((r["level"].name, r["message"]) for r in records)
        assert lines == [("INFO", f"controller widgets waits for {A}: {NOTHING_PROVIDES}; it would be provided by "
                                  f"{hint}"),
                         ("WARNING", f"controller typo waits for {B}: {NOTHING_PROVIDES}")], lines
        assert m.status()["widgets"].missing == [f"{A} ({NOTHING_PROVIDES}; it would be provided by {hint})"]
        src.add(A)
        await settle(lambda: widgets.running == 1)
    finally:
        logger.remove(sink)
        assert await m.stop() == []
        await src.close()


def test_provided_by_names_only_required_gvrs() -> None:
    with pytest.raises(ValueError, match=f"provided_by names GVRs the controller does not require: {B}"):
        ManagedController([A], lambda ctx: None, provided_by={B: "the CRD in b.json"})
