"""Reflector decisions that the real server cannot be made to produce on demand (429, short watches)."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry

from informers import GVR, ApiError, Backoff, InformerMetrics, Reflector, ReflectorOptions


class Sink:
    def __init__(self):
        self.replaced = []
        self.events = []

    def replace(self, objs, rv):
        self.replaced.append((len(objs), rv))

    def apply(self, typ, obj):
        self.events.append(typ)


class FakeClient:
    """Answers lists and watches from scripted responses and records the parameters it was called with."""

    def __init__(self, lists, watches):
        self.lists, self.watches = list(lists), list(watches)
        self.list_params, self.watch_params = [], []

    async def request(self, method, path, params=None, body=None):
        self.list_params.append(dict(params))
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    @asynccontextmanager
    async def stream(self, path, params, inactivity_timeout=None):
        self.watch_params.append(dict(params))
        item = self.watches.pop(0) if self.watches else asyncio.Event()
        if isinstance(item, asyncio.Event):
            await item.wait()  # park forever: the test is over
        if isinstance(item, Exception):
            raise item

        async def gen():
            for ev in item:
                yield ev
        yield gen()


def page(rv, n=1):
    return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
            "items": [{"metadata": {"name": f"o{i}", "resourceVersion": rv}} for i in range(n)]}


def reflector(client, sink, delays):
    backoff = Backoff(jitter=0.0, initial=0.001, cap=0.001)
    r = Reflector(client, GVR("", "v1", "configmaps"), sink,
                  options=ReflectorOptions(watch_list=False, short_watch=0.5, backoff=lambda: backoff),
                  metrics=InformerMetrics.for_registry(CollectorRegistry()))
    original = r._handle_error

    def record(e):
        d = original(e)
        delays.append((type(e).__name__, getattr(e, "status", None), d))
        return min(d, 0.001)
    r._handle_error = record
    return r


async def run_until(r, cond):
    task = asyncio.create_task(r.run())
    try:
        for _ in range(200):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


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
    assert all(p["limit"] == "500" for p in client.list_params)
    assert sink.replaced == [(1, "10"), (2, "20")]


async def test_watch_error_event_410_relists():
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    client = FakeClient([page("10"), page("30")], [[gone]])
    sink, delays = Sink(), []
    r = reflector(client, sink, delays)
    await run_until(r, lambda: len(sink.replaced) == 2)
    assert delays[0][:2] == ("ApiError", 410)
    assert [p["resourceVersion"] for p in client.list_params] == ["0", ""]
