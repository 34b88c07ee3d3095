"""EventRecorder against the real control plane: aggregation into series, rate limits, never raising."""

from __future__ import annotations

import asyncio
from typing import Any

from controllers import EventRecorder
from informers import GVR, ApiClient, ResourceClient

from tests.helpers import CONFIGMAPS, eventually
from tests.kube import configmap

EVENTS = GVR("events.k8s.io", "v1", "events")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def events_about(api: ApiClient, obj: dict[str, Any], gvr: GVR = EVENTS) -> list[dict[str, Any]]:
    namespace = obj["metadata"].get("namespace") or "default"
    found = await ResourceClient(api, gvr, namespaced=True).list(namespace)
    ref = "regarding" if gvr == EVENTS else "involvedObject"
    return [e for e in found if e[ref].get("uid") == obj["metadata"]["uid"]]


async def new_configmap(api: ApiClient, namespace: str, name: str = "subject") -> dict[str, Any]:
    return await ResourceClient(api, CONFIGMAPS).create(configmap(name, namespace))


async def test_identical_events_become_one_event_with_a_series(api: ApiClient, namespace: str) -> None:
    cm = await new_configmap(api, namespace)
    async with EventRecorder(api, "example.com/tests", "test-pod") as recorder:
        for _ in range(100):
            recorder.event(cm, "Normal", "Synced", "Reconcile", "all good")
            await asyncio.sleep(0.005)  # a hot loop spread over about a second
    [event] = await events_about(api, cm)
    assert event["series"]["count"] == 100 and event["series"]["lastObservedTime"]
    assert (event["type"], event["reason"], event["action"], event["note"]) == (
        "Normal", "Synced", "Reconcile", "all good")
    assert event["reportingController"] == "example.com/tests" and event["reportingInstance"] == "test-pod"
    assert event["regarding"]["kind"] == "ConfigMap" and event["regarding"]["name"] == "subject"
    assert event["metadata"]["namespace"] == namespace and recorder.dropped == 0


async def test_different_reasons_and_notes_make_different_events(api: ApiClient, namespace: str) -> None:
    cm = await new_configmap(api, namespace)
    async with EventRecorder(api, "example.com/tests", "test-pod") as recorder:
        for reason in ("Created", "Scaled", "Failed"):
            recorder.event(cm, "Warning" if reason == "Failed" else "Normal", reason, "Reconcile", "n")
        recorder.event(cm, "Normal", "Scaled", "Reconcile", "another note")
        recorder.event(cm, "Normal", "Scaled", "Reconcile", "another note")
    events = await events_about(api, cm)
    summary = sorted((e["reason"], e["note"], e["type"], (e.get("series") or {}).get("count", 1)) for e in events)
    assert summary == [("Created", "n", "Normal", 1), ("Failed", "n", "Warning", 1),
                       ("Scaled", "another note", "Normal", 2), ("Scaled", "n", "Normal", 1)]


async def test_a_series_ends_ten_minutes_after_its_last_occurrence(api: ApiClient, namespace: str) -> None:
    cm = await new_configmap(api, namespace)
    clock = FakeClock()
    async with EventRecorder(api, "example.com/tests", "test-pod", clock=clock) as recorder:
        recorder.event(cm, "Normal", "Tick", "Reconcile")
        clock.now += 599
        recorder.event(cm, "Normal", "Tick", "Reconcile")  # within 10 minutes of the first: same Event
        clock.now += 599
        recorder.event(cm, "Normal", "Tick", "Reconcile")  # within 10 minutes of the last: still the same
        await recorder._queue.join()
        clock.now += 601
        recorder.event(cm, "Normal", "Tick", "Reconcile")  # a new Event
    counts = sorted((e.get("series") or {}).get("count", 1) for e in await events_about(api, cm))
    assert counts == [1, 3]


