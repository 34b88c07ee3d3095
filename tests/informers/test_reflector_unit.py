"""Reflector and informer decisions that the real server cannot be made to produce on demand (429, short or
incomplete watches, a server that ignores watch-list, failing listeners), and the metric series' lifetime."""

from __future__ import annotations

import asyncio
import gc
import time
from contextlib import asynccontextmanager

import pytest
from loguru import logger
from prometheus_client import CollectorRegistry

from informers import (
    GVR, ApiError, Backoff, FuncHandler, InformerMetrics, Reflector, ReflectorOptions, SharedIndexInformer,
)
from informers import reflector as reflector_module
from informers.client import CONNECTION_ERRORS
from informers.outage_log import OutageLog
from informers.reflector import INITIAL_EVENTS_END

from tests.helpers import eventually

CONFIGMAPS = GVR("", "v1", "configmaps")


class Sink:
    def __init__(self):
        self.replaced = []
        self.events = []

    def replace(self, objs, rv):
        self.replaced.append((len(objs), rv))

    def apply(self, typ, obj):
        self.events.append(typ)


class FakeClient:
    """Answers lists and watches from scripted responses and records the parameters it was called with.

    A watch script is a list of events (the stream then ends normally), an exception (raised at once), or a
    list whose last item is an exception (raised after the events before it) or an asyncio.Event (the stream
    stays open); with no script left, the watch never answers. Connection errors raised are counted
    (``connection_errors``); ``recover()`` plays "a request sent after them got an answer"
    (``ApiClient.answered_after``); the server answers the reflectors' probes once ``up``.
    """

    def __init__(self, lists=(), watches=()):
        self.lists, self.watches = list(lists), list(watches)
        self.list_params, self.watch_params = [], []
        self.connection_errors = 0
        self.answered_past = 0
        self.recoveries = 0
        self._answered = asyncio.Event()
        self.up = False
        self.probes = []

    def _raise(self, e):
        if isinstance(e, CONNECTION_ERRORS):
            self.connection_errors += 1
        raise e

    async def request_bytes(self, method, path, params=None, body=None, headers=None, timeout=60.0):
        self.probes.append(time.monotonic())
        if not self.up:
            self._raise(refused())
        self.recover()
        return b"ok"

    def recover(self):
        self.answered_past = self.connection_errors
        self.recoveries += 1
        self._answered.set()
        self._answered = asyncio.Event()

    async def answered_after(self, errors):
        while self.answered_past < errors:
            await self._answered.wait()

    def went_away(self):
        self.went = True

    async def request(self, method, path, params=None, body=None):
        self.list_params.append(dict(params))
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            self._raise(item)
        return item

    @asynccontextmanager
    async def stream(self, path, params, inactivity_timeout=None):
        self.watch_params.append(dict(params))
        item = self.watches.pop(0) if self.watches else asyncio.Event()
        if isinstance(item, asyncio.Event):
            await item.wait()  # park forever: the test is over
        if isinstance(item, Exception):
            self._raise(item)

        async def gen():
            for ev in item:
                if isinstance(ev, Exception):
                    self._raise(ev)
                if isinstance(ev, asyncio.Event):
                    await ev.wait()
                yield ev
        yield gen()


def page(rv, n=1):
    return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
            "items": [{"metadata": {"name": f"o{i}", "resourceVersion": rv}} for i in range(n)]}


def added(name, rv):
    return {"type": "ADDED", "object": {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}}


def bookmark(rv, end=False):
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"} if end else {}}
    return {"type": "BOOKMARK", "object": {"metadata": meta}}


def refused():
    return ConnectionRefusedError("connection refused")


def reflector(client, sink, delays, watch_list=False, backoff=None, **kw):
    """A reflector whose failures are recorded in ``delays``; with no ``backoff``, they are all retried at once."""
    cap = backoff is None
    backoff = backoff or Backoff(jitter=0.0, initial=0.001, cap=0.001)
    r = Reflector(client, CONFIGMAPS, sink,
                  options=ReflectorOptions(watch_list=watch_list, short_watch=0.5, backoff=lambda: backoff),
                  metrics=InformerMetrics.for_registry(CollectorRegistry()), **kw)
    original = r._handle_error

    def record(e):
        d = original(e)
        delays.append(("ApiError" if isinstance(e, ApiError) else type(e).__name__, getattr(e, "status", None), d))
        return min(d, 0.001) if cap else d
    r._handle_error = record
    return r


