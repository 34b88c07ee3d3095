"""A/B of discovery (c): 60 CRDs created at once until every informer synced, disc_idle_probe.py of two trees in
turn on one control plane. Usage: ab60_probe.py ROUNDS (trees in TREES)."""
import asyncio, json, sys, time, os
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
import disc_common as dc
from informers import ApiClient
from syncer.testing import ControlPlane

TREES = {"A": "/tmp/ab/before", "B": "/work/main"}

async def main():
    cp = ControlPlane(); cp.start()
    try:
        results = {"A": [], "B": []}
        for r in range(int(sys.argv[1])):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                tree = TREES[name]
                prefix = f"bench-idle{r}{name.lower()}"
                env = {**os.environ, "PYTHONPATH": tree}
                proc = await asyncio.create_subprocess_exec(
                    "/work/main/.venv/bin/python", f"{tree}/bench/disc_idle_probe.py", "--kubeconfig", str(cp.kubeconfig),
                    "--include", f"{prefix}-*.example.com/*", "--expect", "60", "--idle", "1", "--settle", "0.5",
                    "--repeat", "1", "--ssl-read-buffer", "262144", cwd=tree, env=env,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
                line = json.loads(await proc.stdout.readline())
                assert line["ev"] == "baseline", line
                driver = ApiClient.from_kubeconfig(str(cp.kubeconfig))
                sem = asyncio.Semaphore(4)
                async def one(i):
                    async with sem:
                        await dc.create_crd(driver, f"{prefix}-{i}.example.com")
                await asyncio.gather(*(one(i) for i in range(60)))
                await driver.close()
                while True:
                    m = json.loads(await proc.stdout.readline())
                    if m["ev"] == "all_synced":
                        break
                results[name].append((round(m["after"], 2), m["passes"]))
                print(name, r, m["after"], m["passes"], flush=True)
                proc.kill(); await proc.wait()
        print(results)
    finally:
        cp.stop()

asyncio.run(main())
