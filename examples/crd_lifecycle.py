"""The CRD lifecycle, end to end: a controller starts when its CRD is installed and stops when it is removed.

    python examples/crd_lifecycle.py                 # starts its own local control plane
    python examples/crd_lifecycle.py --kubeconfig K  # or uses an existing cluster (creates/deletes a CRD)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controllers import (  # noqa: E402
    Controller, ControllerContext, ControllerManager, ManagedController, ReconcileContext, Request,
)
from informers import ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ResourceFilter  # noqa: E402
from examples.plugins.widget_status import WIDGETS  # noqa: E402
from syncer.logs import setup_logging  # noqa: E402

CRD = json.loads((Path(__file__).parent / "crds" / "widget.json").read_text())
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def main(kubeconfig: str) -> None:
    reconciled: list[str] = []

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        reconciled.append(req.key)
        widget = rc.lister().get(req.name, req.namespace)
        say(f"  reconcile {req.key}: size {(widget or {}).get('spec', {}).get('size')}")

    def create(ctx: ControllerContext) -> Any:
        say("controller created (its CRD is served and synced)")
        return Controller("widgets", reconcile).for_(WIDGETS).run

    async with ApiClient.from_kubeconfig(kubeconfig) as client:
        factory = DiscoveringDynamicSharedInformerFactory(
            client, DiscoveryOptions(filter=ResourceFilter(include=["examples.kube-syncer.io/*"])))
        manager = ControllerManager("example", factory, {"widgets": ManagedController([WIDGETS], create)},
                                    client=client)
        await factory.start()
        await manager.start()

        def state() -> str:
            return manager.status()["widgets"].state

        say(f"controller 'widgets' is {state()} (no Widget CRD yet)")
        try:
            say("installing the Widget CRD")
            await client.request("POST", CRD_PATH, body=CRD)
            await wait_for(lambda: state() == "running", "the controller to start")
            say("controller 'widgets' is running")
            await asyncio.sleep(0.3)
            await client.request("POST", WIDGETS.path("default"), body={
                "apiVersion": "examples.kube-syncer.io/v1", "kind": "Widget",
                "metadata": {"name": "demo"}, "spec": {"size": 1}})
            await wait_for(lambda: "default/demo" in reconciled, "the widget to be reconciled")
            say("deleting the Widget CRD")
            await client.request("DELETE", f"{CRD_PATH}/{CRD['metadata']['name']}")
            await wait_for(lambda: state() == "waiting", "the controller to stop")
            say(f"controller 'widgets' is {state()}: missing {manager.status()['widgets'].missing}")
        finally:
            await manager.stop()
            await factory.shutdown()
    say("done")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", help="use this cluster instead of a local control plane")
    args = parser.parse_args()
    setup_logging("INFO")
    if args.kubeconfig:
        asyncio.run(main(args.kubeconfig))
    else:
        from syncer.testing import ControlPlane

        with ControlPlane() as cp:
            say(f"local control plane at {cp.url}")
            asyncio.run(main(str(cp.kubeconfig)))
