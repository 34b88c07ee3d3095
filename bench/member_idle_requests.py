"""Requests an idle member costs besides its watches: the old intervals against the new defaults, in one run.

    .venv/bin/python bench/member_idle_requests.py [--members 5] [--idle 300]

One local control plane is both the management cluster (the kubeconfig Secrets) and every member (each a
Secret whose kubeconfig points at it, with the admin token). Two ClusterRegistries run side by side in one
process, each with ``--members`` members on a Secret namespace of its own, each member's factory as
``syncer run`` builds it (watch ``required``, ConfigMaps required, CRD/APIService triggers):

- ``old intervals``: a ``/version`` probe round every 15 s and a discovery pass every 60 s, the defaults before
  issue 23 (run with today's code, so the probe already skips a round in which a watch said something);
- ``defaults``: ``probe_interval`` 5 min, ``full_rediscovery_interval`` 10 min.

Once every member is ready and 10 s have passed, the members' requests over ``--idle`` seconds are counted from
their clients' ``request_counts``, minus the watches they (re)opened (``informer_watches_total``): requests per
member per minute beyond the watches. Nothing writes to the plane meanwhile, so what the watches hear is the
apiserver's bookmarks (about one a minute per watch).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from controllers.cluster_registry import ClusterRegistry  # noqa: E402
from controllers.member import MemberOptions  # noqa: E402
from controllers.providers.secrets import SecretOptions, SecretProvider  # noqa: E402
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions  # noqa: E402
from syncer.testing import ControlPlane  # noqa: E402

CONFIGMAPS = GVR("", "v1", "configmaps")
SECRETS = GVR("", "v1", "secrets")


def _setup(api: ApiClient, label: str, probe: float, full: float) -> tuple[ClusterRegistry, CollectorRegistry]:
    metrics = CollectorRegistry()

    def make(client: ApiClient, name: str) -> DiscoveringDynamicSharedInformerFactory:
        return DiscoveringDynamicSharedInformerFactory(
            client, DiscoveryOptions(watch="required", rediscovery_interval=60.0, full_rediscovery_interval=full),
            name=f"discovery {name}", metrics_registry=metrics, metrics_cluster=name)

    registry = ClusterRegistry(api, [SecretProvider(api, SecretOptions(namespaces=(label,)))], MemberOptions(probe_interval=probe),
                               required=[CONFIGMAPS], make_factory=make, metrics_registry=metrics, name=label)
    return registry, metrics


def _beyond_watches(registry: ClusterRegistry, metrics: CollectorRegistry) -> int:
    requests = sum(sum(registry.cluster(n).client.request_counts.codes.values()) for n in registry.list_clusters())
    watches = sum(s.value for f in metrics.collect() for s in f.samples if s.name == "informer_watches_total")
    return requests - int(watches)


async def main(members: int, idle: float) -> None:
    cp = ControlPlane(name="idle-bench")
    cp.start()
    try:
        async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
            contenders = {"old intervals": _setup(api, "old", 15.0, 60.0),
                          "defaults": _setup(api, "new", MemberOptions().probe_interval, 600.0)}
            for label, (registry, _) in contenders.items():
                ns = registry.name  # its Secret namespace (see _setup)
                await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
                for i in range(members):
                    body = {"metadata": {"name": f"m{i}", "labels": {"kube-syncer.io/kubeconfig": "true"}},
                            "data": {"kubeconfig": base64.b64encode(cp.member_kubeconfig()).decode()}}
                    await api.request("POST", SECRETS.path(ns), body=body)
                await registry.start()
            deadline = time.monotonic() + 120
            while not all(len(r.list_clusters()) == members and all(c["ready"] for c in r.status()["clusters"])
                          for r, _ in contenders.values()):
                if time.monotonic() > deadline:
                    raise SystemExit("members not ready within 120 s")
                await asyncio.sleep(0.5)
            await asyncio.sleep(10.0)
            before = {label: _beyond_watches(*c) for label, c in contenders.items()}
            await asyncio.sleep(idle)
            version = (await api.request("GET", "/version")).get("gitVersion")
            print(f"{members} members per registry, {idle:g} s idle, kube-apiserver {version}:")
            for label, c in contenders.items():
                n = _beyond_watches(*c) - before[label]
                print(f"  {label:14} {n:4d} requests beyond watches = {n / members / (idle / 60):.2f} per member "
                      "per minute")
            for registry, _ in contenders.values():
                await registry.stop()
    finally:
        cp.stop()


def _parse() -> Any:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=5)
    p.add_argument("--idle", type=float, default=300.0)
    return p.parse_args()


if __name__ == "__main__":
    args = _parse()
    asyncio.run(main(args.members, args.idle))
