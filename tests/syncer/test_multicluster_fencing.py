"""Multi-cluster mode keeps the leadership fence: a paused leader never writes into a member cluster next to its
successor, whether the standbys keep the members warm (connected, their informers synced: ``warm_standby``, the
default) or do not connect to them at all (real apiservers, `syncer run` processes).

The management plane is the session's (the kubeconfig Secret and the lease are in a fresh namespace of it); the
member is a private workload plane, where ``tests/plugins/fence_writer.py`` keeps stamping one ConfigMap.
"""

from __future__ import annotations

import base64
import signal
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import kubernetes
import pytest

from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from tests.fenced_writes import Writes
from tests.fleet import kubeconfig
from tests.sidecar import Sidecar

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
MEMBER = "w1"
LEASE_NAME = "kube-syncer-fence"


def settings(namespace: str, identity: str, warm: bool) -> str:
    """The sidecar's extra settings: the fencing test's short lease (in ``namespace``), multi-cluster mode with the
    Secrets of ``namespace``, the writer's identity, and whether the standby is ``warm``."""
    return (f'warm_standby = {str(warm).lower()}\n[leader_election]\nenabled = true\n'
            f'lease_namespace = "{namespace}"\nlease_name = "{LEASE_NAME}"\n'
            'lease_duration = "6s"\nrenew_deadline = "4s"\nretry_period = "0.5s"\n'
            f'[clusters]\nenabled = true\nnamespaces = ["{namespace}"]\nsync_timeout = "20s"\n'
            f'[plugin_settings.fence_writer]\nidentity = "{identity}"\n')


def members(status: dict[str, Any]) -> list[str] | None:
    """The member clusters a ``/status`` document shows (None if it has no ``clusters`` document)."""
    clusters = status.get("clusters")
    return None if clusters is None else [c["name"] for c in clusters["clusters"]]


def cluster_watches(cp: ControlPlane) -> int:
    """How many cluster-wide ConfigMap watches ``cp``'s apiserver serves now: one per sidecar that runs the writer's
    informer there (the apiserver's own ConfigMap watches, and the test's, are namespaced)."""
    req = urllib.request.Request(cp.url + "/metrics", headers={"Authorization": f"Bearer {cp.admin_token}"})
    with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(cp.ca_file))) as r:
        lines = r.read().decode().splitlines()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines if line.startswith(
        "apiserver_longrunning_requests{") and all(
        f'{k}="{v}"' in line for k, v in (("resource", "configmaps"), ("scope", "cluster"), ("verb", "WATCH"))))


