"""The deployment assets in deploy/: the kustomize base (deploy/base) validated by the real apiserver (server-side
dry run), its RBAC checked by impersonating the service account, static checks of probes, settings and the
Dockerfiles, and the example plugin package (deploy/plugin-example) found through its entry point by `syncer
check-config`. Each overlay of deploy/overlays/ (single, multi-cluster, sharding, webhooks) is rendered and
dry-run, its settings variables checked against its mode file's header, and each mode file exercised by a `syncer
run` sidecar under a token of the service account, with only the shipped RBAC."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from informers.resource_filter import Rule
from syncer.plugins import load_plugins
from syncer.settings import load_settings
from syncer.testing.controlplane import ControlPlane
from tests.helpers import free_port
from tests.sidecar import Sidecar
from tests.tls import CA

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "base"
OVERLAYS = DEPLOY / "overlays"
PLUGIN = DEPLOY / "plugin-example"
NAMESPACE = "kube-syncer"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:kube-syncer"
SETTINGS_PATH = "/etc/kube-syncer/settings.toml"

EXPECTED_KINDS = {
    "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
    "Deployment",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}


def _manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.iterdir() if p.suffix in (".yaml", ".yml") and p.stem != "kustomization")


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in _manifest_files():
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _one(kind: str) -> dict[str, Any]:
    found = [d for d in _documents() if d["kind"] == kind]
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def _syncer_container(deployment: dict[str, Any]) -> dict[str, Any]:
    pod = deployment["spec"]["template"]["spec"]
    found: list[dict[str, Any]] = [c for c in pod.get("initContainers", []) + pod["containers"]
                                   if c["name"] == "syncer"]
    assert len(found) == 1
    return found[0]


def _settings_text() -> str:
    return str(_one("ConfigMap")["data"]["settings.toml"])


def _settings() -> dict[str, Any]:
    return tomllib.loads(_settings_text())


# -- kubectl against the real control plane ---------------------------------------------------------------
class Kubectl:
    def __init__(self, cp: ControlPlane) -> None:
        self.base = [str(cp.assets.kubectl), "--kubeconfig", str(cp.kubeconfig)]

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], input=stdin, capture_output=True, text=True, timeout=60)

    def ok(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        out = self.run(*args, stdin=stdin)
        assert out.returncode == 0, f"kubectl {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
        return out

    def allowed(self, verb: str, resource: str, namespace: str = "", subresource: str = "") -> bool:
        """Ask the authorizer (SubjectAccessReview) whether the service account may do this. ``resource`` is
        ``plural`` or ``plural.group``; a leading ``/`` makes it a non-resource URL."""
        spec: dict[str, Any] = {"user": SERVICE_ACCOUNT,
                                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                           "system:authenticated"]}
        if resource.startswith("/"):
            spec["nonResourceAttributes"] = {"verb": verb, "path": resource}
        else:
            plural, _, group = resource.partition(".")
            spec["resourceAttributes"] = {"verb": verb, "group": group, "resource": plural,
                                          "namespace": namespace, "subresource": subresource}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        out = self.ok("create", "-f", "-", "-o", "jsonpath={.status.allowed}", stdin=json.dumps(review))
        return out.stdout.strip() == "true"


@pytest.fixture
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(control_plane)


@pytest.fixture
def deploy_namespace(kubectl: Kubectl) -> str:
    """The kube-syncer namespace, created for real from its manifest (with its Pod Security labels), because
    the server-side dry run of namespaced objects needs it. Idempotent; it is kept for the session."""
    kubectl.ok("apply", "-f", str(MANIFESTS / "00-namespace.yaml"))
    return NAMESPACE


# -- server-side dry run ----------------------------------------------------------------------------------
def test_manifests_pass_server_side_dry_run(kubectl: Kubectl, deploy_namespace: str) -> None:
    out = kubectl.ok("apply", "--dry-run=server", "-k", str(MANIFESTS), "-o", "name")
    # No deprecation warnings for old apiVersions, no "would violate PodSecurity restricted" warnings.
    assert "Warning" not in out.stderr, out.stderr
    reported = set(out.stdout.split())
    expected = set()
    for doc in _documents():
        group = doc["apiVersion"].rpartition("/")[0]
        resource = doc["kind"].lower() + (f".{group}" if group else "")
        expected.add(f"{resource}/{doc['metadata']['name']}")
    assert reported == expected
    assert {d["kind"] for d in _documents()} == EXPECTED_KINDS
    assert any(r.startswith("deployment.apps/") for r in reported)
    assert any(r.startswith("clusterrole.rbac.authorization.k8s.io/") for r in reported)
    # A dry run persists nothing.
    missing = kubectl.run("get", "deployment/kube-syncer", "-n", deploy_namespace)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_each_manifest_file_passes_server_side_dry_run(kubectl: Kubectl, deploy_namespace: str) -> None:
    for path in _manifest_files():
        out = kubectl.ok("apply", "--dry-run=server", "-f", str(path), "-o", "name")
        assert out.stdout.strip(), path
        assert "Warning" not in out.stderr, f"{path.name}: {out.stderr}"


def test_dry_run_is_not_vacuous(kubectl: Kubectl, deploy_namespace: str) -> None:
    """Controls for the checks above: the apiserver rejects a misspelt field and warns about a pod that
    breaks the namespace's restricted Pod Security level."""
    deployment = _one("Deployment")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    typo["spec"]["template"]["spec"]["initContainers"][0]["restartPolcy"] = "Always"
    out = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(typo))
    assert out.returncode != 0 and "restartPolcy" in out.stderr, out.stderr

    privileged = yaml.safe_load(yaml.safe_dump(deployment))
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    out = kubectl.ok("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(privileged))
    assert "PodSecurity" in out.stderr and "allowPrivilegeEscalation" in out.stderr, out.stderr


# -- RBAC, as the service account -------------------------------------------------------------------------
@pytest.fixture
def applied_rbac(kubectl: Kubectl, deploy_namespace: str) -> Iterator[None]:
    files = [str(MANIFESTS / f) for f in
             ("20-clusterrole.yaml", "21-clusterrolebinding.yaml", "30-role.yaml", "31-rolebinding.yaml")]
    args = [a for f in files for a in ("-f", f)]
    kubectl.ok("apply", *args)
    try:
        yield
    finally:
        kubectl.run("delete", "--ignore-not-found", "--wait=false", *args)


def test_service_account_gets_exactly_the_needed_permissions(kubectl: Kubectl, applied_rbac: None) -> None:
    allowed = [
        ("get", "/apis"), ("get", "/api/v1"), ("get", "/version"),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
        ("list", "apiservices.apiregistration.k8s.io"),
        ("create", "selfsubjectaccessreviews.authorization.k8s.io"),
        ("list", "configmaps"), ("watch", "configmaps", "default"),
        ("create", "configmaps", "default"), ("patch", "configmaps", "default"), ("delete", "configmaps", "default"),
        ("watch", "namespaces"), ("create", "namespaces"),
        ("list", "widgets.examples.kube-syncer.io"), ("watch", "widgets.examples.kube-syncer.io", "default"),
        ("patch", "widgets.examples.kube-syncer.io", "default", "status"),
        ("update", "widgets.examples.kube-syncer.io", "default", "status"),
        ("patch", "widgets.examples.kube-syncer.io", "default"),  # its finalizer
        ("update", "widgets.examples.kube-syncer.io", "default", "finalizers"),
        ("create", "events.events.k8s.io", "default"), ("patch", "events.events.k8s.io", "default"),
        ("get", "leases.coordination.k8s.io", NAMESPACE),
        ("create", "leases.coordination.k8s.io", NAMESPACE),
        ("update", "leases.coordination.k8s.io", NAMESPACE),
    ]
    denied = [
        ("list", "secrets"), ("list", "pods", NAMESPACE), ("get", "/metrics"),
        ("delete", "namespaces"), ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("deletecollection", "configmaps", "default"),
        ("update", "widgets.examples.kube-syncer.io", "default"),
        ("delete", "widgets.examples.kube-syncer.io", "default"),
        ("get", "leases.coordination.k8s.io", "default"),
        ("update", "leases.coordination.k8s.io", "default"),
        ("delete", "leases.coordination.k8s.io", NAMESPACE),
        ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ]
    deadline = time.monotonic() + 15  # new grants reach the RBAC authorizer's cache asynchronously
    while True:
        missing = [check for check in allowed if not kubectl.allowed(*check)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert missing == []
    assert [check for check in denied if kubectl.allowed(*check)] == []


# -- static checks ----------------------------------------------------------------------------------------
def test_all_namespaced_objects_live_in_the_kube_syncer_namespace() -> None:
    for doc in _documents():
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], doc["kind"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]


def test_cluster_role_has_no_wildcards() -> None:
    for rule in _one("ClusterRole")["rules"]:
        for key in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(key, []), rule
        assert all(not url.endswith("*") or url in ("/api/*", "/apis/*") for url in rule.get("nonResourceURLs", []))
    # Leases are granted in the namespace only, never cluster-wide.
    assert not any("leases" in r.get("resources", []) for r in _one("ClusterRole")["rules"])
    role = _one("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]


def test_bindings_point_at_the_roles_and_the_service_account() -> None:
    sa = _one("ServiceAccount")["metadata"]
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = _one(kind)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                      "name": _one(role_kind)["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    pod = _one("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["name"]


def test_deployment_runs_the_syncer_as_a_hardened_sidecar() -> None:
    deployment = _one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    syncer = _syncer_container(deployment)
    # A native sidecar next to a placeholder application container.
    assert syncer in pod["initContainers"] and syncer["restartPolicy"] == "Always"
    assert [c["image"] for c in pod["containers"]] == ["registry.k8s.io/pause:3.10"]
    assert syncer["image"] == "kube-syncer:latest" and syncer["imagePullPolicy"] == "IfNotPresent"

    probes = {name: syncer[name]["httpGet"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"] == {"path": "/healthz", "port": 8080}
    assert probes["readinessProbe"] == {"path": "/readyz", "port": 8080}
    assert probes["startupProbe"]["port"] == 8080
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in syncer["ports"]

    env = {e["name"]: e for e in syncer["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}

    mounts = {m["mountPath"]: m["name"] for m in syncer["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    settings_dir = SETTINGS_PATH.rpartition("/")[0]
    assert volumes[mounts[settings_dir]]["configMap"]["name"] == _one("ConfigMap")["metadata"]["name"]
    assert syncer["args"] == ["run", "--settings", SETTINGS_PATH]
    # The token is mounted into the syncer only, at the path in-cluster clients read.
    assert pod["automountServiceAccountToken"] is False
    assert "kube-api-access" == mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
    assert all("volumeMounts" not in c for c in pod["containers"])

    for container in (syncer, *pod["containers"]):
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True, container["name"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert "memory" in container["resources"]["limits"], container["name"]
    assert syncer["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}


def test_settings_toml_matches_the_deployment(tmp_path) -> None:
    settings = _settings()
    (tmp_path / "settings.toml").write_text(_one("ConfigMap")["data"]["settings.toml"])
    checked = load_settings(str(tmp_path / "settings.toml"))  # the syncer's own validation accepts it
    assert load_plugins(checked.plugins, checked.plugin_settings, entry_points=False).controllers.keys() == {
        "configmap-mirror", "widget-status"}
    assert settings["in_cluster"] is True
    assert settings["plugins"] == ["examples.plugins.configmap_mirror", "examples.plugins.widget_status"]
    assert settings["http_bind"] == "0.0.0.0:8080" and settings["log_format"] == "json"
    election = settings["leader_election"]
    assert election["enabled"] is True and election["lease_namespace"] == NAMESPACE
    for rule in settings["include"] + settings["exclude"]:
        Rule.parse(rule)  # the syncer's own parser accepts every rule
    # shutdown_timeout fits in the pod's grace period.
    grace = _one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert int(re.fullmatch(r"(\d+)s", settings["shutdown_timeout"]).group(1)) < grace  # type: ignore[union-attr]


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert stages and all(s.startswith("python:3.11-slim") for s in stages)
    runtime = text.rsplit("\nFROM ", 1)[1]
    assert re.search(r"^USER\s+10001(:10001)?\s*$", runtime, re.M)  # numeric, so runAsNonRoot can verify it
    assert 'ENTRYPOINT ["syncer"]' in runtime
    assert f'CMD ["run", "--settings", "{SETTINGS_PATH}"]' in runtime
    assert re.search(r"^EXPOSE\s+8080\s*$", runtime, re.M) and re.search(r"^EXPOSE\s+9443\s*$", runtime, re.M)
    assert re.search(r"^COPY\b.*\bexamples\b", runtime, re.M) and "PYTHONPATH=/app" in runtime
    # Every top-level package the image builds exists in the repo.
    for package in ("informers", "controllers", "syncer"):
        assert f"COPY {package} " in text and (ROOT / package / "__init__.py").exists()


# -- shipping your own plugin: deploy/plugin-example ------------------------------------------------------
def _plugin_settings() -> str:
    [doc] = [d for d in yaml.safe_load_all((PLUGIN / "settings-configmap.yaml").read_text()) if d]
    assert doc["kind"] == "ConfigMap" and doc["metadata"] == _one("ConfigMap")["metadata"]  # replaces it
    return str(doc["data"]["settings.toml"])


def test_plugin_settings_configmap_passes_server_side_dry_run(kubectl: Kubectl, deploy_namespace: str) -> None:
    out = kubectl.ok("apply", "--dry-run=server", "-f", str(PLUGIN / "settings-configmap.yaml"), "-o", "name")
    assert out.stdout.strip() == "configmap/kube-syncer-settings" and "Warning" not in out.stderr


def test_plugin_dockerfile_derives_from_the_image() -> None:
    text = (PLUGIN / "Dockerfile").read_text()
    assert re.findall(r"^FROM\s+(\S+)", text, re.M) == ["kube-syncer:latest"]
    assert text.rstrip().splitlines()[-1] == "USER 10001:10001"  # back to the base image's user
    for copied in re.findall(r"^COPY\s+(.+)\s+\S+$", text, re.M):
        assert all((PLUGIN / f).is_file() for f in copied.split()), copied
    assert re.search(r"^RUN pip install .*/tmp/syncer-backup", text, re.M)


def _install(target: Path) -> None:
    """Install deploy/plugin-example into ``target`` as pip would (the module and a dist-info with the entry
    points of pyproject.toml). pip itself cannot build it offline here: the virtualenv has no ``wheel``."""
    pyproject = tomllib.loads((PLUGIN / "pyproject.toml").read_text())
    project = pyproject["project"]
    for module in pyproject["tool"]["setuptools"]["py-modules"]:
        shutil.copy(PLUGIN / f"{module}.py", target)
    info = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items())
        for group, eps in groups.items()))


def test_plugin_package_is_found_by_its_entry_point(tmp_path: Path, control_plane: ControlPlane) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install(site)
    settings = tmp_path / "settings.toml"
    settings.write_text(_plugin_settings())
    # Outside a pod: the control plane's kubeconfig instead of the service account (check-config connects not).
    env = {**os.environ, "PYTHONPATH": str(site), "SYNCER_IN_CLUSTER": "false",
           "SYNCER_KUBECONFIG": str(control_plane.kubeconfig)}
    out = subprocess.run([sys.executable, "-m", "syncer", "check-config", "--settings", str(settings)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "plugins OK: 1 controller(s): backup" in out.stdout
    # include covers the plugin's GVRs (check-config warns "it would wait forever" otherwise), and the
    # [plugin_settings.backup] table matches the entry point's name
    assert "wait forever" not in out.stderr and "matches no loaded plugin" not in out.stderr, out.stderr



# -- every mode: deploy/overlays/, each with a sidecar running under the service account's token -----------------
def _mode_files(overlay: Path) -> list[Path]:
    """The objects an overlay adds to the base (its patches excluded)."""
    resources = yaml.safe_load((overlay / "kustomization.yaml").read_text())["resources"]
    return [overlay / r for r in resources if not r.startswith("..")]


def _mode_file(name: str) -> Path:
    [path] = [p for o in OVERLAYS.iterdir() for p in _mode_files(o) if p.name == name]
    return path


BASE_RBAC = ("10-serviceaccount.yaml", "20-clusterrole.yaml", "21-clusterrolebinding.yaml", "30-role.yaml",
             "31-rolebinding.yaml")


def _deployed_settings(kubeconfig: str, port: int, extra: str, plugins: tuple[str, ...]) -> str:
    """The deployed settings.toml as the sidecar runs it outside a pod: ``kubeconfig`` for credentials, probes on
    127.0.0.1:``port``, ``plugins`` (if any) instead of the examples, and the mode's
    tables (``extra``) added."""
    text = _one("ConfigMap")["data"]["settings.toml"]
    if plugins:
        text = re.sub(r"^plugins = \[.*?\]$", f"plugins = {json.dumps(list(plugins))}", text, flags=re.M | re.S)
    text = text.replace("in_cluster = true", f'in_cluster = false\nkubeconfig = "{kubeconfig}"')
    text = text.replace('"0.0.0.0:8080"', f'"127.0.0.1:{port}"')
    return f"{text}\n{extra}"


@pytest.fixture
def mode(kubectl: Kubectl, deploy_namespace: str, control_plane: ControlPlane,
         tmp_path: Path) -> Iterator[Any]:
    """``mode(file)``: applies the single-cluster RBAC and the mode file ``<file>`` of ``deploy/overlays/`` for real
    and returns the path of a kubeconfig with a token of the kube-syncer service account (TokenRequest, as the
    kubelet gets it for the pod). Everything applied is deleted afterwards."""
    applied: list[str] = []

    def apply(name: str) -> str:
        files = [str(MANIFESTS / f) for f in BASE_RBAC] + [str(_mode_file(name))]
        args = [a for f in files for a in ("-f", f)]
        kubectl.ok("apply", *args)
        applied.extend(args)
        token = kubectl.ok("create", "token", "kube-syncer", "-n", NAMESPACE, "--duration", "1h").stdout.strip()
        path = tmp_path / "service-account.kubeconfig"
        path.write_bytes(control_plane.member_kubeconfig(token=token))
        return str(path)

    yield apply
    if applied:
        kubectl.run("delete", "--ignore-not-found", "--wait=false", *applied)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Any]:
    """``sidecar(kubeconfig, extra, plugins)``: a `syncer run` process with the deployed settings."""
    started: list[Sidecar] = []

    def start(kubeconfig: str, extra: str, plugins: tuple[str, ...] = ()) -> Sidecar:
        car = Sidecar(tmp_path, kubeconfig,
                      settings=lambda port: _deployed_settings(kubeconfig, port, extra, plugins))
        started.append(car)
        return car

    yield start
    for car in started:
        car.stop()


def _stop_gracefully(car: Sidecar) -> None:
    car.proc.send_signal(signal.SIGTERM)
    assert car.proc.wait(timeout=30) == 0, car.log[-3000:]


def test_overlays_pass_server_side_dry_run(kubectl: Kubectl, deploy_namespace: str) -> None:
    """Each overlay (``kubectl apply -k``: the base plus the mode's files and patches); cert-manager's Certificate
    against stand-in CRDs (the test control plane has no cert-manager), so only its kind, group and metadata are
    checked there."""
    stand_ins = [{
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {"group": "cert-manager.io", "scope": "Namespaced",
                 "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
        for plural, kind in (("certificates", "Certificate"), ("issuers", "Issuer"))]
    crds = json.dumps({"apiVersion": "v1", "kind": "List", "items": stand_ins})
    kubectl.ok("apply", "-f", "-", stdin=crds)
    try:
        kubectl.ok("wait", "--for=condition=Established", "crd/certificates.cert-manager.io",
                   "crd/issuers.cert-manager.io", "--timeout=30s")
        for overlay in sorted(OVERLAYS.iterdir()):
            out = kubectl.ok("apply", "--dry-run=server", "-k", str(overlay), "-o", "name")
            assert "Warning" not in out.stderr, f"{overlay.name}: {out.stderr}"
            names = set(out.stdout.split())
            assert "deployment.apps/kube-syncer" in names, overlay.name
            for path in _mode_files(overlay):
                for doc in yaml.safe_load_all(path.read_text()):
                    assert doc["metadata"]["labels"] == {"app.kubernetes.io/name": "kube-syncer"}, path.name
                    assert any(n.endswith(f"/{doc['metadata']['name']}") and n.startswith(doc["kind"].lower())
                               for n in names), (path.name, doc["kind"])
    finally:
        kubectl.run("delete", "--ignore-not-found", "-f", "-", stdin=crds)
    assert {p.name for o in OVERLAYS.iterdir() for p in _mode_files(o)} == {
        "multicluster.yaml", "sharding.yaml", "webhooks.yaml", "webhook-certificate.yaml"}


def _rendered(kubectl: Kubectl, overlay: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kubectl.ok("kustomize", str(overlay)).stdout) if d]


def test_overlays_set_the_settings_their_mode_files_name(kubectl: Kubectl, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``kubectl kustomize`` renders every overlay; the SYNCER_* variables its patch gives the syncer container,
    read over the base's settings.toml, are the settings the header of the mode's file gives (and nothing else
    differs from the base). The certificates' mount point is a local directory here (the setting must exist)."""
    mount, certs = "/var/run/kube-syncer/webhook-certs", tmp_path / "certs"
    certs.mkdir()
    (tmp_path / "settings.toml").write_text(_settings_text())
    base = load_settings(str(tmp_path / "settings.toml"))
    assert {o.name for o in OVERLAYS.iterdir()} == {"single", "multicluster", "sharding", "webhooks"}
    for overlay in sorted(OVERLAYS.iterdir()):
        docs = _rendered(kubectl, overlay)
        [deployment] = [d for d in docs if d["kind"] == "Deployment"]
        env = {e["name"]: e["value"] for e in _syncer_container(deployment)["env"] if e["name"].startswith("SYNCER_")}
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value.replace(mount, str(certs)))
            from_env = load_settings(str(tmp_path / "settings.toml"))
        header = "".join(line[4:] + "\n" for path in _mode_files(overlay)
                         for line in path.read_text().splitlines() if line.startswith("#   "))
        (tmp_path / "header.toml").write_text(f"{_settings_text()}\n{header}".replace(mount, str(certs)))
        from_header = load_settings(str(tmp_path / "header.toml"))
        assert from_env == dataclasses.replace(from_header, source=from_env.source), overlay.name
        assert (from_env == base) == (overlay.name == "single"), overlay.name
    sharding = _rendered(kubectl, OVERLAYS / "sharding")
    assert [d["spec"]["replicas"] for d in sharding if d["kind"] == "Deployment"] == [3]


def test_webhook_service_certificate_and_mount_fit_together() -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    syncer = _syncer_container(_one("Deployment"))
    assert pod["enableServiceLinks"] is False
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in syncer["ports"]
    docs = {d["kind"]: d for f in ("webhooks.yaml", "webhook-certificate.yaml")
            for d in yaml.safe_load_all((_mode_file(f)).read_text())}
    service = docs["Service"]
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 9443, "targetPort": "webhook", "protocol": "TCP"}]
    assert service["spec"]["selector"] == _one("Deployment")["spec"]["selector"]["matchLabels"]
    certificate = docs["Certificate"]["spec"]
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in certificate["dnsNames"]
    [volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == certificate["secretName"]]
    assert volume["secret"]["optional"] is True  # no Secret without webhooks
    [mount] = [m for m in syncer["volumeMounts"] if m["name"] == volume["name"]]
    # The settings the header of webhooks.yaml gives use that mount and the Service's name.
    header = _mode_file("webhooks.yaml").read_text()
    assert f'cert_dir = "{mount["mountPath"]}"' in header
    assert f'url = "https://{service["metadata"]["name"]}.{NAMESPACE}.svc:9443"' in header


def test_multicluster_mode_under_the_service_account(mode: Any, sidecar: Any, kubectl: Kubectl,
                                                     control_plane: ControlPlane) -> None:
    """The member's kubeconfig Secret in the syncer's namespace: listed and watched with the Role of
    multicluster.yaml (the member itself is reached with the credentials of its kubeconfig)."""
    kubeconfig = mode("multicluster.yaml")
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "deploy-member", "namespace": NAMESPACE,
                           "labels": {"kube-syncer.io/kubeconfig": "true"}},
              "stringData": {"kubeconfig": control_plane.member_kubeconfig().decode()}}
    kubectl.ok("apply", "-f", "-", stdin=json.dumps(secret))
    try:
        car = sidecar(kubeconfig, f'[clusters]\nenabled = true\nnamespaces = ["{NAMESPACE}"]\n')

        def member() -> dict[str, Any]:
            found = [c for c in (car.status().get("clusters") or {}).get("clusters", [])
                     if c["name"] == "deploy-member"]
            return found[0] if found else {}

        car.wait(lambda: member().get("ready") is True, "the member cluster to be ready", timeout=45)
        assert "forbidden" not in car.log.lower(), car.log[-3000:]
        _stop_gracefully(car)
    finally:
        kubectl.run("delete", "--ignore-not-found", "secret/deploy-member", "-n", NAMESPACE)


def test_sharding_mode_under_the_service_account(mode: Any, sidecar: Any, kubectl: Kubectl) -> None:
    """Member and unit Leases in kube-syncer: watched (list, watch), taken, and the member Lease deleted on a
    graceful stop, with the Role of sharding.yaml."""
    kubeconfig = mode("sharding.yaml")
    group = "deploy-test"
    car = sidecar(kubeconfig, f'[sharding]\nenabled = true\ngroup = "{group}"\nlease_namespace = "{NAMESPACE}"\n'
                              'lease_duration = "6s"\nrenew_deadline = "4s"\nretry_period = "1s"\nmin_hold = "0s"\n')

    def leases() -> list[str]:
        out = kubectl.ok("get", "leases", "-n", NAMESPACE, "-o", "name").stdout.split()
        return [n.rpartition("/")[2] for n in out if f"/{group}-" in n]

    def units() -> list[dict[str, Any]]:
        return list((car.status().get("sharding") or {}).get("units", []))

    car.wait(lambda: any(u["state"] == "running" for u in units()), "a unit running here", timeout=45)
    assert any("-member-" in n for n in leases()), leases()
    assert "forbidden" not in car.log.lower(), car.log[-3000:]
    _stop_gracefully(car)
    assert not [n for n in leases() if "-member-" in n], "the member Lease outlives the replica"
    kubectl.run("delete", "--ignore-not-found", "-n", NAMESPACE, *(f"lease/{n}" for n in leases()))


def test_managed_webhooks_mode_under_the_service_account(mode: Any, sidecar: Any, kubectl: Kubectl,
                                                         tmp_path: Path) -> None:
    """The configurations written, called (the probe's dry run in kube-syncer) and deleted on a graceful stop, with
    certificates read from cert_dir as cert-manager's Secret has them, under webhooks.yaml's permissions; and
    the CRD permissions conversion webhooks need."""
    kubeconfig = mode("webhooks.yaml")
    certs = tmp_path / "webhook-certs"
    CA.new().write_secret(certs)
    port = free_port()
    name = "kube-syncer-deploy-test"
    car = sidecar(kubeconfig, f'[webhooks]\nbind = "127.0.0.1:{port}"\ncert_dir = "{certs}"\n'
                              f'manage_configurations = true\nconfiguration_name = "{name}"\n'
                              f'probe_namespace = "{NAMESPACE}"\n', ("examples.plugins.widget_webhook",))
    car.wait(lambda: (car.status().get("webhooks") or {}).get("called_by_api_server") is True,
           "the API server to call the webhooks", timeout=45)
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        kubectl.ok("get", kind, name)
    assert "forbidden" not in car.log.lower(), car.log[-3000:]
    _stop_gracefully(car)
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        assert "NotFound" in kubectl.run("get", kind, name).stderr, f"{kind} {name} outlives the replica"
    crds = "customresourcedefinitions.apiextensions.k8s.io"
    assert all(kubectl.allowed(verb, crds) for verb in ("get", "update", "patch"))
    assert not kubectl.allowed("delete", crds) and not kubectl.allowed("create", crds)


# -- deploy/monitoring: the dashboard's ConfigMap for Grafana's sidecar -------------------------------------------
def test_monitoring_kustomization_passes_server_side_dry_run(kubectl: Kubectl, deploy_namespace: str) -> None:
    """`kubectl apply -k deploy/monitoring`: the dashboard, unchanged, in a ConfigMap Grafana's sidecar loads. (The
    alerts and the dashboard's queries are checked in test_monitoring.py.)"""
    [configmap] = _rendered(kubectl, DEPLOY / "monitoring")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {"kube-syncer.json": (DEPLOY / "monitoring" / "dashboard.json").read_text()}
    out = kubectl.ok("apply", "--dry-run=server", "-k", str(DEPLOY / "monitoring"), "-o", "name")
    assert out.stdout.split() == ["configmap/kube-syncer-dashboard"] and "Warning" not in out.stderr