@asynccontextmanager
async def running(r):
    task = asyncio.create_task(r.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def run_until(r, cond, what=""):
    async with running(r) as task:
        await eventually(lambda: cond() or task.done(), 10, what)
        assert not task.done(), f"Reflector.run ended: {task.exception() if not task.cancelled() else 'cancelled'}"


async def settle():
    """Let every ready callback run (a prompt retry takes a few loop iterations, never any time)."""
    for _ in range(100):
        await asyncio.sleep(0)


@pytest.fixture
def logs():
    messages = []
    handler = logger.add(messages.append, level="INFO", format="{level} {message}")
    yield messages
    logger.remove(handler)


# -- client-go's rules -------------------------------------------------------------------------------------
async def test_429_rewatches_after_retry_after_without_relisting():
    ev = {"type": "ADDED", "object": {"metadata": {"name": "x", "resourceVersion": "11"}}}
    client = FakeClient([page("10")], [ApiError(429, "TooManyRequests", retry_after=7), [ev]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: sink.events == ["ADDED"])
    assert delays[0][:2] == ("ApiError", 429) and delays[0][2] == 7
    assert len(client.list_params) == 1
    assert [p["resourceVersion"] for p in client.watch_params[:2]] == ["10", "10"]


async def test_very_short_watch_relists_and_expired_list_rv_retries_consistent():
    client = FakeClient(
        [page("10"), ApiError(410, "Expired"), page("20", 2)],
        [[]],  # closes at once, nothing delivered
    )
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: len(sink.replaced) == 2)
    assert delays[0][0] == "ShortWatchError"
    # first list RV=0 (cache), relist at the last RV, then "" once that RV expired
    assert [p["resourceVersion"] for p in client.list_params] == ["0", "10", ""]
    assert [p.get("limit") for p in client.list_params] == ["500", None, "500"]
    assert sink.replaced == [(1, "10"), (2, "20")]


async def test_watch_410_relists_at_the_last_synced_rv():
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    client = FakeClient([page("10"), page("30")], [[gone]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: len(sink.replaced) == 2)
    assert delays[0][:2] == ("ApiError", 410)
    # not a consistent read from etcd per informer after every compaction: "not older than" the last RV
    assert [p["resourceVersion"] for p in client.list_params] == ["0", "10"]


async def test_watch_410_then_expired_list_rv_falls_back_to_consistent_read():
    client = FakeClient([page("10"), ApiError(410, "Expired"), page("30")], [ApiError(410, "Expired")])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: len(sink.replaced) == 2)
    assert [p["resourceVersion"] for p in client.list_params] == ["0", "10", ""]
    assert [d[:2] for d in delays] == [("ApiError", 410)]  # the fallback is immediate, as in client-go


def paged(rv, names, token=None):
    body = page(rv, 0)
    body["items"] = [{"metadata": {"name": n, "resourceVersion": rv}} for n in names]
    if token:
        body["metadata"]["continue"] = token
    return body


GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}


def list_semantics(params):
    """How the apiserver reads a LIST (its delegator's ShouldDelegateList): 'exact' is served from etcd at that
    revision, however old; 'not older than' from the watch cache."""
    rv, match = params.get("resourceVersion"), params.get("resourceVersionMatch", "")
    if "continue" in params:
        return "continue"
    if match:
        return {"Exact": "exact", "NotOlderThan": "not older than"}[match]
    if params.get("limit") and rv not in (None, "", "0"):
        return "exact"
    return "consistent" if rv == "" else "any" if rv == "0" else "not older than"


