"""Work queue throughput: items/s through add -> get -> done, against a plain asyncio.Queue.

    .venv/bin/python bench/workqueue_bench.py [--items 200000] [--rounds 5] [--baseline OLD_WORKQUEUE_PY]

Every queue moves the same items with 1 and with 8 worker coroutines; the plain queue does no dedup, so the
ratio is the price of client-go's semantics (and, in the "named" rows, of the workqueue_* metrics). The priority
queue (the default) is measured with every item at priority 0 (what a queue sees outside initial lists and
resyncs), with priorities -100 and 0 alternating (two levels, as during a bring-up with live changes), and with
``prioritized=False`` (client-go's FIFO queue, the ``priority_queue = false`` setting). ``--baseline`` loads
another version of controllers/workqueue.py (``git show <commit>:controllers/workqueue.py > old.py``) and
measures it in the same rounds, interleaved. Rates are per second of the process's CPU time (the loop is one
thread), so that other work on a shared machine weighs less on them than on wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry  # noqa: E402

from controllers import QueueShutDown, WorkQueue  # noqa: E402


async def plain(items: int, workers: int) -> float:
    q: asyncio.Queue[int | None] = asyncio.Queue()

    async def worker() -> None:
        while True:
            item = await q.get()
            q.task_done()
            if item is None:
                return

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    start = time.process_time()
    for i in range(items):
        q.put_nowait(i)
        if i % 64 == 0:
            await asyncio.sleep(0)
    for _ in range(workers):
        q.put_nowait(None)
    await asyncio.gather(*tasks)
    return items / (time.process_time() - start)


async def workqueue(make: Callable[[str], Any], items: int, workers: int, named: bool, mixed: bool,
                    shut: type[Exception] = QueueShutDown) -> float:
    q = make("bench" if named else "")

    async def worker() -> None:
        while True:
            try:
                item = await q.get()
            except shut:
                return
            q.done(item)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    start = time.process_time()
    if mixed:
        for i in range(items):
            q.add(i, -100 if i & 1 else 0)
            if i % 64 == 0:
                await asyncio.sleep(0)
    else:
        for i in range(items):
            q.add(i)
            if i % 64 == 0:
                await asyncio.sleep(0)
    q.shutdown()
    await asyncio.gather(*tasks)
    return items / (time.process_time() - start)


def load_baseline(path: str) -> Any:
    """The module of another version of controllers/workqueue.py (its relative imports resolve in this
    tree's ``controllers``, whose rate limiters it shares)."""
    spec = importlib.util.spec_from_file_location("controllers._baseline_workqueue", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="another controllers/workqueue.py to measure alongside")
    args = parser.parse_args()
    old = load_baseline(args.baseline) if args.baseline else None
    modes: dict[str, Callable[[int, int], Any]] = {"asyncio.Queue": plain}
    if old is not None:
        modes["baseline"] = lambda n, w: workqueue(
            lambda name: old.WorkQueue(name, metrics_registry=CollectorRegistry()), n, w, False, False,
            old.QueueShutDown)
    modes["priority, all 0"] = lambda n, w: workqueue(
        lambda name: WorkQueue(name, metrics_registry=CollectorRegistry()), n, w, False, False)
    modes["priority, -100/0"] = lambda n, w: workqueue(
        lambda name: WorkQueue(name, metrics_registry=CollectorRegistry()), n, w, False, True)
    modes["prioritized=False"] = lambda n, w: workqueue(
        lambda name: WorkQueue(name, metrics_registry=CollectorRegistry(), prioritized=False), n, w, False, False)
    if old is not None:
        modes["baseline named"] = lambda n, w: workqueue(
            lambda name: old.WorkQueue(name, metrics_registry=CollectorRegistry()), n, w, True, False,
            old.QueueShutDown)
    modes["priority named"] = lambda n, w: workqueue(
        lambda name: WorkQueue(name, metrics_registry=CollectorRegistry()), n, w, True, False)
    print(f"items={args.items} rounds={args.rounds} (median of rounds, modes interleaved in each round)")
    for workers in (1, 8):
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode, run in modes.items():
                rates[mode].append(asyncio.run(run(args.items, workers)))
        medians = {m: statistics.median(r) for m, r in rates.items()}
        print(f"\nworkers={workers}")
        print(f"{'queue':>20} {'items/s':>12} {'plain/it':>9}" + (f" {'baseline/it':>12}" if old else ""))
        for mode, rate in medians.items():
            base = medians["baseline named" if "named" in mode else "baseline"] if old else 0.0
            line = f"{mode:>20} {rate:>12,.0f} {medians['asyncio.Queue'] / rate:>9.2f}"
            print(line + (f" {base / rate:>12.2f}" if old else ""))


if __name__ == "__main__":
    main()
