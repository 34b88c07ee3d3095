"""The read-your-writes barrier (controllers/read_your_writes.py) over a fed informer, without an API server."""

from __future__ import annotations

import asyncio

from controllers import Request
from controllers.metrics import ReadYourWritesMetrics
from controllers.read_your_writes import ReadYourWrites
from informers.shared_informer import SharedIndexInformer
from tests.fakes import A, LocalInformer, obj

REQ = Request("w", "ns")


def cm(name: str, rv: str, uid: str = "u1") -> dict:
    o = obj(name, rv=rv)
    o["metadata"]["uid"] = uid
    return o


def barrier(*informers: SharedIndexInformer, timeout: float = 5.0) -> ReadYourWrites:
    return ReadYourWrites("c", lambda gvr: list(informers), timeout, ReadYourWritesMetrics())


def in_reconcile(b: ReadYourWrites, write, request: Request = REQ) -> None:
    token = b.reconciling(request)
    try:
        write()
    finally:
        b.done(token)


async def settled(b: ReadYourWrites, request: Request = REQ) -> asyncio.Task[None]:
    task = asyncio.create_task(b.settle(request))
    await asyncio.sleep(0.01)
    return task


async def test_a_reconcile_waits_until_its_write_shows_then_only_once() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([cm("x", "3")], "3")
        b = barrier(inf)
        in_reconcile(b, lambda: b.wrote(A, cm("x", "7")))
        task = await settled(b)
        assert not task.done()
        inf.apply("MODIFIED", cm("other", "5"))  # a change, not yet the write
        await asyncio.sleep(0.01)
        assert not task.done()
        inf.apply("MODIFIED", cm("x", "7"))
        await asyncio.wait_for(task, 1)
        assert (b.metrics.caught_up, b.metrics.timeouts) == (1, 0)
        await b.settle(REQ)  # settled: nothing left to wait for
        assert b.metrics.caught_up == 1
    finally:
        await inf.stop()


async def test_the_informers_resource_version_or_a_later_one_of_the_object_also_count() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([cm("x", "3")], "3")
        b = barrier(inf)
        in_reconcile(b, lambda: b.wrote(A, cm("x", "7")))
        task = await settled(b)
        inf.reflector.resource_version = "9"  # e.g. the object was deleted by someone else since
        inf.apply("ADDED", cm("y", "9"))
        await asyncio.wait_for(task, 1)
        in_reconcile(b, lambda: b.wrote(A, cm("x", "10")))
        inf.apply("MODIFIED", cm("x", "12"))  # already past the write: no wait at all
        await b.settle(REQ)
        assert (b.metrics.caught_up, b.metrics.timeouts) == (1, 0)
    finally:
        await inf.stop()


async def test_on_timeout_the_reconcile_goes_on_and_it_is_counted() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([cm("x", "3")], "3")
        b = barrier(inf, timeout=0.05)
        in_reconcile(b, lambda: b.wrote(A, cm("x", "7")))
        await asyncio.wait_for(b.settle(REQ), 1)
        assert (b.metrics.caught_up, b.metrics.timeouts) == (0, 1)
        assert b.metrics.durations.total >= 0.05
    finally:
        await inf.stop()


async def test_writes_of_other_requests_and_outside_reconciles_are_not_waited_for() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([cm("x", "3")], "3")
        b = barrier(inf)
        b.wrote(A, cm("x", "7"))  # outside a reconcile
        in_reconcile(b, lambda: b.wrote(A, cm("x", "8")), Request("other", "ns"))
        await asyncio.wait_for(b.settle(REQ), 0.5)
        assert b.metrics.caught_up + b.metrics.timeouts == 0
        uncached = barrier()  # a GVR the controller has no informer of
        in_reconcile(uncached, lambda: uncached.wrote(A, cm("x", "9")))
        assert not uncached._pending
    finally:
        await inf.stop()


async def test_resource_versions_that_are_not_integers_compare_equal_or_changed() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([cm("x", "a")], "a")
        b = barrier(inf)
        in_reconcile(b, lambda: b.wrote(A, cm("x", "b")))
        task = await settled(b)
        inf.apply("MODIFIED", cm("y", "c"))
        await asyncio.sleep(0.01)
        assert not task.done()
        inf.apply("MODIFIED", cm("x", "d"))  # changed since the write: at least the write
        await asyncio.wait_for(task, 1)
    finally:
        await inf.stop()


async def test_a_delete_reads_as_gone_and_a_held_one_as_written() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([cm("x", "3"), cm("y", "4", uid="u2")], "4")
        b = barrier(inf)
        in_reconcile(b, lambda: b.deleted(A, "ns", "x", None, None))
        task = await settled(b)
        inf.reflector.resource_version = "99"  # a resourceVersion says nothing of a delete: the cache must drop it
        inf.apply("MODIFIED", cm("y", "5", uid="u2"))
        await asyncio.sleep(0.01)
        assert not task.done()
        inf.apply("DELETED", cm("x", "6"))
        await asyncio.wait_for(task, 1)
        # held by a finalizer: the answer is an ordinary write of it
        held = cm("y", "7", uid="u2")
        held["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["f"])
        inf.reflector.resource_version = "6"
        in_reconcile(b, lambda: b.deleted(A, "ns", "y", None, held))
        task = await settled(b)
        assert not task.done()
        inf.apply("MODIFIED", held)
        await asyncio.wait_for(task, 1)
        # created and deleted before the cache saw either: gone already
        in_reconcile(b, lambda: (b.wrote(A, cm("z", "8", uid="u3")), b.deleted(A, "ns", "z", None, None)))
        await asyncio.wait_for(b.settle(REQ), 0.5)
        assert (b.metrics.caught_up, b.metrics.timeouts) == (2, 0)
    finally:
        await inf.stop()


async def test_a_write_waits_in_every_informer_of_its_gvr() -> None:
    whole, meta = LocalInformer(A), LocalInformer(A.only_metadata())
    try:
        for inf in (whole, meta):
            inf.replace([cm("x", "3")], "3")
        b = barrier(whole, meta)
        in_reconcile(b, lambda: b.wrote(A, cm("x", "7")))
        task = await settled(b)
        whole.apply("MODIFIED", cm("x", "7"))
        await asyncio.sleep(0.01)
        assert not task.done()
        meta.apply("MODIFIED", cm("x", "7"))
        await asyncio.wait_for(task, 1)
    finally:
        await whole.stop()
        await meta.stop()


async def test_requests_never_reconciled_again_are_swept() -> None:
    inf = LocalInformer(A)
    try:
        inf.replace([], "1")
        b = barrier(inf)
        for i in range(600):
            name = f"o{i}"
            in_reconcile(b, lambda: b.wrote(A, cm(name, str(10 + i))), Request(name, "ns"))
            inf.apply("ADDED", cm(name, str(10 + i)))
        assert len(b._pending) < 300
    finally:
        await inf.stop()
