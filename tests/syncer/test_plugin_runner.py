"""syncer.testing for plugin authors: run_plugin, the api_client fixture and admission_request.

- run_plugin runs a plugin's controllers in the test's own event loop and its webhooks through the API server
  (managed configurations, withdrawn at the end), says what a controller still waits for, and raises what stopped
  the sidecar; its settings are checked, mistakes named as run_plugin's.
- admission_request builds what the API server sends: compared field by field with a request the API server sent.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from informers import GVR, ApiClient, Invalid, NotFound, ResourceClient
from syncer.runtime import StartupError
from syncer.settings import SettingsError
from syncer.testing import ControlPlane, admission_request, eventually, run_plugin
from syncer.testing.plugin_runner import runner_settings
from syncer.webhook import AdmissionRequest

CONFIGMAPS = GVR("", "v1", "configmaps")
CONFIGURATIONS = GVR("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")

# A controller counting its reconciles, and a validating webhook on ConfigMaps that records what it is asked and
# denies data.deny=yes.
RECORDING_PLUGIN = '''
from controllers import Controller, ManagedController
from informers import GVR
from syncer.webhook import AdmissionRule, Allow, Deny, ValidatingWebhook

CONFIGMAPS = GVR("", "v1", "configmaps")
seen = []
loops = []


def syncer_controllers(settings):
    async def reconcile(req, rc):
        import asyncio
        loops.append(asyncio.get_running_loop())

    return {"counting": ManagedController([CONFIGMAPS], lambda ctx: Controller("counting", reconcile).for_(
        CONFIGMAPS).run)}


def syncer_webhooks(settings):
    async def check(request):
        seen.append(request)
        if ((request.object or {}).get("data") or {}).get("deny") == "yes":
            return Deny("deny=yes", code=422)
        return Allow()

    return [ValidatingWebhook("check.configmaps.example.com", check, [AdmissionRule(
        operations=["CREATE", "UPDATE", "DELETE"], api_groups=[""], api_versions=["v1"], resources=["configmaps"])],
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": settings["namespace"]}})]
'''


def plugin_file(tmp_path: Path, source: str, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def module_of(path: Path) -> Any:
    """The module the plugin loader made of a plugin file (it keeps it in sys.modules)."""
    return sys.modules[f"syncer_plugin_{path.stem}"]


async def test_run_plugin_runs_controllers_in_the_tests_loop_and_webhooks_through_the_api_server(
        tmp_path: Path, control_plane_factory: Callable[..., ControlPlane]) -> None:
    # A private control plane: the webhook configuration would otherwise reach into other tests' namespaces.
    cp = await asyncio.to_thread(control_plane_factory)
    path = plugin_file(tmp_path, RECORDING_PLUGIN, "recording")
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig), "admin") as api:
        await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "checked"}})
        configmaps = ResourceClient(api, CONFIGMAPS)
        configurations = ResourceClient(api, CONFIGURATIONS)
        tasks_before = asyncio.all_tasks()
        async with run_plugin(cp, path, {"plugin_settings": {"recording": {"namespace": "checked"}}}) as running:
            await running.wait_running()
            plugin = module_of(path)
            name = running.settings.webhooks.configuration_name
            assert name != "kube-syncer" and (await configurations.get(name))["metadata"]["labels"] == {
                "app.kubernetes.io/managed-by": "kube-syncer"}
            with pytest.raises(Invalid, match='admission webhook "check.configmaps.example.com" denied the '
                                              'request: deny=yes'):
                await configmaps.create({"metadata": {"name": "no", "namespace": "checked"}, "data": {"deny": "yes"}})
            created = await configmaps.create({"metadata": {"name": "yes", "namespace": "checked"},
                                               "data": {"k": "v"}})
            await eventually(lambda: running.controller("counting")["reconciles"] > 0, what="a reconcile")
            assert set(plugin.loops) == {asyncio.get_running_loop()}  # the test's loop, not one of its own
            [webhook] = [w for w in running.status()["webhooks"]["webhooks"]
                         if w["name"] == "check.configmaps.example.com"]
            assert (webhook["allowed"], webhook["denied"]) >= (1, 1)
            [request] = [r for r in plugin.seen if r.operation == "CREATE" and r.name == "yes"]
        # Stopped: its configuration is gone, and nothing it started is left running.
        with pytest.raises(NotFound):
            await configurations.get(name)
        assert asyncio.all_tasks() <= tasks_before

    # What the builder makes of the object the API server sent is what the API server sent, the user aside.
    built = admission_request("CREATE", CONFIGMAPS, request.object)
    assert_same_request(built, request)
    assert created["metadata"]["name"] == request.object["metadata"]["name"]


def assert_same_request(built: AdmissionRequest, sent: AdmissionRequest) -> None:
    for field in ("review_version", "operation", "resource", "kind", "name", "namespace", "sub_resource", "object",
                  "old_object", "dry_run", "options"):
        assert getattr(built, field) == getattr(sent, field), field
    assert set(built.raw) == set(sent.raw), "the raw request document has the fields the API server sends"
    assert {k: built.raw[k] for k in ("requestKind", "requestResource")} == \
        {k: sent.raw[k] for k in ("requestKind", "requestResource")}


async def test_wait_running_says_what_a_controller_waits_for(tmp_path: Path, control_plane: ControlPlane) -> None:
    path = plugin_file(tmp_path, '''
from controllers import ManagedController
from informers import GVR


def syncer_controllers(settings):
    return {"never": ManagedController([GVR("nowhere.example.com", "v1", "things")], lambda ctx: None)}
''', "waiting")
    async with run_plugin(control_plane, path) as running:
        with pytest.raises(AssertionError, match=r"controller never waiting \(waiting for things.v1.nowhere."
                                                 r"example.com \(not served: no CRD or APIService provides it"):
            await running.wait_running(timeout=3)
        with pytest.raises(KeyError, match="no controller 'other'; the plugins define never"):
            await running.wait_running("other")


async def test_a_sidecar_that_cannot_start_raises_its_error(tmp_path: Path, control_plane: ControlPlane) -> None:
    path = plugin_file(tmp_path, "def syncer_controllers(settings):\n    return {}\n", "empty")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(StartupError, match=f"setting 'http_bind': cannot listen on {bind}"):
            async with run_plugin(control_plane, path, {"http_bind": bind}) as running:
                await running.wait_running()


def test_run_plugin_settings_defaults_and_mistakes(control_plane: ControlPlane) -> None:
    s = runner_settings(control_plane, ["backup.py"], {"include": ["core/configmaps"], "webhooks": {
        "probe_namespace": "probes"}, "plugin_settings": {"backup": {"suffix": "-copy"}}})
    assert (s.kubeconfig, s.context, s.plugins, s.include) == (
        str(control_plane.kubeconfig), "admin", ("backup.py",), ("core/configmaps",))
    assert (s.entry_point_plugins, s.watch, s.webhooks.probe_namespace) == (False, "required", "probes")
    assert s.plugin_settings == {"backup": {"suffix": "-copy"}}
    other = runner_settings(control_plane, ["backup.py"])
    assert s.http_bind != other.http_bind and s.webhooks.bind != other.webhooks.bind
    assert s.webhooks.configuration_name != other.webhooks.configuration_name
    with pytest.raises(SettingsError, match=r"unknown setting 'inclde' in run_plugin's settings \(did you mean "
                                            r"'include'\?\)"):
        runner_settings(control_plane, ["backup.py"], {"inclde": []})
    with pytest.raises(SettingsError, match="setting 'workers' must be an integer from 1 to 1000, got 0; fix it in "
                                            "run_plugin's settings"):
        runner_settings(control_plane, ["backup.py"], {"workers": 0})
    with pytest.raises(ValueError, match="run_plugin's settings cannot set kubeconfig, plugins"):
        runner_settings(control_plane, ["backup.py"], {"plugins": [], "kubeconfig": "x"})


async def test_api_client_fixture_is_ours_as_admin(api_client: ApiClient, api: ApiClient) -> None:
    assert api is api_client
    review = await api_client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert "system:masters" in review["status"]["userInfo"]["groups"]


def test_admission_request_fills_what_the_operation_carries() -> None:
    old = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"}}
    new = {**old, "spec": {"replicas": 2}}
    update = admission_request("UPDATE", "apps/v1/deployments", new, old, dry_run=True)
    assert (update.operation, update.resource, update.kind, update.name, update.namespace) == (
        "UPDATE", GVR("apps", "v1", "deployments"), {"group": "apps", "version": "v1", "kind": "Deployment"}, "web",
        "prod")
    assert (update.object, update.old_object, update.dry_run) == (new, old, True)
    assert update.options == {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}
    delete = admission_request("DELETE", "apps/v1/deployments", old_object=old, review_version="v1beta1")
    assert (delete.object, delete.name, delete.review_version, delete.options["kind"]) == (
        None, "web", "v1beta1", "DeleteOptions")
    scale = admission_request("UPDATE", "apps/v1/deployments", new, old, sub_resource="scale", name="other")
    assert (scale.sub_resource, scale.name, scale.raw["requestSubResource"]) == ("scale", "other", "scale")
    assert admission_request("CREATE", "v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap"}).user_info == {
        "username": "test-user", "groups": ["system:authenticated"]}


@pytest.mark.parametrize("args, kwargs, message", [
    (("PATCH", "v1/configmaps", {}), {}, "operation must be one of CREATE, UPDATE, DELETE, CONNECT, got 'PATCH'"),
    (("UPDATE", "v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap"}), {},
     "UPDATE requests carry object and old_object; old_object not given"),
    (("CREATE", "v1/configmaps"), {}, "CREATE requests carry object; object not given"),
    (("DELETE", "v1/configmaps", {"kind": "ConfigMap"}, {"kind": "ConfigMap"}), {},
     "a DELETE request carries no object"),
    (("CREATE", "v1/configmaps", {"metadata": {"name": "x"}}), {}, "object has no apiVersion and kind"),
    (("CREATE", "a/b/c/d", {"apiVersion": "v1", "kind": "ConfigMap"}), {}, "cannot parse GVR 'a/b/c/d'"),
    (("CREATE", "v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap"}), {"review_version": "v2"},
     "review_version must be one of v1, v1beta1, got 'v2'"),
])
def test_admission_request_mistakes_are_named(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        admission_request(*args, **kwargs)