async def test_a_relist_is_never_an_exact_read_of_the_last_synced_rv():
    # Watch cache on: the first list at "0" is one page (the cacher ignores limit there), so relists are unpaged.
    # A relist that answers 410 falls back to a consistent list, which etcd pages: that does not say the watch
    # cache is off, so the next relist is still unpaged.
    client = FakeClient([page("10"), page("20"), ApiError(410, "Expired"), paged("30", ["a"], "tok"),
                         paged("30", ["b"]), page("40")], [[GONE], [GONE], [GONE]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: len(sink.replaced) == 4)
    assert [(p["resourceVersion"] if "continue" not in p else "+", list_semantics(p))
            for p in client.list_params] == [
        ("0", "any"), ("10", "not older than"), ("20", "not older than"), ("", "consistent"), ("+", "continue"),
        ("30", "not older than")]
    assert [p.get("limit") for p in client.list_params] == ["500", None, None, "500", "500", None]


async def test_after_a_paginated_first_list_relists_are_paged_and_not_older_than():
    # Watch cache off (or not yet initialised): the first list at "0" came in pages, so relists page too, as in
    # client-go, but say NotOlderThan where client-go's legacy exact read could go back in time.
    client = FakeClient([paged("10", ["a"], "tok"), paged("10", ["b"]), paged("20", ["a"], "t2"), paged("20", [])],
                        [[GONE]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: len(sink.replaced) == 2)
    first, cont, relist, cont2 = client.list_params
    assert list_semantics(first) == "any" and cont == {"limit": "500", "continue": "tok"}
    assert relist == {"resourceVersion": "10", "resourceVersionMatch": "NotOlderThan", "limit": "500"}
    assert list_semantics(relist) == "not older than" and "resourceVersion" not in cont2
    assert sink.replaced == [(2, "10"), (1, "20")]


# -- watch-list ----------------------------------------------------------------------------------------------
async def test_watch_list_cut_or_timed_out_mid_initial_events_retries_watch_list():
    client = FakeClient([], [
        [added("a", "5"), refused()],  # connection cut during the initial events
        [added("a", "5"), added("b", "6")],  # ends (server timeoutSeconds) before the initial-events-end bookmark
        [added("a", "5"), added("b", "6"), bookmark("7", end=True)],
    ])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, watch_list=None)
    await run_until(r, lambda: sink.replaced == [(2, "7")], "a sync by watch-list")
    assert [d[0] for d in delays] == ["ConnectionRefusedError", "ShortWatchError"]
    assert r.use_watch_list is None and client.list_params == []
    assert [p["sendInitialEvents"] for p in client.watch_params[:3]] == ["true"] * 3
    assert sink.events == []  # nothing of an incomplete initial set leaked into the sink


async def test_server_ignoring_send_initial_events_falls_back_to_list():
    # A server without watch-list answers with a plain watch: its first bookmark lacks the end annotation.
    client = FakeClient([page("10", 3)], [[added("a", "5"), bookmark("8")]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, watch_list=None)
    await run_until(r, lambda: sink.replaced == [(3, "10")], "a sync by list")
    assert r.use_watch_list is False and delays == []
    assert client.watch_params[1]["resourceVersion"] == "10" and "sendInitialEvents" not in client.watch_params[1]


async def test_watch_list_at_an_expired_rv_streams_the_latest_at_once():
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    client = FakeClient([], [
        [added("a", "5"), bookmark("7", end=True), gone],  # synced, then the watch expires
        ApiError(410, "Expired"),  # the relist at "7" has expired too
        [added("a", "9"), bookmark("9", end=True)],
    ])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, watch_list=None)
    await run_until(r, lambda: len(sink.replaced) == 2)
    assert [p["resourceVersion"] for p in client.watch_params[:3]] == ["", "7", ""]
    assert [d[:2] for d in delays] == [("ApiError", 410)]
    assert r.use_watch_list is None


# -- nothing but cancellation ends run() ---------------------------------------------------------------------
async def test_a_failure_is_logged_as_the_request_that_failed(logs):
    # A 403 on the watch after a successful list is the watch's, and a watch-list's is the watch-list's.
    client = FakeClient([page("10"), page("11")], [ApiError(403, "Forbidden", "cannot watch")])
    await run_until(reflector(client, Sink(), []), lambda: len(client.watch_params) == 2)
    client = FakeClient([], [ApiError(403, "Forbidden", "cannot watch")])
    await run_until(reflector(client, Sink(), [], watch_list=True), lambda: len(client.watch_params) == 2)
    failed = [m.split(" (")[0] for m in logs if "failed (" in m]
    assert failed[0] == "WARNING watch of configmaps.v1 failed" and "WARNING list of configmaps.v1 failed" not in failed
    assert "WARNING watch-list of configmaps.v1 failed" in failed


async def test_failing_error_listener_is_logged_and_the_informer_carries_on(logs):
    client = FakeClient([ApiError(403, "Forbidden"), ApiError(500, "InternalError"), page("10", 2)], [])
    inf = SharedIndexInformer(client, CONFIGMAPS, metrics=InformerMetrics.for_registry(CollectorRegistry()),
                              options=ReflectorOptions(watch_list=False, backoff=lambda: Backoff(initial=0.01)))
    seen = []

    def broken_listener(e):
        raise RuntimeError("listener bug")

    inf.add_error_listener(broken_listener)
    inf.add_error_listener(seen.append)
    inf.start()
    try:
        assert await inf.wait_for_sync(10)
        assert [e.status for e in seen] == [403, 500]  # the later listener still hears every failure
        failures = [m for m in logs if "error listener" in m]
        assert len(failures) == 2 and "broken_listener" in failures[0] and "listener bug" in failures[0]
    finally:
        await inf.stop()


async def test_reflector_survives_its_own_error_handling_and_the_sink_failing(logs):
    class FlakySink(Sink):
        def replace(self, objs, rv):
            if not self.replaced:
                self.replaced.append("boom")
                raise KeyError("sink bug")
            super().replace(objs, rv)

    def on_error(e):
        raise RuntimeError("callback bug")

    client = FakeClient([page("10"), page("11")], [])
    sink = FlakySink()
    r = reflector(client, sink, [], on_error=on_error)
    await run_until(r, lambda: sink.replaced[-1:] == [(1, "11")], "a second list")
    assert any("unexpected error syncing" in m and "sink bug" in m for m in logs)
    assert any("handling a failure of" in m and "callback bug" in m for m in logs)


# -- recovery after an outage --------------------------------------------------------------------------------
class SlowBackoff(Backoff):
    """A backoff long enough that a test only sees a retry when something cuts it short."""

    def __init__(self):
        super().__init__(initial=30.0, cap=30.0, jitter=0.0)
        self.resets = 0

    def reset(self):
        self.resets += 1
        super().reset()


async def test_connection_error_backoff_ends_when_the_server_answers_again():
    client = FakeClient([page("10")], [refused(), [added("x", "11")]])
    sink, delays, backoff = Sink(), [], SlowBackoff()
    r = reflector(client, sink, delays, backoff=backoff)
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the connection error")
        await settle()
        assert len(client.watch_params) == 1  # sleeping out its 30 s
        client.recover()  # e.g. another informer's request got an answer
        await eventually(lambda: sink.events == ["ADDED"], 10, "the prompt re-watch")
        assert backoff.resets == 1


async def test_one_probe_per_client_finds_the_server_back_for_every_reflector():
    # Every informer sleeping a long backoff: nobody would ask the server, so one of them probes it.
    client = FakeClient([page("10")] * 3, [refused()] * 3 + [[added("x", "11"), asyncio.Event()]] * 3)
    sinks = [Sink() for _ in range(3)]
    delays = []
    reflectors = [reflector(client, sink, delays, backoff=SlowBackoff()) for sink in sinks]
    tasks = [asyncio.create_task(r.run()) for r in reflectors]
    try:
        await eventually(lambda: len(delays) == 3, 10, "three connection errors")
        started = time.monotonic()
        await eventually(lambda: len(client.probes) >= 3, 20, "probes")
        # one prober at a time, one probe a second: not one per reflector
        assert len(client.probes) <= time.monotonic() - started + 2
        client.up = True
        await eventually(lambda: all(s.events == ["ADDED"] for s in sinks), 10, "every reflector re-watching")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_while_the_probe_cannot_connect_reflectors_wait_for_it(monkeypatch):
    # A server that is down gets the probe, about once a second per client, not every reflector's retries; and
    # once the probe is answered at all (here: not ready), the reflectors' own backoffs apply again.
    monkeypatch.setattr(reflector_module, "_PROBE_INTERVAL", 0.1)

    class DownClient(FakeClient):
        unready = False

        async def request_bytes(self, method, path, params=None, body=None, headers=None, timeout=60.0):
            if self.unready:
                self.probes.append(time.monotonic())
                raise ApiError(500, "InternalServerError")
            return await super().request_bytes(method, path, params, body, headers, timeout)

        def stream(self, path, params, inactivity_timeout=None):
            if not self.up:
                self.watch_params.append(dict(params))
                self._raise(refused())
            return super().stream(path, params, inactivity_timeout)

    client = DownClient([page("10")] * 2, [[added("x", "11"), asyncio.Event()]] * 2)
    sinks = [Sink(), Sink()]
    reflectors = [reflector(client, s, [], backoff=Backoff(initial=0.3, cap=0.3, jitter=0.0)) for s in sinks]
    tasks = [asyncio.create_task(r.run()) for r in reflectors]
    try:
        await eventually(lambda: len(client.probes) >= 2, 10, "refused probes")
        before = len(client.watch_params)
        await asyncio.sleep(1.5)  # five of their backoffs, about fifteen probes
        assert len(client.watch_params) == before
        client.unready = True
        await eventually(lambda: len(client.watch_params) > before + 2, 10, "their own retries again")
        client.unready, client.up = False, True
        await eventually(lambda: all(s.events == ["ADDED"] for s in sinks), 10, "every reflector re-watching")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_answer_before_the_failure_does_not_cut_the_backoff_short():
    # A server shutting down answers the requests it had while it refuses new ones: such an answer, to a request
    # sent before this reflector's connection error, must not spend its early retry at the start of the outage.
    client = FakeClient([page("10")], [refused(), [added("x", "11")]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, backoff=SlowBackoff())
    original = client.stream

    def stream_after_an_answer(*args):
        client.recover()  # someone's request got its answer while this reflector's attempt was under way
        client.stream = original
        return original(*args)

    client.stream = stream_after_an_answer
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the connection error")
        await settle()
        assert len(client.watch_params) == 1  # still waiting: nobody has been answered since its failure
        client.recover()
        await eventually(lambda: sink.events == ["ADDED"], 10, "the prompt re-watch once one is")


async def test_api_errors_and_repeated_connection_errors_are_not_cut_short():
    client = FakeClient([page("10")], [refused(), refused(), ApiError(500, "InternalError")])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, backoff=SlowBackoff())
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the first connection error")
        client.recover()
        await eventually(lambda: len(delays) == 2, 10, "the prompt retry failing again")
        client.recover()  # one prompt retry per failure streak: a flapping server cannot make it spin
        await settle()
        assert len(client.watch_params) == 2
    # an API error is an answer: however many recoveries the client reports, it backs off as usual
    client = FakeClient([page("10")], [ApiError(500, "InternalError")])
    delays = []
    r = reflector(client, Sink(), delays, backoff=SlowBackoff())
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the API error")
        client.recover()
        await settle()
        assert len(client.watch_params) == 1


async def test_first_answer_after_connection_errors_starts_the_backoff_afresh():
    # After an apiserver restart the first answer is typically a 410, then maybe a 503 while its paths are
    # installed: the relist must not wait out the backoff that grew while the server was down, nor 0.8 s per
    # error of a server that is starting. Until the next success, API errors back off from 0.1 s.
    gone = ApiError(410, "Expired")
    client = FakeClient([page("10"), ApiError(503, "ServiceUnavailable"), page("20")],
                        [refused(), refused(), refused(), gone, [added("x", "21")], ApiError(500, "x")])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, backoff=Backoff(initial=0.001, factor=5.0, cap=10.0, jitter=0.0))
    await run_until(r, lambda: len(delays) >= 6)
    assert [round(d[2], 3) for d in delays[:3]] == [0.001, 0.005, 0.025]
    resume = reflector_module._RESUME_INITIAL
    assert delays[3][1] == 410 and resume <= delays[3][2] < 2 * resume  # the first answer: the resume backoff
    assert delays[4][1] == 503 and 2 * resume <= delays[4][2] < 4 * resume  # which grows until a success
    assert delays[5][1] == 500 and round(delays[5][2], 3) == 0.001  # after one, the usual backoff, afresh
    assert [p["resourceVersion"] for p in client.list_params[:3]] == ["0", "10", "10"]