async def test_the_spam_filter_limits_writes_per_object(api: ApiClient, namespace: str) -> None:
    noisy, quiet = await new_configmap(api, namespace, "noisy"), await new_configmap(api, namespace, "quiet")
    clock = FakeClock()
    async with EventRecorder(api, "example.com/tests", "test-pod", clock=clock) as recorder:
        for i in range(30):
            recorder.event(noisy, "Warning", f"Attempt{i}", "Reconcile")
        recorder.event(quiet, "Normal", "Fine", "Reconcile")
        await recorder._queue.join()
        assert recorder.dropped == 5
        clock.now += 300  # one token back for the noisy object
        recorder.event(noisy, "Warning", "Attempt29", "Reconcile")
    assert len(await events_about(api, noisy)) == 26 and len(await events_about(api, quiet)) == 1
    assert recorder.dropped == 5


async def test_series_updates_refused_by_the_spam_filter_are_made_later(api: ApiClient, namespace: str) -> None:
    cm = await new_configmap(api, namespace)
    # two writes at once, then one every 0.5 s: the creation and one update go out, the rest waits for tokens
    async with EventRecorder(api, "example.com/tests", "test-pod", per_object_burst=2, per_object_refill=2.0,
                             series_interval=0) as recorder:
        for _ in range(3):
            recorder.event(cm, "Normal", "Busy", "Reconcile")
            await recorder._queue.join()
            await asyncio.sleep(0.05)
        recorder.event(cm, "Normal", "Busy", "Reconcile")

        async def counted_four() -> bool:
            [event] = await events_about(api, cm)
            return (event.get("series") or {}).get("count") == 4

        await eventually(counted_four, 10, "the postponed series update")
    assert recorder.dropped == 0


async def test_event_never_raises_and_close_ends_the_worker(api: ApiClient, namespace: str) -> None:
    cm = await new_configmap(api, namespace)
    recorder = EventRecorder(api, "example.com/tests", "test-pod")
    recorder.event({"no": "metadata"}, "Normal", "Broken", "Reconcile")  # logged, not raised
    recorder.event(cm, "Bogus", "Reason", "Reconcile")  # type: ignore[arg-type]
    recorder.event(cm, "Normal", "R" * 200, "Reconcile")  # the server refuses it (reason too long): logged
    recorder.event(cm, "Normal", "Fine", "Reconcile", "é" * 2000)  # the note is cut to 1 KiB
    worker = recorder._worker
    assert worker is not None
    await recorder.close()
    assert worker.done()
    recorder.event(cm, "Normal", "Late", "Reconcile")  # after close: dropped
    assert recorder.dropped == 1
    [event] = await events_about(api, cm)
    assert event["reason"] == "Fine" and len(event["note"].encode()) <= 1024


async def test_cluster_scoped_objects_get_events_in_default(api: ApiClient) -> None:
    ns = await ResourceClient(api, GVR("", "v1", "namespaces")).get("default")
    async with EventRecorder(api, "example.com/tests", "test-pod") as recorder:
        recorder.event(ns, "Normal", "Looked", "Inspect", "cluster-scoped")
    looked = [e for e in await events_about(api, ns) if e["reason"] == "Looked"]
    assert looked and looked[-1]["metadata"]["namespace"] == "default"
    assert looked[-1]["regarding"]["kind"] == "Namespace"


async def test_core_events_when_events_k8s_io_is_not_served(control_plane_factory) -> None:
    cp = control_plane_factory(extra_apiserver_flags=["--runtime-config=events.k8s.io/v1=false"])
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        cm = await new_configmap(api, "default")
        async with EventRecorder(api, "example.com/tests", "test-pod") as recorder:
            for _ in range(3):
                recorder.event(cm, "Warning", "Slow", "Reconcile", "took long")
                await asyncio.sleep(0.05)
        [event] = await events_about(api, cm, GVR("", "v1", "events"))
    assert (event["reason"], event["message"], event["type"], event["count"]) == ("Slow", "took long", "Warning", 3)
    assert event["source"]["component"] == "example.com/tests" and event["involvedObject"]["name"] == "subject"
