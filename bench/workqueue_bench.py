"""Work queue throughput: items/s through add -> get -> done, against a plain asyncio.Queue.

    .venv/bin/python bench/workqueue_bench.py [--items 200000] [--rounds 5]

Both queues move the same items with 1 and with 8 worker coroutines; the plain queue does no dedup, so the
ratio is the price of client-go's semantics (and, in the "named" row, of the workqueue_* metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

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
    start = time.perf_counter()
    for i in range(items):
        q.put_nowait(i)
        if i % 64 == 0:
            await asyncio.sleep(0)
    for _ in range(workers):
        q.put_nowait(None)
    await asyncio.gather(*tasks)
    return items / (time.perf_counter() - start)


async def workqueue(items: int, workers: int, named: bool) -> float:
    q: WorkQueue[int] = WorkQueue("bench" if named else "", metrics_registry=CollectorRegistry())

    async def worker() -> None:
        while True:
            try:
                item = await q.get()
            except QueueShutDown:
                return
            q.done(item)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    start = time.perf_counter()
    for i in range(items):
        q.add(i)
        if i % 64 == 0:
            await asyncio.sleep(0)
    q.shutdown()
    await asyncio.gather(*tasks)
    return items / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"items={args.items} rounds={args.rounds} (median of rounds, interleaved)")
    print(f"{'workers':>7} {'asyncio.Queue/s':>16} {'WorkQueue/s':>12} {'ratio':>6} {'named+metrics/s':>16} {'ratio':>6}")
    for workers in (1, 8):
        p, w, n = [], [], []
        for _ in range(args.rounds):
            p.append(asyncio.run(plain(args.items, workers)))
            w.append(asyncio.run(workqueue(args.items, workers, False)))
            n.append(asyncio.run(workqueue(args.items, workers, True)))
        mp, mw, mn = (statistics.median(x) for x in (p, w, n))
        print(f"{workers:>7} {mp:>16,.0f} {mw:>12,.0f} {mp / mw:>6.2f} {mn:>16,.0f} {mp / mn:>6.2f}")


if __name__ == "__main__":
    main()
