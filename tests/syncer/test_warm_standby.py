"""Warm standby: a standby keeps its controllers' informers synced, so a new leader reconciles without listing
(two ``syncer run`` sidecars, the leader SIGKILLed; real apiserver)."""

from __future__ import annotations

import re
import subprocess
import sys

import kubernetes
import pytest

from controllers import ManagedController
from informers import GVR
from syncer.plugins import Plugins
from syncer.settings import Clusters, Settings
from syncer.testing.pytest_plugin import kube_client
from syncer.workload import Process
from syncer.workloads.fleet import Fleet
from tests.sidecar import Sidecar

# watch = "required": without the warm standby a standby would watch none of the plugin's GVRs.
SETTINGS = ('watch = "required"\nwarm_standby = {warm}\n[leader_election]\nenabled = true\n'
            'lease_namespace = "default"\nlease_duration = "4s"\nrenew_deadline = "3s"\nretry_period = "0.5s"\n')
PLUGIN = ("examples.plugins.configmap_mirror",)  # requires configmaps and namespaces
WATCHED = ("configmaps.v1", "namespaces.v1")
# A full list is a LIST, or a watch-list stream (sendInitialEvents: how the informers list a server that has it).
INITIAL_LIST = re.compile(r'^informer_(?:lists_total\{[^}]*|watches_total\{(?=[^}]*mode="watch_list")[^}]*)'
                          r'gvr="([^"]+)"[^}]*\} (\S+)$', re.M)


def gvr_states(car: Sidecar) -> dict[str, str]:
    return {g["gvr"]: g["state"] for g in car.status().get("gvrs", [])}


def reconciles(car: Sidecar) -> int:
    return sum(c.get("reconciles", 0) for c in car.status().get("controllers", []))


def lists(car: Sidecar) -> dict[str, float]:
    """How many times ``car``'s informers listed each watched GVR (from its /metrics)."""
    code, text = car.get("/metrics")
    assert code == 200, text
    counts = dict.fromkeys(WATCHED, 0.0)
    for gvr, value in INITIAL_LIST.findall(text):
        if gvr in counts:
            counts[gvr] += float(value)
    return counts


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_new_leader_reconciles_without_listing_when_the_standby_was_warm(control_plane_factory, sidecars,
                                                                           warm: bool) -> None:
    cp = control_plane_factory()
    core = kubernetes.client.CoreV1Api(kube_client(cp))
    core.create_namespaced_config_map("default", {"metadata": {"name": "warm-src",
                                                               "labels": {"kube-syncer.io/mirror": "true"}}})
    sc = {n: sidecars(str(cp.kubeconfig), n, SETTINGS.format(warm=str(warm).lower()), plugins=PLUGIN)
          for n in ("a", "b")}
    sc["a"].wait(lambda: any(c.status().get("leader") for c in sc.values()), "a leader", timeout=60)
    leader, standby = (sc["a"], sc["b"]) if sc["a"].status().get("leader") else (sc["b"], sc["a"])
    leader.wait(lambda: reconciles(leader) > 0, "the leader's first reconcile")
    standby.wait(lambda: standby.status().get("ready") is True, "the standby ready")
    if warm:
        # Synced while standing by, its controllers not running.
        standby.wait(lambda: all(gvr_states(standby).get(g) == "synced" for g in WATCHED),
                     "the standby's informers synced")
        status = standby.status()
        assert status["leader"] is False and set(status["warm_standby"]) == set(WATCHED)
        assert {c["state"] for c in status["controllers"]} == {"standby"}, status["controllers"]
        out = subprocess.run([sys.executable, "-m", "syncer", "status", "--url",
                              f"http://127.0.0.1:{standby.port}/status"], capture_output=True, text=True, timeout=30)
        assert "leader=False" in out.stdout and "warm standby=2 GVRs" in out.stdout, out.stdout + out.stderr
    else:
        assert all(gvr_states(standby).get(g) == "idle" for g in WATCHED), gvr_states(standby)
        assert standby.status()["warm_standby"] == []
    before = lists(standby)
    leader.proc.kill()
    leader.proc.wait()
    standby.wait(lambda: standby.status().get("leader") is True, "the standby taking over", timeout=30)
    standby.wait(lambda: reconciles(standby) > 0, "the new leader's first reconcile")
    listed = {g: n - before[g] for g, n in lists(standby).items()}
    if warm:
        assert all(n >= 1 for n in before.values()), before  # listed while standing by
        assert listed == dict.fromkeys(WATCHED, 0.0), listed
    else:
        assert all(n >= 1 for n in listed.values()), listed


def test_a_fleet_standby_warms_only_the_local_member() -> None:
    # Other members are connected only for a term; the local one's informers are the sidecar's own.
    configmaps = GVR("", "v1", "configmaps")
    plugins = Plugins.of({"c": ManagedController([configmaps], lambda ctx: None)})
    for include_local, warm in ((True, {configmaps}), (False, set())):
        settings = Settings(clusters=Clusters(enabled=True, include_local=include_local))
        process = Process(settings, None, "me", None, None)  # type: ignore[arg-type]  # none used here
        assert Fleet(process, plugins, lambda *a, **k: None, 1.0).standby_gvrs() == warm  # type: ignore[arg-type]
