"""The Controller's builder (for_/owns/watches), predicates, the ReconcileContext and the reconcile metrics,
against real informers fed by the test (no API server)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from controllers import (
    Controller, ControllerContext, ItemExponentialFailureRateLimiter, ReconcileContext, Request, Result,
    TerminalError, WatchEvent, and_, annotations_changed, generation_changed, labels_changed, not_, or_,
    resource_version_changed,
)

from tests.fakes import A, B, Recorder, run_with
from tests.helpers import nothing_within, settle

X = Request("x", "ns")


def res(name, gen=1, rv="1", labels=None, annotations=None, kind="A", owner=None, ns="ns"):
    meta = {"name": name, "namespace": ns, "generation": gen, "resourceVersion": rv, "uid": f"uid-{name}",
            "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "a.example.com/v1", "kind": "A", "name": owner,
                                    "uid": f"uid-{owner}", "controller": True}]
    return {"apiVersion": f"{'a' if kind == 'A' else 'b'}.example.com/v1", "kind": kind, "metadata": meta}


def update(old, new):
    return WatchEvent("update", old, new)


# -- predicates --------------------------------------------------------------------------------------------
def test_builtin_predicates_judge_updates_and_pass_adds_and_deletes():
    base = res("x")
    cases = {
        generation_changed: res("x", gen=2, rv="2"),
        labels_changed: res("x", rv="2", labels={"a": "b"}),
        annotations_changed: res("x", rv="2", annotations={"a": "b"}),
        resource_version_changed: res("x", rv="2"),
    }
    for predicate, changed in cases.items():
        assert predicate(update(base, changed)), predicate.__name__
        assert not predicate(update(base, base)), predicate.__name__
        assert predicate(WatchEvent("add", None, base)) and predicate(WatchEvent("delete", base, None))
    # a status-only write: new resourceVersion, same generation
    status_write = res("x", rv="2") | {"status": {"ready": True}}
    assert not generation_changed(update(base, status_write)) and resource_version_changed(update(base, status_write))
    # absent and empty labels are the same
    bare = res("x")
    del bare["metadata"]["labels"]
    assert not labels_changed(update(bare, base))


def test_predicate_combinators():
    spec = update(res("x"), res("x", gen=2, rv="2"))
    label = update(res("x"), res("x", rv="2", labels={"k": "v"}))
    add = WatchEvent("add", None, res("x"))
    either = or_(generation_changed, labels_changed)
    assert either(spec) and either(label) and not either(update(res("x"), res("x", rv="2")))
    both = and_(generation_changed, labels_changed)
    assert not both(spec) and not both(label) and both(update(res("x"), res("x", gen=2, labels={"k": "v"})))
    assert not_(generation_changed)(label) and not not_(generation_changed)(spec)
    assert not not_(generation_changed)(add)  # like controller-runtime's Not: adds are negated too
    assert WatchEvent("delete", res("x"), None).obj["metadata"]["name"] == "x"


async def test_predicates_see_each_event_and_tombstones(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    seen: list[WatchEvent] = []

    def record(event):
        seen.append(event)
        return True

    rec = Recorder()
    c = controller(rec).for_(A, predicates=[record])

    async def scenario():
        await settle(lambda: len(seen) == 1)
        inf.apply("MODIFIED", res("x", rv="2", labels={"k": "v"}))
        inf.apply("DELETED", res("x", rv="3"))
        inf.apply("ADDED", res("y", rv="4"))
        inf.replace([], "5")  # y vanished during a gap: a tombstone
        await settle(lambda: len(seen) == 5)
        assert [(e.type, e.state_unknown) for e in seen] == [
            ("add", False), ("update", False), ("delete", False), ("add", False), ("delete", True)]
        assert seen[1].old["metadata"]["resourceVersion"] == "1" and seen[1].new["metadata"]["labels"] == {"k": "v"}
        assert seen[4].old["metadata"]["name"] == "y" and seen[4].new is None
        await settle(lambda: rec.names[-1] == "y")

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_generation_changed_drops_status_writes_in_a_controller(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    rec = Recorder()
    c = controller(rec).for_(A, predicates=[generation_changed])

    async def scenario():
        await settle(lambda: rec.names == ["x"])
        inf.apply("MODIFIED", res("x", rv="2") | {"status": {"observedGeneration": 1}})
        await nothing_within(lambda: len(rec.calls) > 1, 0.05)
        inf.apply("MODIFIED", res("x", gen=2, rv="3"))
        await settle(lambda: rec.names == ["x", "x"])

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


# -- building ----------------------------------------------------------------------------------------------
def controller(reconcile, **kw):
    return Controller("c", reconcile, rate_limiter=ItemExponentialFailureRateLimiter(0.001, 0.008),
                      metrics_registry=kw.pop("metrics_registry", None) or CollectorRegistry(), **kw)


async def _finalize(req, rc, obj):
    return None


def test_builder_mistakes_are_refused_when_built():
    c = controller(Recorder()).for_(A)
    with pytest.raises(ValueError, match=r"for_\(\) was already called \(for as.v1.a.example.com\)"):
        c.for_(B)
    with pytest.raises(ValueError, match="give both finalizer= and finalize="):
        controller(Recorder(), finalizer="example.com/f")

    def sync_finalize(req, rc, obj):
        return None

    with pytest.raises(TypeError, match="finalize .*sync_finalize is not a coroutine function"):
        controller(Recorder(), finalizer="example.com/f", finalize=sync_finalize)
    assert c.watch == c.watches  # the old name is an alias


async def test_owns_or_a_finalizer_without_for_fails_the_run(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    ctx = ControllerContext("c", {A: inf}, src)
    with pytest.raises(ValueError, match=r"owns\(\) needs the primary resource"):
        await controller(Recorder()).owns(A).run(ctx)
    with pytest.raises(ValueError, match="a finalizer needs the primary resource"):
        await controller(Recorder(), finalizer="example.com/f", finalize=_finalize).watches(A).run(ctx)
    with pytest.raises(RuntimeError, match="controller c has no API client"):
        await controller(Recorder(), finalizer="example.com/f", finalize=_finalize).for_(A).run(ctx)
    assert inf.registrations == []


async def test_owns_maps_to_the_controller_owner_of_the_primary_kind(sources):
    src = sources()
    primary = src.add(A, objects=[res("o1"), res("o2")])
    owned = src.add(B, objects=[res("child", kind="B", owner="o1")])
    rec = Recorder()
    c = controller(rec, workers=2).for_(A, predicates=[generation_changed]).owns(B)

    async def scenario():
        await settle(lambda: sorted(rec.names) == ["o1", "o1", "o2"] or sorted(rec.names) == ["o1", "o2"])
        await nothing_within(lambda: len(rec.calls) > 3, 0.05)
        rec.calls.clear()
        owned.apply("MODIFIED", res("child", kind="B", rv="2", owner="o2"))  # adopted by o2: both are told
        await settle(lambda: sorted(rec.names) == ["o1", "o2"])
        rec.calls.clear()
        owned.apply("DELETED", res("child", kind="B", rv="3", owner="o2"))
        await settle(lambda: rec.names == ["o2"])
        # an owner of another kind, or a non-controller reference, maps to nothing
        other = res("stray", kind="B", owner="o1")
        other["metadata"]["ownerReferences"][0]["kind"] = "Other"
        plain = res("plain", kind="B", owner="o1")
        plain["metadata"]["ownerReferences"][0]["controller"] = False
        owned.apply("ADDED", other)
        owned.apply("ADDED", plain)
        await nothing_within(lambda: len(rec.calls) > 1, 0.05)
        assert [r.name for r in primary.registrations] == [r.name for r in owned.registrations] == ["c"]

    await run_with(c, ControllerContext("c", {A: primary, B: owned}, src), scenario())


async def test_handlers_sharing_an_informer_are_named_apart(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    c = controller(Recorder()).for_(A).owns(A).watches(A)

    async def scenario():
        await settle(lambda: [r.name for r in inf.registrations] == ["c", "c/owns", "c/watches"])

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


# -- the reconcile context ---------------------------------------------------------------------------------
async def test_a_two_argument_reconcile_gets_its_context(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    got: list[tuple[Request, ReconcileContext]] = []

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        got.append((req, rc))
        rc.log.info("reconciling")

    c = controller(reconcile).for_(A)
    ctx = ControllerContext("c", {A: inf}, src)

    async def scenario():
        await settle(lambda: len(got) == 1)
        req, rc = got[0]
        assert req == X and rc.request is req and rc.ctx is ctx and rc.gvr == A
        assert rc.lister().get("x", "ns")["metadata"]["uid"] == "uid-x" and rc.lister(A) is inf.lister
        assert rc.log is rc.log  # bound once
        with pytest.raises(RuntimeError, match="controller c has no API client: pass client= to the "
                                               "ControllerManager"):
            rc.client
        with pytest.raises(RuntimeError, match="controller c records no events: it has no API client"):
            rc.events

    await run_with(c, ctx, scenario())


async def test_a_context_without_a_primary_resource_says_so(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    errors = []

    async def reconcile(req, rc):
        try:
            rc.lister()
        except RuntimeError as e:
            errors.append(str(e))

    c = controller(reconcile).watches(A)

    async def scenario():
        await settle(lambda: errors == ["controller c has no primary resource: declare it with for_(gvr)"])

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_a_controller_runs_on_bare_informers_without_a_context(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    rec = Recorder()
    c = controller(rec).for_(inf)

    async def scenario():
        await settle(lambda: rec.names == ["x"])

    await run_with(c, None, scenario())
    assert inf.registrations == []


# -- metrics -----------------------------------------------------------------------------------------------
async def test_reconcile_metrics_use_controller_runtimes_names(sources):
    src = sources()
    inf = src.add(A, objects=[res("x")])
    registry = CollectorRegistry()
    rec = Recorder(Result(requeue=True), Result(requeue_after=0.01), RuntimeError("boom"), TerminalError("bad"))
    c = controller(rec, workers=3, metrics_registry=registry).for_(A)

    def sample(name, **labels):
        return registry.get_sample_value(name, {"controller": "c", **labels})

    async def scenario():
        await settle(lambda: len(rec.calls) == 4)
        inf.apply("MODIFIED", res("x", rv="2"))  # the terminal error waits for a change
        await settle(lambda: len(rec.calls) == 5 and sample("controller_runtime_reconcile_total", result="success"))
        totals = {r: sample("controller_runtime_reconcile_total", result=r)
                  for r in ("success", "error", "requeue", "requeue_after")}
        assert totals == {"success": 1, "error": 2, "requeue": 1, "requeue_after": 1}
        assert sample("controller_runtime_reconcile_errors_total") == 2
        assert sample("controller_runtime_terminal_reconcile_errors_total") == 1
        assert sample("controller_runtime_reconcile_time_seconds_count") == 5
        assert sample("controller_runtime_reconcile_time_seconds_bucket", le="+Inf") == 5
        assert 0 <= sample("controller_runtime_reconcile_time_seconds_sum") < 1
        assert sample("controller_runtime_max_concurrent_reconciles") == 3
        assert sample("controller_runtime_active_workers") == 0

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_active_workers_counts_reconciles_in_progress_and_counts_survive_a_restart(sources):
    src = sources()
    inf = src.add(A, objects=[res("x"), res("y"), res("z")])
    registry = CollectorRegistry()
    release = asyncio.Event()

    async def slow(req):
        await release.wait()

    def active():
        return registry.get_sample_value("controller_runtime_active_workers", {"controller": "c"})

    async def scenario():
        await settle(lambda: active() == 2)  # two workers, three objects
        release.set()
        await settle(lambda: active() == 0)

    c = controller(slow, workers=2, metrics_registry=registry).for_(A)
    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())
    again = controller(slow, workers=1, metrics_registry=registry).for_(A)

    async def more():
        await settle(lambda: registry.get_sample_value("controller_runtime_reconcile_total",
                                                       {"controller": "c", "result": "success"}) == 6)
        assert registry.get_sample_value("controller_runtime_max_concurrent_reconciles", {"controller": "c"}) == 1

    await run_with(again, ControllerContext("c", {A: inf}, src), more())


# -- metadata only -----------------------------------------------------------------------------------------
def partial(name, **kw):
    """``res(name, **kw)`` as a metadata-only informer caches it."""
    return {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": res(name, **kw)["metadata"]}


async def test_metadata_only_sources_take_their_events_and_the_primary_cache_from_metadata_informers(sources):
    src = sources()
    full_a, meta_a = src.add(A, objects=[res("x")]), src.add(A.only_metadata(), objects=[partial("x")])
    full_b, meta_b = src.add(B, objects=[res("y", kind="B")]), src.add(B.only_metadata(), objects=[partial("y")])
    got = []

    async def reconcile(req, rc):
        got.append((req.name, rc.gvr, rc.lister().get(req.name, req.namespace)))

    c = controller(reconcile).for_(A, metadata_only=True).watches(B, metadata_only=True)

    async def scenario():
        await settle(lambda: sorted(name for name, _, _ in got) == ["x", "y"])
        assert {(name, gvr) for name, gvr, _ in got} == {("x", A.only_metadata()), ("y", A.only_metadata())}
        assert next(obj for name, _, obj in got if name == "x") == partial("x")
        assert [r.name for r in meta_a.registrations] == [r.name for r in meta_b.registrations] == ["c"]
        assert full_a.registrations == full_b.registrations == []
        got.clear()
        full_b.apply("MODIFIED", res("z", kind="B", rv="2"))
        await nothing_within(lambda: got, 0.05)
        meta_b.apply("ADDED", partial("z", rv="2"))
        await settle(lambda: [name for name, _, _ in got] == ["z"])

    # Only the metadata keys are required: the full informers are in the source, not in the context.
    await run_with(c, ControllerContext("c", {A.only_metadata(): meta_a, B.only_metadata(): meta_b}, src),
                   scenario())


async def test_owns_metadata_only_maps_partial_objects_to_their_controller_owner(sources):
    src = sources()
    primary = src.add(A, objects=[res("o1"), res("o2")])
    owned = src.add(B.only_metadata(), objects=[partial("child", kind="B", owner="o1")])
    rec = Recorder()
    c = controller(rec).for_(A).owns(B, metadata_only=True)

    async def scenario():
        await settle(lambda: sorted(set(rec.names)) == ["o1", "o2"])
        rec.calls.clear()
        owned.apply("MODIFIED", partial("child", kind="B", rv="2", owner="o2"))
        await settle(lambda: sorted(rec.names) == ["o1", "o2"])

    await run_with(c, ControllerContext("c", {A: primary, B.only_metadata(): owned}, src), scenario())


async def test_metadata_only_mistakes_say_what_to_do(sources):
    src = sources()
    full = src.add(A, objects=[res("x")])
    with pytest.raises(ValueError, match=r"controller c: metadata_only=True, but the informer given caches whole "
                                         r"as.v1.a.example.com objects"):
        controller(Recorder()).for_(full, metadata_only=True)
    meta = src.add(A.only_metadata(), objects=[partial("x")])
    assert controller(Recorder()).for_(meta, metadata_only=True)._primary == A.only_metadata()
    # owns() needs the primary kind, which a metadata cache does not tell without a client
    with pytest.raises(ValueError, match=r"cannot tell the kind of as.v1.a.example.com \(metadata\) for owns\(\) "
                                         "without an API client"):
        await controller(Recorder()).for_(A, metadata_only=True).owns(B).run(
            ControllerContext("c", {A.only_metadata(): meta}, src))
    # requiring the GVR does not bring its metadata-only informer
    with pytest.raises(KeyError, match=r"no synced informer for bs.v1.b.example.com \(metadata\) \(require "
                                       r"gvr.only_metadata\(\)"):
        await controller(Recorder()).for_(A).watches(B, metadata_only=True).run(ControllerContext("c", {A: full}, src))
    assert full.registrations == meta.registrations == []
