"""Benchmark: CRD Established -> a managed controller's first reconcile of an object created right after it.

Usage (cwd /work/main):  .venv/bin/python bench/controller_bench.py [--crds 50] [--post-crds 20] [--json OUT.json]

One DiscoveringDynamicSharedInformerFactory (include bench-c*.example.com/*), one ControllerManager with one
ManagedController per CRD GVR (all registered up front, so all but the running ones wait for their GVR), each
``Controller(name, reconcile).watch(gvr).run``. CRDs are created one after another (``--gap`` s pause between
two). disc_stamp.py (its own process) time-stamps Established from its CRD watch and creates the object
``default/probe`` at once:

- ``--crds`` CRDs (bench-cs<i>) whose object is created by server-side apply: it exists within ms;
- ``--post-crds`` CRDs (bench-cp<i>) whose object is POSTed: kube-apiserver holds that create ~2 s
  (see disc_stamp.py), so this variant measures mostly the server.

Per CRD: Established -> first reconcile of the object; Established -> controller started (its ``create`` called
by the manager); object create returned -> first reconcile. One warm-up CRD per variant is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import disc_common as dc  # noqa: E402

from controllers import Controller, ControllerManager, ManagedController, Request  # noqa: E402
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ResourceFilter  # noqa: E402
from loguru import logger  # noqa: E402
from syncer.testing import ControlPlane  # noqa: E402


def groups(tag: str, n: int) -> list[str]:
    return [f"bench-{tag}{i if i >= 0 else 'warm'}.example.com" for i in range(-1, n)]


class Recorder:
    def __init__(self) -> None:
        self.started: dict[GVR, float] = {}
        self.reconciled: dict[GVR, float] = {}
        self.reconciles = 0
        self.changed = asyncio.Event()

    def managed(self, gvr: GVR) -> ManagedController:
        async def reconcile(req: Request) -> None:
            self.reconciles += 1
            if req.name == dc.OBJ_NAME and gvr not in self.reconciled:
                self.reconciled[gvr] = time.monotonic()
                self.changed.set()

        def create(ctx: Any) -> Any:
            self.started.setdefault(gvr, time.monotonic())
            return Controller(f"bench-{gvr.group}", reconcile).watch(gvr).run

        return ManagedController(required_gvrs=[gvr], create=create)

    async def wait(self, gvr: GVR, timeout: float) -> bool:
        return await dc.wait_until(self.changed, lambda: gvr in self.reconciled, timeout)


async def variant(args: argparse.Namespace, driver: ApiClient, stamper: dc.Stamper, rec: Recorder,
                  names: list[str], mode: str) -> dict[str, Any]:
    rows = []
    for group in names:
        gvr = GVR(group, "v1", dc.PLURAL)
        await dc.create_crd(driver, group)
        t_est = await stamper.established(group, 30)
        created = await stamper.created(group, 30)
        ok = await rec.wait(gvr, args.timeout) and t_est is not None
        row: dict[str, Any] = {"group": group, "t_established": t_est, "ok": ok, "created": created}
        if ok:
            row["latency"] = rec.reconciled[gvr] - t_est
            row["started_after"] = rec.started[gvr] - t_est if gvr in rec.started else None
            if created and created.get("ev") == "created":
                row["object_created_after"] = created["t"] - t_est
                row["reconcile_after_create"] = rec.reconciled[gvr] - created["t"]
        if "warm" not in group:
            rows.append(row)
        print(f"[{mode}] {group}: first reconcile {row.get('latency', float('nan')) * 1000:.0f} ms, controller "
              f"started {(row.get('started_after') or float('nan')) * 1000:.0f} ms, object created "
              f"{row.get('object_created_after', float('nan')) * 1000:.0f} ms after Established",
              file=sys.stderr, flush=True)
        await asyncio.sleep(args.gap)
    ok_rows = [r for r in rows if r["ok"]]
    return {
        "rows": rows, "failed": len(rows) - len(ok_rows),
        "first_reconcile": dc.summary_ms([r["latency"] for r in ok_rows]),
        "controller_started": dc.summary_ms([r["started_after"] for r in ok_rows if r.get("started_after")]),
        "object_created": dc.summary_ms([r["object_created_after"] for r in ok_rows if "object_created_after" in r]),
        "reconcile_after_create": dc.summary_ms([r["reconcile_after_create"] for r in ok_rows
                                                 if "reconcile_after_create" in r]),
    }


async def run(args: argparse.Namespace, cp: ControlPlane, logdir: Path) -> dict[str, Any]:
    kubeconfig = str(cp.kubeconfig)
    driver = ApiClient.from_kubeconfig(kubeconfig)
    client = ApiClient.from_kubeconfig(kubeconfig)
    stamper = await dc.Stamper().launch(kubeconfig, "bench-c", {"bench-cs": "apply", "bench-cp": "post"},
                                        logdir / "stamp-controller.log")
    apply_groups, post_groups = groups("cs", args.crds), groups("cp", args.post_crds)
    rec = Recorder()
    f = DiscoveringDynamicSharedInformerFactory(
        client, DiscoveryOptions(filter=ResourceFilter(include=["bench-c*.example.com/*"])))
    await f.start()
    controllers = {g: rec.managed(GVR(g, "v1", dc.PLURAL)) for g in apply_groups + post_groups}
    manager = ControllerManager("bench", f, controllers, client=client)
    await manager.start()
    out: dict[str, Any] = {"controllers_registered": len(controllers)}
    try:
        out["apply"] = await variant(args, driver, stamper, rec, apply_groups, "apply")
        out["post"] = await variant(args, driver, stamper, rec, post_groups, "post")
        states: dict[str, int] = {}
        for st in manager.status().values():
            states[st.state] = states.get(st.state, 0) + 1
        out["controller_states_at_end"] = states
        out["manager_passes"] = manager.passes
        out["factory_passes"] = f.passes
        out["reconciles_total"] = rec.reconciles
        out["failures"] = {n: st.last_error for n, st in manager.status().items() if st.failures}
    finally:
        t = time.monotonic()
        await manager.stop()
        out["manager_stop_seconds"] = time.monotonic() - t
        await f.shutdown()
        await stamper.stop()
        await client.close()
        await driver.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--crds", type=int, default=50)
    p.add_argument("--post-crds", type=int, default=20)
    p.add_argument("--gap", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--wait-quiet", type=float, default=0.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    note = dc.wait_for_quiet_machine(args.wait_quiet) if args.wait_quiet else "no wait for other benchmarks"
    result: dict[str, Any] = {"env": dc.environment(), "argv": sys.argv, "args": vars(args)}
    logdir = Path(tempfile.mkdtemp(prefix="controller-bench-"))
    t0 = time.monotonic()
    cp = ControlPlane().start()
    try:
        result["run"] = asyncio.run(run(args, cp, logdir))
    finally:
        cp.stop()
    result["wall_seconds"] = time.monotonic() - t0
    result["machine_note"] = dc.note_concurrent(note)
    dc.write_json(args.json, result)
    r = result["run"]
    print(json.dumps({"machine_note": result["machine_note"], "wall_seconds": result["wall_seconds"],
                      **{v: {k: r[v][k] for k in ("first_reconcile", "controller_started", "object_created",
                                                  "reconcile_after_create", "failed")} for v in ("apply", "post")},
                      **{k: r[k] for k in ("controllers_registered", "controller_states_at_end", "manager_passes",
                                           "factory_passes", "reconciles_total", "failures",
                                           "manager_stop_seconds")}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
