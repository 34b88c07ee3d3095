"""CRD conversion webhooks through a real kube-apiserver: ``syncer run`` with the example plugin
(``examples/plugins/archive_conversion.py``) points the Archive CRD's ``spec.conversion`` at itself, objects
written as v2 are stored as v1 and read back in either version, a converter that raises is the client's clear
error, and the CRD's conversion goes back to ``None`` when the sidecar stops.

One private control plane serves this module (the sidecar's admission probes and the CRD's conversion would
otherwise reach into other tests).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import kubernetes
import pytest

from informers import ApiClient
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from syncer.webhook import Conversion
from syncer.webhook.configuration import ConfigurationError
from syncer.webhook.conversion_configuration import ManagedConversions

from tests.helpers import free_port
from tests.sidecar import readyz, sidecar, status_of
from tests.tls import CA, pem

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE_CRD = json.loads((ROOT / "examples" / "crds" / "archive.json").read_text())
GROUP, CRD = "examples.kube-syncer.io", "archives.examples.kube-syncer.io"


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    plane = ControlPlane(name="kube-syncer-conversions").start()
    try:
        yield plane
    finally:
        plane.stop()


def wait(check: Callable[[], Any], what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> Any:
    """``check()``'s first truthy result, polled until ``timeout``; fails with the sidecar's log."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert proc.poll() is None, f"the sidecar exited ({proc.returncode}) waiting for {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    return result


def archive(name: str, version: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{version}", "kind": "Archive", "metadata": {"name": name}, "spec": spec}


def test_objects_convert_between_versions_through_the_sidecar(cp: ControlPlane, tmp_path: Path) -> None:
    api = kube_client(cp)
    ext = kubernetes.client.ApiextensionsV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    port, webhook_port = free_port(), free_port()
    settings = tmp_path / "s.toml"
    settings.write_text(f'kubeconfig = "{cp.kubeconfig}"\nplugins = ["examples.plugins.archive_conversion"]\n'
                        f'include = ["core/configmaps"]\nhttp_bind = "127.0.0.1:{port}"\n'
                        f'[webhooks]\nbind = "127.0.0.1:{webhook_port}"\nconfiguration_name = "conversions"\n')
    log = tmp_path / "sidecar.log"

    def get(name: str, version: str) -> dict[str, Any]:
        return custom.get_namespaced_custom_object(GROUP, version, "default", "archives", name)

    with sidecar(settings, log) as proc:
        wait(lambda: readyz(port) == 200, "readiness", proc, log, timeout=60)
        assert status_of(port)["webhooks"]["conversions"][0]["configuration"] == "CRD not installed"
        # The CRD installed after the sidecar started, as the README's walk-through does.
        installed = time.monotonic()
        ext.create_custom_resource_definition(ARCHIVE_CRD)
        wait(lambda: ext.read_custom_resource_definition(CRD).spec.conversion.strategy == "Webhook",
             "the CRD's conversion to be configured", proc, log)
        configured = time.monotonic() - installed
        # Stored as v1, the storage version: no conversion needed.
        for attempt in range(100):  # the new resource's REST handler can lag its Established condition briefly
            try:
                custom.create_namespaced_custom_object(GROUP, "v1", "default", "archives",
                                                       archive("seed", "v1", {"retentionDays": 3}))
                break
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    raise
                time.sleep(0.1)
        conversion = ext.read_custom_resource_definition(CRD).spec.conversion
        assert conversion.strategy == "Webhook"
        assert conversion.webhook.client_config.url == f"https://127.0.0.1:{webhook_port}/convert/{CRD}"
        assert conversion.webhook.conversion_review_versions == ["v1"]
        # The API server loads the CRD's new conversion asynchronously: v2 reads of the seed say so once it does.
        seed = wait(lambda: get("seed", "v2")["spec"].get("retention"), "the API server to use the webhook",
                    proc, log)
        assert seed == "3d" and get("seed", "v2")["apiVersion"] == f"{GROUP}/v2"
        print(f"CRD configured {configured:.1f}s after it was installed; converting "
              f"{time.monotonic() - installed:.1f}s after")

        # Written as v2, stored as v1, read as v1 and back as v2.
        custom.create_namespaced_custom_object(GROUP, "v2", "default", "archives", archive("a", "v2",
                                                                                       {"retention": "30d"}))
        assert get("a", "v1")["spec"] == {"retentionDays": 30}
        assert get("a", "v2")["spec"] == {"retention": "30d"}
        custom.patch_namespaced_custom_object(GROUP, "v1", "default", "archives", "a", {"spec": {"retentionDays": 14}})
        assert get("a", "v2")["spec"] == {"retention": "14d"}
        listed = custom.list_namespaced_custom_object(GROUP, "v2", "default", "archives")["items"]
        assert sorted((o["metadata"]["name"], o["spec"]["retention"]) for o in listed) == [("a", "14d"), ("seed", "3d")]

        # A converter that raises: the client reads why, and which object.
        with pytest.raises(kubernetes.client.ApiException) as failed:
            custom.create_namespaced_custom_object(GROUP, "v2", "default", "archives",
                                                   archive("bad", "v2", {"retention": "forever"}))
        message = json.loads(failed.value.body)["message"]
        assert (f"{CRD} default/bad: the converter from v2 to v1 raised ValueError: spec.retention must be a number "
                "of days like '7d', got 'forever' (request uid ") in message, message
        assert "conversion webhook for examples.kube-syncer.io/v2, Kind=Archive failed" in message, message
        assert "the converter from v2 to v1 raised ValueError" in log.read_text()

        [row] = status_of(port)["webhooks"]["conversions"]
        assert (row["crd"], row["strategy"], row["versions"], row["configuration"]) == (
            CRD, "hub v1", ["v1", "v2"], "managed")
        assert row["converted"] >= 4 and row["errors"] >= 1 and row["requests"] == row["converted"] + row["errors"]
        shown = subprocess.run([sys.executable, "-m", "syncer", "status", "--url", f"http://127.0.0.1:{port}/status"],
                               cwd=ROOT, capture_output=True, text=True)
        [line] = [ln.split() for ln in shown.stdout.splitlines() if ln.startswith(CRD)]
        assert line[:6] == [CRD, "conversion", str(row["requests"]), str(row["converted"]), "-",
                            str(row["errors"])], shown.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    assert f"removed the conversion webhook of CRD {CRD}" in log.read_text()
    crd = ext.read_custom_resource_definition(CRD)
    assert crd.spec.conversion.strategy == "None" and "kube-syncer.io/conversion-written-by" not in (
        crd.metadata.annotations or {})


def test_check_config_shows_the_conversions(tmp_path: Path) -> None:
    settings = tmp_path / "s.toml"
    settings.write_text('plugins = ["examples.plugins.archive_conversion"]\ninclude = ["core/configmaps"]\n')
    shown = subprocess.run([sys.executable, "-m", "syncer", "check-config", "--local", "--settings", str(settings)],
                           cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert f"  1 CRD conversion(s): /convert/{CRD} (hub v1: v1, v2)" in shown.stdout, shown.stdout


async def test_a_conversion_configured_by_someone_else_is_left_alone(cp: ControlPlane) -> None:
    other = {**ARCHIVE_CRD, "metadata": {"name": "others.examples.kube-syncer.io"},
             "spec": {**ARCHIVE_CRD["spec"], "names": {"kind": "Other", "plural": "others"}, "conversion": {
                 "strategy": "Webhook", "webhook": {"clientConfig": {"url": "https://converter.example.com/convert"},
                                                    "conversionReviewVersions": ["v1"]}}}}
    kubernetes.client.ApiextensionsV1Api(kube_client(cp)).create_custom_resource_definition(other)
    declared = [Conversion("others.examples.kube-syncer.io", pairs={("v1", "v2"): dict, ("v2", "v1"): dict}),
                Conversion("absents.examples.kube-syncer.io", pairs={("v1", "v2"): dict})]
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as client:
        managed = ManagedConversions(client, "me", "https://127.0.0.1:1", declared[1:])
        assert await managed.apply(pem(CA.new().cert)) == [] and managed.status(declared[1]) == "CRD not installed"
        managed = ManagedConversions(client, "me", "https://127.0.0.1:1", declared)
        with pytest.raises(ConfigurationError, match=r"^CRD others.examples.kube-syncer.io: its spec.conversion "
                                                     r"\(Webhook\) was not configured by kube-syncer, so it is left "
                                                     r"alone; remove it from the CRD, or set"):
            await managed.apply(b"CA")
        assert await managed.remove() == []
    ext = kubernetes.client.ApiextensionsV1Api(kube_client(cp))
    crd = ext.read_custom_resource_definition(other["metadata"]["name"])
    assert crd.spec.conversion.webhook.client_config.url == "https://converter.example.com/convert"


async def test_the_crds_conversion_is_written_when_it_changes_and_taken_back_by_its_last_writer(
        cp: ControlPlane) -> None:
    name = "mines.examples.kube-syncer.io"
    ext = kubernetes.client.ApiextensionsV1Api(kube_client(cp))
    names = {"kind": "Mine", "plural": "mines"}
    ext.create_custom_resource_definition({**ARCHIVE_CRD, "metadata": {"name": name},
                                           "spec": {**ARCHIVE_CRD["spec"], "names": names}})
    declared = [Conversion(name, hub="v1", spokes={"v2": (dict, dict)})]
    configured = [f"configured the conversion webhook of CRD {name}"]
    ca1, ca2 = pem(CA.new("one").cert), pem(CA.new("two").cert)
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as client:
        mine = ManagedConversions(client, "me", "https://127.0.0.1:1", declared)
        theirs = ManagedConversions(client, "them", "https://127.0.0.1:2", declared)
        assert await mine.apply(ca1) == configured and await mine.apply(ca1) == []
        assert await mine.apply(ca2) == configured  # a new CA bundle
        webhook = ext.read_custom_resource_definition(name).spec.conversion.webhook
        assert (webhook.client_config.url, webhook.client_config.ca_bundle) == (
            f"https://127.0.0.1:1/convert/{name}", base64.b64encode(ca2).decode())
        assert await theirs.apply(ca2) == configured  # another replica's URL: theirs now
        assert await mine.remove() == [] and ext.read_custom_resource_definition(name).spec.conversion.strategy == \
            "Webhook"
        assert await theirs.remove() == [f"the conversion webhook of CRD {name}"]
    assert ext.read_custom_resource_definition(name).spec.conversion.strategy == "None"
