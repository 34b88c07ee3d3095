"""Warm standby: a standby keeps its controllers' informers synced, so a new leader reconciles without listing,
in the local cluster and in every member of a fleet (two ``syncer run`` sidecars, the leader SIGKILLed; real
apiservers)."""

from __future__ import annotations

import base64
import re
import signal
import subprocess
import sys
from typing import Any, Callable

import kubernetes
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controllers import ManagedController
from informers import GVR
from syncer.plugins import Plugins
from syncer.settings import Clusters, Settings
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from syncer.workload import Process
from syncer.workloads.fleet import Fleet
from tests.fleet import kubeconfig
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


FLEET = ('watch = "required"\nwarm_standby = {warm}\n[leader_election]\nenabled = true\n'
         'lease_namespace = "{ns}"\nlease_duration = "4s"\nrenew_deadline = "3s"\nretry_period = "0.5s"\n'
         '[clusters]\nenabled = true\nnamespaces = ["{ns}"]\nsync_timeout = "20s"\n')
MEMBER = "w1"


def member_lists(car: Sidecar) -> dict[str, float]:
    """How many times ``car``'s informers in the member listed each watched GVR (its /metrics, label cluster)."""
    code, text = car.get("/metrics")
    assert code == 200, text
    counts = dict.fromkeys(WATCHED, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("cluster") == MEMBER and labels.get("gvr") in counts and (
                    sample.name == "informer_lists_total" or
                    (sample.name == "informer_watches_total" and labels.get("mode") == "watch_list")):
                counts[labels["gvr"]] += sample.value
    return counts


def member_row(car: Sidecar) -> dict[str, Any]:
    rows = (car.status().get("clusters") or {}).get("clusters") or []
    return next((r for r in rows if r["name"] == MEMBER), {})


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_new_fleet_leader_reconciles_in_a_member_without_listing_when_the_standby_was_warm(
        control_plane: ControlPlane, control_plane_factory: Callable[[], ControlPlane], namespace: str,
        sidecars: Callable[..., Sidecar], warm: bool) -> None:
    workload = control_plane_factory()
    kubernetes.client.CoreV1Api(kube_client(workload)).create_namespaced_config_map("default", {"metadata": {
        "name": "warm-src", "labels": {"kube-syncer.io/mirror": "true"}}})
    kubernetes.client.CoreV1Api(kube_client(control_plane)).create_namespaced_secret(namespace, {
        "metadata": {"name": MEMBER, "labels": {"kube-syncer.io/kubeconfig": "true"}},
        "data": {"kubeconfig": base64.b64encode(kubeconfig(workload)).decode()}})
    extra = FLEET.format(warm=str(warm).lower(), ns=namespace)
    sc = {n: sidecars(str(control_plane.kubeconfig), n, extra, plugins=PLUGIN) for n in ("a", "b")}
    sc["a"].wait(lambda: any(c.status().get("leader") for c in sc.values()), "a leader", timeout=60)
    leader, standby = (sc["a"], sc["b"]) if sc["a"].status().get("leader") else (sc["b"], sc["a"])
    leader.wait(lambda: reconciles(leader) > 0, "the leader's first reconcile in the member", timeout=60)
    standby.wait(lambda: standby.status().get("ready") is True, "the standby ready")
    if warm:
        # The member connected, discovered and its required informers synced while standing by, no controller
        # running: /status shows it with every condition true.
        standby.wait(lambda: member_row(standby).get("state") == "ready", "the standby's member ready", timeout=60)
        row = member_row(standby)
        assert {c["type"]: c["status"] for c in row["conditions"]} == dict.fromkeys(
            ("Connected", "Discovered", "Synced"), "True"), row
        status = standby.status()
        assert status["leader"] is False and {c["state"] for c in status["controllers"]} == {"standby"}, status
        assert status["clusters"]["fleet_components"] == [] and status["clusters"]["fleet_controllers"] == []
    else:
        assert member_row(standby) == {}, standby.status().get("clusters")
    before = member_lists(standby)
    leader.proc.kill()
    leader.proc.wait()
    standby.wait(lambda: standby.status().get("leader") is True, "the standby taking over", timeout=30)
    standby.wait(lambda: reconciles(standby) > 0, "the new leader's first reconcile in the member", timeout=60)
    listed = {g: n - before[g] for g, n in member_lists(standby).items()}
    if warm:
        assert all(n >= 1 for n in before.values()), before  # listed while standing by
        assert listed == dict.fromkeys(WATCHED, 0.0), listed
    else:
        assert all(n >= 1 for n in listed.values()), listed
    # A stop request ends the term, then the registry (warm: the process's), cleanly.
    standby.proc.send_signal(signal.SIGTERM)
    assert standby.proc.wait(30) == 0, standby.log[-3000:]
    assert "Traceback" not in standby.log and not re.search(r"\d (ERROR|CRITICAL) ", standby.log), standby.log[-3000:]
    # warm: the members stay until the lease is released (cold: they go with the term, before it)
    released, gone = standby.log.index("released the lease"), standby.log.rindex("(the registry is stopping)")
    assert (released < gone) is warm, standby.log[-3000:]


def test_a_fleet_standby_declares_the_local_members_gvrs() -> None:
    # The local member's informers are the sidecar's own: declared before discovery, so that its first pass
    # starts them; the other members are the registry's, which the warm standby runs from discovery on.
    configmaps = GVR("", "v1", "configmaps")
    plugins = Plugins.of({"c": ManagedController([configmaps], lambda ctx: None)})
    for include_local, warm in ((True, {configmaps}), (False, set())):
        settings = Settings(clusters=Clusters(enabled=True, include_local=include_local))
        process = Process(settings, None, "me", None, None)  # type: ignore[arg-type]  # none used here
        assert Fleet(process, plugins, lambda *a, **k: None, 1.0).standby_gvrs() == warm  # type: ignore[arg-type]
