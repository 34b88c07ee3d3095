"""The sidecar as users run it: `python -m syncer run` as a subprocess against a real control plane."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import kubernetes

from syncer.testing.pytest_plugin import kube_client
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
WIDGET_CRD = json.loads((ROOT / "examples" / "crds" / "widget.json").read_text())


def test_plugin_controller_follows_its_crd(control_plane_factory, sidecars) -> None:
    cp = control_plane_factory()
    api = kube_client(cp)
    car = sidecars(str(cp.kubeconfig))
    car.wait(lambda: car.get("/readyz")[0] == 200, "readiness")
    assert car.controller_state("widget-status") == "waiting"
    ext = kubernetes.client.ApiextensionsV1Api(api)
    ext.create_custom_resource_definition(WIDGET_CRD)
    car.wait(lambda: car.controller_state("widget-status") == "running", "the controller to start")
    assert "started controller widget-status" in car.log
    custom = kubernetes.client.CustomObjectsApi(api)
    for attempt in range(50):  # the new resource's REST handler can lag its Established condition briefly
        try:
            custom.create_namespaced_custom_object("examples.kube-syncer.io", "v1", "default", "widgets", {
                "apiVersion": "examples.kube-syncer.io/v1", "kind": "Widget", "metadata": {"name": "w"},
                "spec": {"size": 2}})
            break
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise
            time.sleep(0.1)
    car.wait(lambda: (get_widget(custom).get("status") or {}).get("observedGeneration") == 1, "the widget's status")
    # the owned ConfigMap, the finalizer, the Events
    core = kubernetes.client.CoreV1Api(api)
    cm = core.read_namespaced_config_map("w", "default")
    assert cm.data == {"size": "2"}
    [ref] = cm.metadata.owner_references
    assert (ref.kind, ref.name, ref.controller) == ("Widget", "w", True)
    assert get_widget(custom)["metadata"]["finalizers"] == ["examples.kube-syncer.io/cleanup"]
    car.wait(lambda: {"ConfigMapSynced", "Ready"} <= event_reasons(api, "w"), "the widget's Events")
    # a spec change is reconciled; the ConfigMap follows, and is put back when deleted by hand. Ready stays True,
    # so its lastTransitionTime (pinned in the past here, as if set long ago) must not move.
    [ready] = get_widget(custom)["status"]["conditions"]
    assert (ready["type"], ready["status"], ready["observedGeneration"]) == ("Ready", "True", 1)
    custom.patch_namespaced_custom_object_status("examples.kube-syncer.io", "v1", "default", "widgets", "w", {
        "status": {"conditions": [{**ready, "lastTransitionTime": "2020-01-01T00:00:00Z"}]}})
    custom.patch_namespaced_custom_object("examples.kube-syncer.io", "v1", "default", "widgets", "w",
                                          {"spec": {"size": 3}})
    car.wait(lambda: (get_widget(custom).get("status") or {}).get("observedGeneration") == 2, "generation 2")
    [ready] = get_widget(custom)["status"]["conditions"]
    assert (ready["message"], ready["observedGeneration"], ready["lastTransitionTime"]) == (
        "size is 3", 2, "2020-01-01T00:00:00Z")
    assert core.read_namespaced_config_map("w", "default").data == {"size": "3"}
    core.delete_namespaced_config_map("w", "default")
    car.wait(lambda: configmap_data(core, "default", "w") == {"size": "3"}, "the ConfigMap put back")
    # deleting the Widget runs finalize, which deletes the ConfigMap (no garbage collector runs here)
    custom.delete_namespaced_custom_object("examples.kube-syncer.io", "v1", "default", "widgets", "w")
    car.wait(lambda: configmap_data(core, "default", "w") is None and not get_widget(custom), "the cleanup")
    assert "CleanedUp" in event_reasons(api, "w")
    ext.delete_custom_resource_definition(WIDGET_CRD["metadata"]["name"])
    car.wait(lambda: car.controller_state("widget-status") == "waiting", "the controller to stop")
    assert "stopping controller widget-status" in car.log
    code, metrics = car.get("/metrics")
    assert code == 200 and "controller_manager_starts_total" in metrics and "informer_events_total" in metrics
    assert 'controller_runtime_reconcile_total{controller="widget-status",result="success"}' in metrics
    assert car.get("/healthz")[0] == 200
    car.proc.send_signal(signal.SIGTERM)
    assert car.proc.wait(15) == 0


def get_widget(custom: kubernetes.client.CustomObjectsApi, name: str = "w") -> dict:
    """The Widget ``name`` in namespace default, or {} once it is gone."""
    try:
        return custom.get_namespaced_custom_object("examples.kube-syncer.io", "v1", "default", "widgets", name)
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return {}
        raise


def configmap_data(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> dict | None:
    try:
        return core.read_namespaced_config_map(name, namespace).data
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return None
        raise


def event_reasons(api: kubernetes.client.ApiClient, name: str) -> set[str]:
    events = kubernetes.client.EventsV1Api(api).list_namespaced_event("default").items
    return {e.reason for e in events if e.regarding.name == name}


LEASE = ('[leader_election]\nenabled = true\nlease_namespace = "default"\nlease_duration = "3s"\n'
         'renew_deadline = "2s"\nretry_period = "0.5s"\n')


def test_leader_election_failover_release_and_no_dual_leadership(control_plane_factory, sidecars) -> None:
    cp = control_plane_factory()
    cars = {n: sidecars(str(cp.kubeconfig), n, LEASE) for n in ("a", "b")}
    samples: list[set[str]] = []

    def leaders() -> set[str]:
        current = {n for n, c in cars.items() if c.proc.poll() is None and c.status().get("leader")}
        samples.append(current)
        return current

    for c in cars.values():
        c.wait(lambda c=c: c.get("/readyz")[0] == 200, "readiness (standby replicas too)")
    cars["a"].wait(lambda: len(leaders()) == 1, "one leader")
    first = leaders().pop()
    standby = "b" if first == "a" else "a"
    # graceful stop: exit 0 and the lease is released, so the standby takes over without waiting it out
    cars[first].proc.send_signal(signal.SIGTERM)
    t = time.monotonic()
    assert cars[first].proc.wait(15) == 0
    cars[standby].wait(lambda: leaders() == {standby}, "takeover after release", timeout=10)
    assert time.monotonic() - t < 3.0  # well under the 3 s lease: it was released, not expired
    # a third replica joins; SIGKILL the leader: the lease must expire before the third takes over
    cars["c"] = sidecars(str(cp.kubeconfig), "c", LEASE)
    cars["c"].wait(lambda: cars["c"].get("/readyz")[0] == 200, "third replica ready")
    cars[standby].proc.kill()
    t = time.monotonic()
    cars["c"].wait(lambda: leaders() == {"c"}, "takeover after SIGKILL", timeout=15)
    assert time.monotonic() - t < 3.0 + 0.5 + 2.0  # lease duration + retry period + slack
    assert all(len(s) <= 1 for s in samples), "two replicas ran controllers at the same time"
    lease = kubernetes.client.CoordinationV1Api(kube_client(cp)).read_namespaced_lease("kube-syncer", "default")
    assert lease.spec.holder_identity == "c"


def test_unreachable_apiserver_is_retried_while_not_ready(tmp_path, control_plane, sidecars) -> None:
    config = json.loads(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(json.dumps(config))
    car = sidecars(str(dead))
    car.wait(lambda: car.log.count("not reachable") >= 2, "two logged connection attempts", timeout=20)
    assert "(attempt 1:" in car.log and "(attempt 2:" in car.log
    assert car.get("/readyz")[0] == 503
    assert config["users"][0]["user"]["token"] not in car.log  # credentials never logged
    car.proc.send_signal(signal.SIGTERM)
    assert car.proc.wait(15) == 0


def test_configmap_mirror_example_plugin(control_plane_factory, sidecars) -> None:
    cp = control_plane_factory()
    core = kubernetes.client.CoreV1Api(kube_client(cp))
    car = sidecars(str(cp.kubeconfig), plugins=("examples.plugins.configmap_mirror",),
                   extra='[plugin_settings.configmap_mirror]\ntarget_namespace = "mirror"\n')
    car.wait(lambda: car.controller_state("configmap-mirror") == "running", "mirror controller")
    core.create_namespaced_config_map("default", {"metadata": {"name": "app", "labels": {
        "kube-syncer.io/mirror": "true"}}, "data": {"k": "v"}})

    def mirror():
        try:
            return core.read_namespaced_config_map("default.app", "mirror")
        except kubernetes.client.ApiException:
            return None

    car.wait(lambda: mirror() is not None and mirror().data == {"k": "v"}, "the mirror")
    core.patch_namespaced_config_map("app", "default", {"data": {"k": "v2"}})
    car.wait(lambda: mirror() is not None and mirror().data == {"k": "v2"}, "the mirror update")
    assert mirror().metadata.annotations == {"kube-syncer.io/mirrored-from": "default/app"}
    core.delete_namespaced_config_map("default.app", "mirror")  # deleted by hand: put back
    car.wait(lambda: mirror() is not None and mirror().data == {"k": "v2"}, "the mirror put back")
    core.patch_namespaced_config_map("app", "default", {"metadata": {"labels": {"kube-syncer.io/mirror": None}}})
    car.wait(lambda: mirror() is None, "the mirror removal")


def test_crd_lifecycle_example_script(control_plane_factory) -> None:
    cp = control_plane_factory()
    proc = subprocess.run([sys.executable, "examples/crd_lifecycle.py", "--kubeconfig", str(cp.kubeconfig)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("controller 'widgets' is running", "reconcile default/demo", "controller 'widgets' is waiting",
                 "done"):
        assert line in proc.stdout


def test_namespace_views_example_plugin(control_plane_factory, member_plane, sidecars) -> None:
    """A UnionController hosted by the sidecar: views of a namespace here and of one in another cluster."""
    cp = control_plane_factory()
    api = kube_client(cp)
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(
        json.loads((ROOT / "examples" / "crds" / "namespaceview.json").read_text()))
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    views = ("examples.kube-syncer.io", "v1", "default", "namespaceviews")
    for ns, names in (("team-a", ("a1", "a2")), ("team-b", ())):
        core.create_namespace({"metadata": {"name": ns}})
        for name in names:
            core.create_namespaced_config_map(ns, {"metadata": {"name": name}})
    member = kubernetes.client.CoreV1Api(kube_client(member_plane))
    remote_ns = f"views-{uuid.uuid4().hex[:8]}"
    member.create_namespace({"metadata": {"name": remote_ns}})
    member.create_namespaced_config_map(remote_ns, {"metadata": {"name": "m1"}})
    car = sidecars(str(cp.kubeconfig), plugins=("examples.plugins.namespace_views",))
    car.wait(lambda: car.controller_state("namespace-views") == "running", "the union controller")

    def status(name):
        return (custom.get_namespaced_custom_object(*views, name).get("status") or {})

    def view(name, spec):
        custom.create_namespaced_custom_object(*views, {
            "apiVersion": "examples.kube-syncer.io/v1", "kind": "NamespaceView", "metadata": {"name": name},
            "spec": spec})

    view("here", {"namespace": "team-a"})
    car.wait(lambda: status("here") == {"ready": True, "configMaps": 2}, "the local view's count")
    core.create_namespaced_config_map("team-a", {"metadata": {"name": "a3"}})
    car.wait(lambda: status("here") == {"ready": True, "configMaps": 3}, "a ConfigMap added")
    view("there", {"namespace": remote_ns, "kubeconfigSecret": "east"})
    car.wait(lambda: status("there") == {"ready": False}, "not yet: no Secret")
    core.create_namespaced_secret("default", {"metadata": {"name": "east"}, "data": {
        "kubeconfig": base64.b64encode(member_plane.member_kubeconfig()).decode()}})
    car.wait(lambda: status("there") == {"ready": True, "configMaps": 1}, "the other cluster's view", timeout=60)
    custom.patch_namespaced_custom_object(*views, "here", {"spec": {"namespace": "team-b"}})
    car.wait(lambda: status("here") == {"ready": True, "configMaps": 0}, "the view moved to team-b")
    custom.delete_namespaced_custom_object(*views, "there")
    car.wait(lambda: "record default/there is gone" in car.log, "the remote view's informer gone")
    member.delete_namespace(remote_ns)
    car.proc.send_signal(signal.SIGTERM)
    assert car.proc.wait(15) == 0
