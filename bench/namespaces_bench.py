"""Namespace members: per-namespace informers (before) against one shared informer per GVR (namespace views), in one
run on one control plane.

    .venv/bin/python bench/namespaces_bench.py --before DIR [--namespaces 50] [--configmaps 20]

``DIR`` is a copy of the code before the views (``git archive <commit> | tar -x -C DIR``). One local control plane
holds ``--namespaces`` namespaces labelled for the host-namespaces provider, each with ``--configmaps`` ~1 KiB
ConfigMaps, plus as many unlabelled ones with as many ConfigMaps (what a shared cluster-wide cache also holds).
Each contender runs in a fresh process of its own (its code on ``PYTHONPATH``): a ``ClusterRegistry`` with the
provider and ConfigMaps required, as the multi-cluster tests build it (watch ``required``), until every member is
engaged and its ConfigMap informer synced; then a ConfigMap is changed in every member's namespace and the time
until every member's per-cluster handler has heard its own change is measured. Reported per contender: watches
opened (the client's ``stream`` calls) and on which paths, other requests, the process's RSS growth from
before the registry started to after sync (``VmRSS``), the asyncio tasks, the time to all synced, and the
change round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LABEL = "bench-namespaces"


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def worker(kubeconfig: str, namespaces: list[str]) -> dict[str, Any]:
    """One contender, in this process (its code is whatever ``PYTHONPATH`` gives)."""
    import gc

    from controllers.cluster_registry import ClusterRegistry
    from controllers.member import MemberOptions
    from controllers.providers.namespaces import HostNamespacesProvider
    from informers import GVR, ApiClient, FuncHandler

    configmaps = GVR("", "v1", "configmaps")
    heard: dict[str, float] = {}

    class Handler:
        def add_cluster(self, ctx: Any, name: str, cluster: Any) -> None:
            inf = cluster.factory.informers()[0].get(configmaps)
            if inf is None:
                return

            def changed(old: Any, new: Any) -> None:
                if new["metadata"]["name"] == "cm-0" and new["metadata"]["namespace"] == name:
                    heard.setdefault(name, time.monotonic())

            reg = inf.add_event_handler(FuncHandler(on_update=changed), name="bench")

            async def cleanup() -> None:
                await inf.remove_event_handler(reg)

            ctx.add_cleanup(cleanup)

    async with ApiClient.from_kubeconfig(kubeconfig) as api:
        streams: Counter[str] = Counter()
        stream = api.stream

        def recording(path: str, params: Any, *args: Any, **kwargs: Any) -> Any:
            streams[path] += 1
            return stream(path, params, *args, **kwargs)

        api.stream = recording  # type: ignore[method-assign]
        await api.request("GET", "/version")
        gc.collect()
        rss0, tasks0 = _rss_kib(), len(asyncio.all_tasks())
        requests0 = sum(api.request_counts.codes.values())
        registry = ClusterRegistry(api, [HostNamespacesProvider(api, f"{LABEL}=true")],
                                   MemberOptions(sync_timeout=120, probe_interval=3600), required=[configmaps])
        await registry.register_cluster_handler(Handler())
        t0 = time.monotonic()
        await registry.start()
        want = set(namespaces)
        while not (set(registry.list_clusters()) == want and all(
                configmaps in registry.cluster(n).factory.informers()[0] for n in want)):
            if time.monotonic() - t0 > 300:
                raise SystemExit("members not synced within 300 s")
            await asyncio.sleep(0.05)
        synced_s = time.monotonic() - t0
        await asyncio.sleep(2.0)  # let handler replays finish before measuring
        gc.collect()
        rss1, tasks1 = _rss_kib(), len(asyncio.all_tasks())
        requests1 = sum(api.request_counts.codes.values())
        t1 = time.monotonic()
        for n in namespaces:
            await api.request("PATCH", configmaps.path(n, "cm-0"), body={"data": {"changed-by": str(os.getpid())}},
                              headers={"Content-Type": "application/merge-patch+json"})
        while set(heard) != want:
            if time.monotonic() - t1 > 60:
                raise SystemExit(f"changes not heard within 60 s: {sorted(want - set(heard))[:5]}")
            await asyncio.sleep(0.01)
        round_s = max(heard.values()) - t1
        await registry.stop()
        watches = sum(streams.values())
        return {"watches": watches, "watch_paths": dict(streams.most_common(4)), "distinct_watch_paths": len(streams),
                "other_requests": requests1 - requests0 - watches, "rss_mib": (rss1 - rss0) / 1024,
                "tasks": tasks1 - tasks0, "synced_s": synced_s, "change_round_s": round_s}


async def setup(api: Any, namespaces: int, configmaps: int) -> list[str]:
    names = []
    payload = "x" * 1000
    for labelled in (True, False):
        for i in range(namespaces):
            name = f"{'tenant' if labelled else 'other'}-{i}"
            labels = {LABEL: "true"} if labelled else {}
            await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name, "labels": labels}})
            await asyncio.gather(*(api.request("POST", f"/api/v1/namespaces/{name}/configmaps", body={
                "metadata": {"name": f"cm-{j}"}, "data": {"payload": payload}}) for j in range(configmaps)))
            if labelled:
                names.append(name)
    return names


async def main(before: str, namespaces: int, configmaps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from informers import ApiClient
    from syncer.testing import ControlPlane

    cp = ControlPlane(name="namespaces-bench")
    cp.start()
    try:
        async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
            names = await setup(api, namespaces, configmaps)
            version = (await api.request("GET", "/version")).get("gitVersion")
        results = {}
        for label, code in (("per-namespace informers (before)", before), ("shared informer + views", str(ROOT))):
            out = subprocess.run([sys.executable, __file__, "--worker", str(cp.kubeconfig), *names],
                                 env={**os.environ, "PYTHONPATH": code}, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{label} failed:\n{out.stderr[-3000:]}")
            results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        cp.stop()
    print(f"{namespaces} namespace members ({configmaps} ConfigMaps each, as many in {namespaces} other namespaces), "
          f"ConfigMaps required, kube-apiserver {version}, Python {sys.version.split()[0]}:\n")
    cols = [("watches", "watches opened", "{:d}"), ("distinct_watch_paths", "watch paths", "{:d}"),
            ("other_requests", "other requests", "{:d}"), ("rss_mib", "RSS growth MiB", "{:.1f}"),
            ("tasks", "asyncio tasks", "{:d}"), ("synced_s", "all synced s", "{:.2f}"),
            ("change_round_s", "change round s", "{:.3f}")]
    print("| contender | " + " | ".join(c[1] for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for label, r in results.items():
        print(f"| {label} | " + " | ".join(fmt.format(r[key]) for key, _, fmt in cols) + " |")
    old, new = results.values()
    print("| ratio after/before | " + " | ".join(
        f"{new[key] / old[key]:.2f}x" if old[key] else "-" for key, _, _ in cols) + " |")
    for label, r in results.items():
        print(f"\n{label}: busiest watch paths {r['watch_paths']}")


def _parse() -> Any:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--before", help="a copy of the code before the namespace views")
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument("--configmaps", type=int, default=20)
    p.add_argument("--worker", nargs="+", metavar=("KUBECONFIG", "NAMESPACE"), help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    args = _parse()
    if args.worker:
        print(json.dumps(asyncio.run(worker(args.worker[0], args.worker[1:]))))
    else:
        if not args.before:
            raise SystemExit("--before DIR is required (git archive <commit> | tar -x -C DIR)")
        asyncio.run(main(args.before, args.namespaces, args.configmaps))
