"""Client CPU per request over HTTP/2 (small GETs with a bearer token): two source trees of this repository side by
side, A B A B, against one local control plane. What changes the request path (header encoding, the credential's
HPACK representation) is measured with it.

    .venv/bin/python bench/request_cpu_bench.py --tree new=. --tree old=/tmp/old-tree [--requests 5000] \
        [--concurrency 10] [--reps 3]

A tree is a checkout (e.g. ``git worktree add /tmp/old-tree HEAD~1``). Each measurement is a fresh process that
imports that tree, warms up with 200 requests, then sends ``--requests`` GETs of one Namespace, ``--concurrency``
at a time on one HTTP/2 connection, and reports its own user+sys CPU for them (getrusage).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RUNNER = """
import asyncio, resource, sys, json
from informers import ApiClient

async def main(kubeconfig, n, concurrency):
    async with ApiClient.from_kubeconfig(kubeconfig) as client:
        path = "/api/v1/namespaces/default"
        for _ in range(200):
            await client.request_bytes("GET", path)
        assert client.connections == 1
        ru = resource.getrusage(resource.RUSAGE_SELF)
        before = ru.ru_utime + ru.ru_stime
        async def worker(k):
            for _ in range(k):
                await client.request_bytes("GET", path)
        await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"cpu": ru.ru_utime + ru.ru_stime - before, "requests": n // concurrency * concurrency}))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (two or more)")
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from syncer.testing import ControlPlane

    per_request: dict[str, list[float]] = {name: [] for name in trees}
    with ControlPlane(name="request-bench") as cp:
        for _ in range(args.reps):
            for name, path in trees.items():
                out = subprocess.run([sys.executable, "-c", RUNNER, str(cp.kubeconfig), str(args.requests),
                                      str(args.concurrency)], cwd=path, env={"PYTHONPATH": str(Path(path).resolve())},
                                     capture_output=True, text=True, check=True)
                result = json.loads(out.stdout)
                per_request[name].append(result["cpu"] / result["requests"] * 1e6)
    first = next(iter(trees))
    print("| tree | CPU µs / request (median) | reps |")
    print("|---|---:|---|")
    for name, values in per_request.items():
        print(f"| {name} | {statistics.median(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")
    for name, values in per_request.items():
        if name != first:
            ratios = [a / b for a, b in zip(per_request[first], values)]
            print(f"\n{first} / {name} pair by pair: {', '.join(f'{r:.3f}' for r in ratios)} "
                  f"(median {statistics.median(ratios):.3f})")


if __name__ == "__main__":
    main()
