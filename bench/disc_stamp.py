"""Time stamper for the CRD benchmarks: its own process, its own event loop, nothing else to do.

Usage: disc_stamp.py --kubeconfig K --prefix bench- [--create bench-ks=apply] [--create bench-kp=post]

Watches CRDs with one SharedIndexInformer of our package (one watch connection, no polling). When a CRD whose
group starts with ``--prefix`` turns Established (status.conditions Established=True, seen in a watch event),
prints ``{"ev": "established", "group": G, "t": time.monotonic()}``. For groups starting with a ``--create``
prefix it then creates the namespaced object ``default/probe`` of that CRD at once, retrying every 5 ms while the
server answers 404 (it can for a few ms after Established), and prints ``{"ev": "created", "group", "t",
"attempts", "mode"}`` when the request has returned. Modes:

- ``post``: a plain POST (``kubectl create``). kube-apiserver v1.36 HOLDS a create of a custom object for 2 s when
  its CRD's Established condition changed less than 2 s ago (apiextensions-apiserver
  pkg/apiserver/customresource_handler.go, ``justCreated ... time.Sleep(2 * time.Second)``, for HA setups), so
  such an object exists only ~2 s after Established whoever creates it.
- ``apply``: server-side apply (PATCH ``application/apply-patch+yaml``, ``kubectl apply --server-side``), which
  creates the object through the patch handler, without that hold: the object exists within milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from disc_common import KIND, OBJ_NAME, OBJ_NS, obj_path  # noqa: E402

from informers import ApiClient, ApiError, FuncHandler, GVR, SharedIndexInformer  # noqa: E402

CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def out(**kw: object) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def established(crd: dict) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or ())


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--create", action="append", default=[], metavar="PREFIX=MODE",
                   help="create the probe object for groups starting with PREFIX, by MODE post or apply")
    args = p.parse_args()
    client = ApiClient.from_kubeconfig(args.kubeconfig)
    writer = ApiClient.from_kubeconfig(args.kubeconfig)  # own connection pool for the object creations
    stamped: set[str] = set()
    tasks: set[asyncio.Task[None]] = set()

    modes = [tuple(c.split("=", 1)) for c in args.create]

    async def create(group: str, mode: str) -> None:
        body = {"apiVersion": f"{group}/v1", "kind": KIND, "metadata": {"name": OBJ_NAME, "namespace": OBJ_NS}}
        attempts = 0
        deadline = time.monotonic() + 10
        while True:
            attempts += 1
            try:
                if mode == "apply":
                    await writer.request("PATCH", obj_path(group, OBJ_NAME), params={"fieldManager": "bench"},
                                         body=body, headers={"Content-Type": "application/apply-patch+yaml"},
                                         timeout=10)
                else:
                    await writer.request("POST", obj_path(group), body=body, timeout=10)
                out(ev="created", group=group, t=time.monotonic(), attempts=attempts, mode=mode)
                return
            except ApiError as e:
                if e.status == 404 and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                    continue
                out(ev="create_failed", group=group, t=time.monotonic(), attempts=attempts, error=str(e))
                return

    def seen(crd: dict) -> None:
        t = time.monotonic()
        group = (crd.get("spec") or {}).get("group", "")
        if not group.startswith(args.prefix) or group in stamped or not established(crd):
            return
        stamped.add(group)
        out(ev="established", group=group, t=t, rv=crd["metadata"].get("resourceVersion"))
        mode = next((m for prefix, m in modes if group.startswith(prefix)), None)
        if mode is not None:
            task = asyncio.create_task(create(group, mode))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def on_add(obj: dict, initial: bool) -> None:
        if not initial:
            seen(obj)

    inf = SharedIndexInformer(client, CRDS)
    inf.add_event_handler(FuncHandler(on_add=on_add, on_update=lambda old, new: seen(new)), name="stamp")
    inf.start()
    await inf.wait_for_sync()
    for crd in inf.store:  # already established before we started: never stamp them
        stamped.add((crd.get("spec") or {}).get("group", ""))
    out(ev="ready", t=time.monotonic())
    try:
        await asyncio.Event().wait()
    finally:
        await inf.stop()
        await client.close()
        await writer.close()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
