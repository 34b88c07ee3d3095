"""Acceptance of the local control plane itself (issue: skeleton and control plane)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request

import kubernetes
import pytest

from syncer.testing.controlplane import ControlPlane
from syncer.testing.pytest_plugin import kube_client

from tests.kube import create_crd, wait_established


def test_admin_crd_and_custom_object_roundtrip(control_plane: ControlPlane, admin_client, namespace: str) -> None:
    group = "roundtrip.example.com"
    create_crd(admin_client, group, "widgets", "Widget")
    wait_established(admin_client, f"widgets.{group}")
    custom = kubernetes.client.CustomObjectsApi(admin_client)
    custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", {
        "apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 3},
    })
    out = subprocess.run(
        [str(control_plane.assets.kubectl), "--kubeconfig", str(control_plane.kubeconfig), "get", f"widgets.{group}",
         "-n", namespace, "-o", "json"], capture_output=True, text=True, check=True,
    ).stdout
    items = json.loads(out)["items"]
    assert [i["metadata"]["name"] for i in items] == ["w1"]
    got = custom.get_namespaced_custom_object(group, "v1", namespace, "widgets", "w1")
    assert got["spec"] == {"size": 3}


def test_restricted_user_gets_403_without_rbac_and_200_with_it(admin_client, restricted_client, namespace) -> None:
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin_client)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    })
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "cm-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"kind": "User", "name": "kube-syncer-restricted", "apiGroup": "rbac.authorization.k8s.io"}],
    })
    core = kubernetes.client.CoreV1Api(restricted_client)
    with pytest.raises(kubernetes.client.ApiException) as err:
        core.list_namespaced_secret(namespace)
    assert err.value.status == 403
    deadline = time.monotonic() + 10  # RBAC grants reach the authorizer's cache asynchronously
    while True:
        try:
            core.list_namespaced_config_map(namespace)
            break
        except kubernetes.client.ApiException as e:
            if e.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_restart_keeps_data_and_compaction_gives_410(control_plane_factory) -> None:
    cp = control_plane_factory(extra_apiserver_flags=["--watch-cache-sizes=configmaps#0"])
    client = kube_client(cp)
    core = kubernetes.client.CoreV1Api(client)
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "keep"}, "data": {"a": "1"}})
    old_rv = created.metadata.resource_version
    cp.restart_apiserver()
    client = kube_client(cp)
    core = kubernetes.client.CoreV1Api(client)
    assert core.read_namespaced_config_map("keep", "default").data == {"a": "1"}
    for i in range(3):
        core.patch_namespaced_config_map("keep", "default", {"data": {"a": str(i)}})
    cp.compact()
    resp = core.list_namespaced_config_map("default", watch=True, resource_version=old_rv,
                                          timeout_seconds=5, _preload_content=False)
    first = json.loads(resp.readline())
    resp.release_conn()
    assert first["type"] == "ERROR" and first["object"]["code"] == 410, first


def test_two_control_planes_are_independent(control_plane_factory) -> None:
    a, b = control_plane_factory(), control_plane_factory()
    assert a.url != b.url
    core_a = kubernetes.client.CoreV1Api(kube_client(a))
    core_b = kubernetes.client.CoreV1Api(kube_client(b))
    core_a.create_namespace({"metadata": {"name": "only-in-a"}})
    names_b = {n.metadata.name for n in core_b.list_namespace().items}
    assert "only-in-a" not in names_b
    assert "only-in-a" in {n.metadata.name for n in core_a.list_namespace().items}


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_dead(pids: list[int], timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_processes_die_with_a_killed_parent_whose_directory_the_next_control_plane_removes() -> None:
    script = (
        "import sys\n"
        "from syncer.testing import ControlPlane\n"
        "cp = ControlPlane().start()\n"
        "print(cp.dir, *cp.pids, flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        directory, *pids = proc.stdout.readline().split()
        pids = [int(p) for p in pids]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait()
        assert _wait_dead(pids) == []
        assert os.path.isdir(directory)  # the killed parent's atexit hook never ran
        ControlPlane().stop()
        assert not os.path.exists(directory)
    finally:
        proc.kill()


def _readyz(cp: ControlPlane) -> bool:
    req = urllib.request.Request(f"{cp.url}/readyz", headers={"Authorization": f"Bearer {cp.admin_token}"})
    try:
        with urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=str(cp.ca_file))) as r:
            return r.status == 200
    except OSError:
        return False


def test_an_apiserver_restarted_from_a_short_lived_thread_outlives_it(control_plane_factory) -> None:
    cp = control_plane_factory()
    thread = threading.Thread(target=cp.restart_apiserver)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    # The kernel sends PR_SET_PDEATHSIG when the OS thread is gone, a little after join() returns.
    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + 10
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(task)
    # Nothing to wait for when it works: watch it stay up for a while after its death signal would have come.
    until = time.monotonic() + 3
    while time.monotonic() < until:
        assert len(cp.pids) == 2 and _readyz(cp), cp.log_tail()
        time.sleep(0.2)


def _open_watches(cp: ControlPlane, n: int) -> list[http.client.HTTPResponse]:
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    req = urllib.request.Request(f"{cp.url}/api/v1/configmaps?watch=1&timeoutSeconds=600",
                                 headers={"Authorization": f"Bearer {cp.admin_token}"})
    return [urllib.request.urlopen(req, timeout=30, context=ctx) for _ in range(n)]


def _ending(watch: http.client.HTTPResponse) -> str:
    """How a watch stream ended once the apiserver is gone: closed by the server, or cut off."""
    try:
        watch.read()
        return "closed"
    except (http.client.IncompleteRead, OSError):
        return "cut"
    finally:
        watch.close()


def test_stop_ends_open_watches_at_once_unless_graceful(control_plane_factory) -> None:
    cp = control_plane_factory()
    watches = _open_watches(cp, 3)
    assert cp.stop_apiserver() == 0  # it exited by itself, not SIGKILLed after 10 s
    assert [_ending(w) for w in watches] == ["closed"] * 3

    cp.graceful_shutdown = True
    cp.start_apiserver()
    watches = _open_watches(cp, 3)
    assert cp.stop_apiserver(timeout=3) == -signal.SIGKILL  # the open watches held its shutdown
    assert [_ending(w) for w in watches] == ["cut"] * 3


def test_main_job_command_runs_until_ctrl_c_and_cleans_up() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "syncer", "controlplane"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("local control plane ready at https://127.0.0.1:"), lines
        kubeconfig = lines[1].split("kubeconfig:")[1].split()[0]
        assert os.path.exists(kubeconfig)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert _wait_dead([int(c) for c in children]) == []
        assert not os.path.exists(kubeconfig)
    finally:
        proc.kill()