async def test_an_in_stream_410_after_an_outage_is_the_answer_that_resumes():
    # The apiserver's 410 to a watch re-opened after its restart comes as an ERROR event in a 200 stream: it is
    # no proof that the watch works (which would keep the backoff the outage grew for the relist) but the first
    # answer after the outage, so the relist follows on the short resume backoff.
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    client = FakeClient([page("10"), page("20")], [refused(), refused(), [gone], [added("x", "21")]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays, backoff=Backoff(initial=5.0, factor=1.0, cap=5.0, jitter=0.0))
    r._resume_backoff = Backoff(initial=0.001, cap=0.001, jitter=0.0)
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the first connection error")
        client.recover()
        await eventually(lambda: len(delays) == 2, 10, "the prompt retry refused again")
        client.recover()  # the early retry was spent on this run: it sleeps its 5 s backoff
        await eventually(lambda: sink.events == ["ADDED"], 20, "the relist and the re-watch")
    assert [d[:2] for d in delays] == [("ConnectionRefusedError", None), ("ConnectionRefusedError", None),
                                       ("ApiError", 410)]
    assert delays[2][2] == 0.001
    assert sink.replaced == [(1, "10"), (1, "20")]


async def test_each_outage_gets_its_early_retry_even_without_a_success_between():
    # A server that answers (an error) and goes again, as one crash-looping: every return cuts the backoff of
    # the next outage short again, since the reflector was answered in between; a retry that fails the same way
    # again before any answer does not (see test_api_errors_and_repeated_connection_errors_are_not_cut_short).
    throttled = ApiError(429, "TooManyRequests")  # an answer that asks for no relist: no success in between
    client = FakeClient([page("10")], [refused(), throttled, refused(), [added("x", "11")]])
    sink, delays, backoff = Sink(), [], SlowBackoff()
    r = reflector(client, sink, delays, backoff=backoff)
    r._resume_backoff = Backoff(initial=0.001, cap=0.001, jitter=0.0)
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the first outage")
        client.recover()
        await eventually(lambda: len(delays) == 3, 10, "the 429, then the second outage")
        await settle()
        assert len(client.watch_params) == 3
        client.recover()
        await eventually(lambda: sink.events == ["ADDED"], 10, "the prompt re-watch after the second outage")


async def test_the_retry_after_an_answer_is_spread_and_the_probe_jittered(monkeypatch):
    # Many members lose one server at the same moment: their probes and their retries must not stay in step.
    monkeypatch.setattr(reflector_module, "_PROBE_INTERVAL", 0.2)
    monkeypatch.setattr(reflector_module, "_RESUME_SPREAD", 0.3)
    pauses = []
    real_uniform = reflector_module.random.uniform

    def uniform(a, b):
        value = real_uniform(a, b)
        pauses.append((a, b, value))
        return value

    monkeypatch.setattr(reflector_module.random, "uniform", uniform)
    client = FakeClient([page("10")], [refused(), [added("x", "11")]])
    sink = Sink()
    r = reflector(client, sink, [], backoff=SlowBackoff())
    async with running(r):
        await eventually(lambda: len(client.probes) >= 2, 10, "probes")
        client.up = True
        await eventually(lambda: sink.events == ["ADDED"], 10, "the re-watch")
    assert (0.5, 1.5) in [(a, b) for a, b, _ in pauses]  # the probe interval, x 0.5 to 1.5
    assert (0, 0.3) in [(a, b) for a, b, _ in pauses]  # the pause before the retry


async def test_the_reflectors_of_one_client_pause_alike_after_one_recovery():
    # Spread between clients, not within one: a member's informers resume together.
    client, other = FakeClient(), FakeClient()
    a, b, c = (reflector(cl, Sink(), []) for cl in (client, client, other))
    client.recover()
    other.recover()
    assert a._resume_pause() == b._resume_pause()
    assert a._resume_pause() != c._resume_pause()  # drawn apart (equal floats: practically never)
    first = a._resume_pause()
    client.recover()
    assert b._resume_pause() != first and a._resume_pause() == b._resume_pause()


async def test_an_outage_is_logged_once_per_client_at_info_and_its_410_relist_at_debug(logs):
    # Two reflectors of one client through one outage: one "interrupted" and one "answers again" at INFO, the
    # other reflector's lines and the 410 that follows the restart at DEBUG (not shown at INFO).
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    client = FakeClient([page("10"), page("10"), page("20"), page("20")],
                        [refused(), refused(), [gone], [gone], [added("x", "21"), asyncio.Event()],
                         [added("y", "21"), asyncio.Event()]])
    sinks = [Sink(), Sink()]
    rs = [reflector(client, sink, [], backoff=SlowBackoff()) for sink in sinks]
    async with running(rs[0]), running(rs[1]):
        await eventually(lambda: len(client.watch_params) == 2, 10, "both watches refused")
        client.recover()
        await eventually(lambda: all(s.events == ["ADDED"] for s in sinks), 10, "both relisted and watching")
    outage = [m for m in logs if "interrupted" in m or "answers again" in m or "410" in m or "xpired" in m]
    assert [m.split(" ")[0] for m in outage] == ["INFO", "INFO"], outage
    assert "interrupted" in outage[0] and "answers again" in outage[1]


async def test_the_410_after_the_server_said_it_shuts_down_is_logged_at_debug(logs):
    # A graceful restart: the watch ends with 503 "shutting down" (no connection error), and the restarted server
    # answers the relist at the last resourceVersion with 410. That 410 is expected of every reflector: DEBUG, as
    # after an outage.
    client = FakeClient([page("10"), ApiError(410, "Expired", "too old resource version"), page("20")],
                        [ApiError(503, "ServiceUnavailable", "apiserver is shutting down"),
                         [added("x", "21"), asyncio.Event()]])
    sink = Sink()
    async with running(reflector(client, sink, [])):
        await eventually(lambda: sink.events == ["ADDED"], 10, "relisted and watching")
    assert client.went
    assert not [m for m in logs if "410" in m or "xpired" in m], logs


def test_outage_log_says_info_once_per_client_and_outage():
    said, a, b = OutageLog(), FakeClient(), FakeClient()
    assert [said.level(a), said.level(a), said.level(b)] == ["INFO", "DEBUG", "INFO"]
    a.recover()  # the outage ended: the next one is told again
    assert [said.level(a), said.level(a), said.level(b)] == ["INFO", "DEBUG", "DEBUG"]


# -- metric series -----------------------------------------------------------------------------------------
def samples_of(registry, gvr):
    return [s for family in registry.collect() for s in family.samples if s.labels.get("gvr") == str(gvr)]


async def test_stopped_informers_leave_no_metric_series():
    registry = CollectorRegistry()
    metrics = InformerMetrics.for_registry(registry)
    gvrs = [GVR("example.com", "v1", f"things{i}") for i in range(5)]
    informers = []
    for gvr in gvrs:
        gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        client = FakeClient([page("10"), page("12")], [[added("a", "11"), bookmark("11"), gone]])
        inf = SharedIndexInformer(client, gvr, metrics=metrics,
                                  options=ReflectorOptions(watch_list=False, backoff=lambda: Backoff(initial=0.01)))
        inf.add_event_handler(FuncHandler(on_add=lambda obj, initial: None, name="h"))
        inf.start()
        informers.append(inf)
    twin = SharedIndexInformer(FakeClient([page("10")]), gvrs[0], metrics=metrics,
                               options=ReflectorOptions(watch_list=False))
    twin.start()
    try:
        await eventually(lambda: all(i.reflector.resource_version == "12" for i in informers), 10, "relists")
        names = {s.name for s in samples_of(registry, gvrs[1])}
        assert {"informer_lists_total", "informer_watches_total", "informer_relists_total", "informer_errors_total",
                "informer_events_total", "informer_last_resource_version", "informer_objects", "informer_synced",
                "informer_handler_queue_depth"} <= names
        for inf in informers:
            await inf.stop()
        # another informer of the same GVR keeps its series
        assert {s.name for s in samples_of(registry, gvrs[0])} >= {"informer_lists_total", "informer_objects"}
        assert all(samples_of(registry, g) == [] for g in gvrs[1:])
    finally:
        await twin.stop()
        await asyncio.gather(*(i.stop() for i in informers))  # stopping twice is harmless
    assert all(samples_of(registry, g) == [] for g in gvrs)
    assert not any(str(g) in s.labels.values() for f in registry.collect() for s in f.samples for g in gvrs)


async def test_a_counter_of_two_informers_of_one_gvr_does_not_go_down_when_one_stops():
    registry = CollectorRegistry()
    metrics = InformerMetrics.for_registry(registry)
    gvr = GVR("example.com", "v1", "shared")

    def lists():
        return sum(s.value for s in samples_of(registry, gvr) if s.name == "informer_lists_total")

    informers = [SharedIndexInformer(FakeClient([page("10")]), gvr, metrics=metrics,
                                     options=ReflectorOptions(watch_list=False)) for _ in range(2)]
    for inf in informers:
        inf.start()
    try:
        await eventually(lambda: all(i.has_synced() for i in informers), 10, "both synced")
        assert lists() == 2
        await informers[0].stop()
        assert lists() == 2  # a counter that went down would read as a reset to Prometheus
    finally:
        await asyncio.gather(*(i.stop() for i in informers))
    assert samples_of(registry, gvr) == []
    again = SharedIndexInformer(FakeClient([page("10")]), gvr, metrics=metrics,
                                options=ReflectorOptions(watch_list=False))
    again.start()
    try:
        await eventually(again.has_synced, 10, "synced")
        assert lists() == 1  # a series watched again starts from zero
    finally:
        await again.stop()


async def test_gauges_are_read_from_the_informer_at_scrape_time():
    """No prometheus child per informer: the gauges are read when scraped, and go with their handler or informer."""
    registry = CollectorRegistry()
    metrics = InformerMetrics.for_registry(registry)
    gvr = GVR("example.com", "v1", "gauged")
    inf = SharedIndexInformer(FakeClient([page("10", n=3)]), gvr, metrics=metrics,
                              options=ReflectorOptions(watch_list=False))
    reg = inf.add_event_handler(FuncHandler(on_add=lambda obj, initial: None, name="h"))

    def gauges():
        return {(s.name, s.labels.get("handler")): s.value for s in samples_of(registry, gvr)
                if s.name in ("informer_objects", "informer_synced", "informer_handler_queue_depth",
                              "informer_last_resource_version")}

    assert gauges() == {("informer_objects", None): 0, ("informer_handler_queue_depth", "h"): 0,
                        ("informer_last_resource_version", None): 0}
    inf.start()
    try:
        await eventually(inf.has_synced, 10, "synced")
        assert gauges() == {("informer_objects", None): 3, ("informer_synced", None): 1,
                            ("informer_handler_queue_depth", "h"): 0, ("informer_last_resource_version", None): 10}
        await inf.remove_event_handler(reg)
        assert ("informer_handler_queue_depth", "h") not in gauges()
    finally:
        await inf.stop()
    assert gauges() == {}
    again = SharedIndexInformer(FakeClient([page("10")]), gvr, metrics=metrics)
    assert gauges()
    del again
    gc.collect()
    assert gauges() == {}  # an informer dropped without stop() leaves nothing behind either


async def test_a_watch_that_delivered_again_gets_the_shortcut_at_the_next_cut():
    # Cut, re-watch with an event, cut again (one dead HTTP/2 connection under every watch, twice): the second
    # cut is cut short by the server answering too, not slept out at the backoff the first one grew.
    client = FakeClient([page("10")], [refused(), [added("x", "11"), refused()], [added("y", "12")]])
    sink, delays, backoff = Sink(), [], SlowBackoff()
    r = reflector(client, sink, delays, backoff=backoff)
    async with running(r):
        await eventually(lambda: len(delays) == 1, 10, "the first cut")
        client.recover()
        await eventually(lambda: len(delays) == 2, 10, "the second cut, after an event")
        await settle()
        assert sink.events == ["ADDED"] and len(client.watch_params) == 2
        client.recover()
        await eventually(lambda: sink.events == ["ADDED", "ADDED"], 10, "the prompt re-watch after the second cut")
        assert backoff.resets == 2
