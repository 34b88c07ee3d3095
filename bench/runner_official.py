"""Contender (b): the official client's ``kubernetes.informer.SharedInformer`` (a watch thread, typed models).

Usage: runner_official.py --kubeconfig K --namespace NS --expect N [--mode updates --updates U]
(normally started by informer_bench.py; see _runner_common.py for the output protocol).

SharedInformer has no has-synced signal: its first list fires ADDED once per listed object, so "synced" is the
moment the handler has seen ``--expect`` ADDED events (the namespace holds exactly that many objects).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _runner_common as rc  # noqa: E402

from kubernetes import client, config  # noqa: E402
from kubernetes.informer import ADDED, DELETED, MODIFIED, SharedInformer  # noqa: E402


def main() -> int:
    args = rc.parse_args(__doc__ or "")
    config.load_kube_config(config_file=args.kubeconfig)
    api = client.CoreV1Api()
    informer = SharedInformer(api.list_namespaced_config_map, namespace=args.namespace)

    # Handlers run on the informer's single watch thread; the main thread only waits on the events.
    adds = 0
    all_added = threading.Event()
    latencies: list[float] = []
    all_updates = threading.Event()

    def on_add(obj: client.V1ConfigMap) -> None:
        nonlocal adds
        adds += 1
        if adds == args.expect:
            all_added.set()

    def on_update(obj: client.V1ConfigMap) -> None:
        lat = rc.latency_of(obj.data)
        if lat is not None:
            latencies.append(lat)
            if len(latencies) == args.updates:
                all_updates.set()

    informer.add_event_handler(ADDED, on_add)
    informer.add_event_handler(MODIFIED, on_update)
    informer.add_event_handler(DELETED, lambda obj: None)

    base = rc.baseline()
    informer.start()
    ok = all_added.wait(args.timeout)
    rc.synced(base, objects=len(informer.cache.list_keys()), adds=adds, expect=args.expect, ok=ok)

    if ok and args.mode == "updates":
        cpu0 = rc.wait_for_go()
        t0 = time.monotonic()
        timed_out = not all_updates.wait(args.timeout)
        rc.done(cpu0, t0, latencies, timed_out)

    # stop() joins a thread blocked in a socket read until the next event arrives: not worth waiting for.
    sys.stdout.flush()
    os._exit(0 if ok else 2)


if __name__ == "__main__":
    main()