def synced(status: dict[str, Any]) -> bool:
    """Whether the one member of a ``/status`` document has its informers synced (its Synced condition)."""
    rows = (status.get("clusters") or {}).get("clusters") or []
    return len(rows) == 1 and any(c["type"] == "Synced" and c["status"] == "True" for c in rows[0]["conditions"])


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_resumed_leader_writes_nothing_in_the_member_after_the_standby_took_over(
        control_plane: ControlPlane, control_plane_factory: Callable[[], ControlPlane], namespace: str,
        sidecars: Callable[..., Sidecar], warm: bool) -> None:
    workload = control_plane_factory()
    with kube_client(workload) as k:
        kubernetes.client.CoreV1Api(k).create_namespaced_config_map(
            "default", {"metadata": {"name": "fenced", "labels": {"fence-test": "true"}}})
    with kube_client(control_plane) as k:
        kubernetes.client.CoreV1Api(k).create_namespaced_secret(namespace, {
            "metadata": {"name": MEMBER, "labels": {"kube-syncer.io/kubeconfig": "true"}},
            "data": {"kubeconfig": base64.b64encode(kubeconfig(workload)).decode()}})
    plugin = (str(PLUGINS / "fence_writer.py"),)
    sc = {n: sidecars(str(control_plane.kubeconfig), n, settings(namespace, n, warm), plugins=plugin) for n in ("a", "b")}
    writes = Writes(workload, "fenced")  # the member's ConfigMap: every write there, by writer, in order
    try:
        sc["a"].wait(lambda: bool(writes.writers), "the leader writing into the member", timeout=60)
        first = writes.writers[0]
        other = "b" if first == "a" else "a"
        leader, standby = sc[first], sc[other]
        assert members(leader.status()) == [MEMBER], leader.status().get("clusters")

        # The standby, ready and waiting for the lease: warm, it has the member connected and its informer synced
        # (one more watch there), cold it does not connect to it; it writes nothing either way. Sampled on every
        # poll while the leader goes on writing there, from its /status and from the member's apiserver (its
        # watches last minutes, so none is being replaced meanwhile).
        if warm:
            standby.wait(lambda: synced(standby.status()), "the standby's member synced", timeout=30)
        seen: list[Any] = []
        watches: list[int] = []

        def standby_idle_and_leader_writing() -> bool:
            st = standby.status()
            if st.get("ready") and st.get("leader") is False:
                seen.append(members(st))
                watches.append(cluster_watches(workload))
            return len(seen) >= 5 and len(writes.writers) > 20

        standby.wait(standby_idle_and_leader_writing, "the standby ready while the leader writes", timeout=30)
        replicas = 2 if warm else 1
        assert all(s == ([MEMBER] if warm else []) for s in seen), f"the standby's member clusters: {seen}"
        assert set(watches) == {replicas}, f"ConfigMap watches in the member while one replica leads: {watches}"
        assert set(writes.writers) == {first}, f"someone but the leader wrote into the member: {writes.writers}"
        assert "became leader" not in standby.log, standby.log[-3000:]
        assert (f"cluster {MEMBER} is up" in standby.log) is warm, standby.log[-3000:]

        leader.proc.send_signal(signal.SIGSTOP)
        # the standby takes the lease once it has not seen it renewed for lease_duration, connects to the member,
        # and writes there
        standby.wait(lambda: other in writes.writers, "the standby taking over and writing into the member",
                     timeout=40)
        assert members(standby.status()) == [MEMBER], standby.status().get("clusters")
        # the count sees every replica's watch: the paused one's is still open
        standby.wait(lambda: cluster_watches(workload) == 2, "the member serving both replicas' watches", timeout=10)
        time.sleep(1.0)  # the paused leader stays paused well past its term, with work queued and timers due
        leader.proc.send_signal(signal.SIGCONT)
        leader.wait(lambda: "lost leadership" in leader.log, "the resumed replica noticing", timeout=15)
        # standing by: warm, it keeps the member (and its watch); cold, it lets go of it (its watch there, open
        # while it was paused, ends)
        leader.wait(lambda: leader.status().get("leader") is False and members(leader.status()) == (
            [MEMBER] if warm else []), "the resumed replica standing by", timeout=15)
        leader.wait(lambda: cluster_watches(workload) == replicas, "the member serving the standby's watches",
                    timeout=15)
        # give any write it would still send time to show up
        standby.wait(lambda: len(writes.after_first(other)) > 30, "more writes by the new leader", timeout=20)
        after = writes.after_first(other)
        # Under heavy load the new leader can miss its own deadline and the old one win the lease back: then its
        # writes are legitimate, and this run cannot judge the fence.
        assert leader.log.count("became leader") == 1, "leadership moved back:\n" + leader.log[-3000:]
        assert first not in after, f"the resumed old leader wrote into the member after its successor: {after}\n" \
            + leader.log[-3000:]
        assert leader.proc.poll() is None and standby.proc.poll() is None, leader.log[-3000:]
        with kube_client(control_plane) as k:
            lease = kubernetes.client.CoordinationV1Api(k).read_namespaced_lease(LEASE_NAME, namespace)
        assert lease.spec.holder_identity == other and lease.spec.lease_transitions >= 1
    finally:
        writes.stop()
