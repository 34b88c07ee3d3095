"""deploy/monitoring: every metric and label the PromQL of the Grafana dashboard and of the alerting rules names
is one the sidecar exports on /metrics, read from running `syncer run` sidecars in the modes that export them (one
with a member cluster, leader election, webhooks and a controller that fails; one sharded), plus static checks of
both files. PromQL is read with a small tokenizer (selectors, grouping clauses, series names), not a full parser."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
import yaml

from informers.metrics import FAMILIES
from syncer.sharding.state import HANDOVERS
from syncer.testing.controlplane import ControlPlane
from tests.helpers import free_port
from tests.sidecar import Sidecar
from tests.tls import CA

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
# Added by Prometheus to every series it scrapes (the target's labels), so never on /metrics itself.
TARGET_LABELS = {"job", "instance"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)?\s*\{([^}]*)\}")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_EQUALITY = re.compile(r'([a-zA-Z_]\w*)\s*="((?:[^"\\$]|\\.)*)"')  # label="value", no variable in it
_IDENTIFIER = re.compile(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?")
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s")
_SAMPLE_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')
# Go-template ({{ $labels.x }}) and Grafana legend ({{x}}) references to a result's labels.
_TEMPLATE_LABEL = re.compile(r"\{\{\s*(?:\$labels\.)?([a-zA-Z_]\w*)\s*\}\}")

# Families whose series appear only after a rarer event than a test should stage (a relist, a failed list or
# watch, a shard handover): declared on /metrics (`# TYPE`) with no sample yet, so their labels are taken from where
# they are declared.
_UNSAMPLED_LABELS: dict[str, set[str]] = {
    "informer_relists_total": {"cluster", "gvr", *FAMILIES["informer_relists_total"][2]},
    "informer_errors_total": {"cluster", "gvr", *FAMILIES["informer_errors_total"][2]},
    "syncer_shard_handovers_total": set(HANDOVERS._labelnames),
}


class Query:
    """One PromQL expression: where it is used, the series it names and the labels it uses."""

    def __init__(self, where: str, expr: str, result_labels: Iterable[str] = ()) -> None:
        self.where, self.expr = where, expr
        self.values: dict[str, set[tuple[str, str]]] = {}           # series name -> (label, value) it equals
        for m in _SELECTOR.finditer(re.sub(r"\[[^\]]*\]", "", expr)):
            if m.group(1):
                self.values.setdefault(m.group(1), set()).update(_EQUALITY.findall(m.group(2)))
        text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # label values, $variables inside them
        text = re.sub(r"\[[^\]]*\]", "", text)                     # ranges: [5m], [$__rate_interval]
        self.selectors: dict[str, set[str]] = {}                   # series name -> labels matched on it
        self.grouping: set[str] = set(result_labels)               # by/without/on/...; legends and annotations
        for m in _GROUPING.finditer(text):
            self.grouping |= {label.strip() for label in m.group(1).split(",") if label.strip()}
        text = _GROUPING.sub(" ", text)
        for m in _SELECTOR.finditer(text):
            if m.group(1) and m.group(1) not in _KEYWORDS:
                self.selectors.setdefault(m.group(1), set()).update(_MATCHER_LABEL.findall(m.group(2)))
        text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
        for m in _IDENTIFIER.finditer(text):
            if not m.group(2) and m.group(1) not in _KEYWORDS:     # a name followed by "(" is a function
                self.selectors.setdefault(m.group(1), set())

    def __repr__(self) -> str:
        return f"{self.where}: {self.expr}"


def _alert_queries() -> list[Query]:
    rules = [r for g in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"] for r in g["rules"]]
    return [Query(f"alerts.yaml {r['alert']}", r["expr"],
                  set(_TEMPLATE_LABEL.findall(json.dumps(r.get("annotations", {})))) - {"value"}) for r in rules]


def _dashboard() -> dict[str, Any]:
    return dict(json.loads((MONITORING / "dashboard.json").read_text()))


def _dashboard_queries() -> list[Query]:
    dashboard = _dashboard()
    queries = [Query(f"dashboard.json panel {p['title']!r}", t["expr"], set(_TEMPLATE_LABEL.findall(t["legendFormat"])))
               for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"]["query"])
            assert m, var["name"]
            queries.append(Query(f"dashboard.json variable {var['name']}", m.group(1), {m.group(2)}))
    return queries


def _queries() -> list[Query]:
    return _alert_queries() + _dashboard_queries()


class Exported:
    """What /metrics scrapes show: the labels of each series name, and the families declared (``# TYPE``)."""

    def __init__(self, *scrapes: str) -> None:
        self.labels: dict[str, set[str]] = {}
        self.values: dict[str, set[tuple[str, str]]] = {}
        self.declared: set[str] = set()
        for text in scrapes:
            for line in text.splitlines():
                if line.startswith("# TYPE "):
                    self.declared.add(line.split()[2])
                elif (m := _SAMPLE.match(line)) is not None:
                    pairs = _SAMPLE_LABEL.findall(m.group(2) or "")
                    self.labels.setdefault(m.group(1), set()).update(label for label, _ in pairs)
                    self.values.setdefault(m.group(1), set()).update(pairs)

    def labels_of(self, name: str) -> set[str] | None:
        """The labels ``name``'s series carry, None if it is not exported."""
        if name in self.labels:
            return self.labels[name]
        return _UNSAMPLED_LABELS.get(name) if name in self.declared else None

    def problems(self, queries: list[Query]) -> list[str]:
        found = []
        for q in queries:
            known: set[str] = set(TARGET_LABELS)
            for name, matched in q.selectors.items():
                labels = self.labels_of(name)
                if labels is None:
                    found.append(f"{q!r}\n  metric {name} is not on /metrics")
                    continue
                known |= labels
                if missing := matched - labels - TARGET_LABELS:
                    found.append(f"{q!r}\n  {name} has no label(s) {sorted(missing)} (it has {sorted(labels)})")
                elif name in self.values and (unseen := q.values.get(name, set()) - self.values[name]):
                    found.append(f"{q!r}\n  {name} has no series with {sorted(unseen)}")
            if missing := q.grouping - known:
                found.append(f"{q!r}\n  no metric of it has label(s) {sorted(missing)}")
        return found


# -- the tokenizer itself -----------------------------------------------------------------------------------
def test_query_tokenizer() -> None:
    q = Query("x", 'histogram_quantile(0.99, sum by (le, controller) (rate(a_bucket{job=~"$job", x!="}"}'
                   '[$__rate_interval]))) / on (instance) group_left (name) b - time() > 7 * 24 and c', {"legend"})
    assert q.selectors == {"a_bucket": {"job", "x"}, "b": set(), "c": set()}
    assert q.grouping == {"le", "controller", "instance", "name", "legend"}
    exported = Exported('# TYPE a counter\na_total{x="1",y="a,b=\\"c\\""} 1\n# TYPE u counter\n')
    assert exported.labels == {"a_total": {"x", "y"}} and exported.declared == {"a", "u"}
    assert exported.values == {"a_total": {("x", "1"), ("y", 'a,b=\\"c\\"')}}
    assert exported.problems([Query("q", 'a_total{x="2"} + a_total{x="1", y=~"$v"}')]) == [
        "q: a_total{x=\"2\"} + a_total{x=\"1\", y=~\"$v\"}\n  a_total has no series with [('x', '2')]"]
    assert exported.problems([Query("q", 'sum by (y, z) (a_total{w="1"}) + v')]) == [
        "q: sum by (y, z) (a_total{w=\"1\"}) + v\n  a_total has no label(s) ['w'] (it has ['x', 'y'])",
        "q: sum by (y, z) (a_total{w=\"1\"}) + v\n  metric v is not on /metrics",
        "q: sum by (y, z) (a_total{w=\"1\"}) + v\n  no metric of it has label(s) ['z']"]


# -- static checks ------------------------------------------------------------------------------------------
def test_alerts_file_is_a_prometheus_rule_file() -> None:
    doc = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    assert list(doc) == ["groups"]
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {
        "KubeSyncerControllerFailing", "KubeSyncerMemberClusterDown", "KubeSyncerRelistStorm",
        "KubeSyncerWebhookCertificateExpiresSoon", "KubeSyncerNoLeader"}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
    down = next(r for r in rules if r["alert"] == "KubeSyncerMemberClusterDown")
    assert down["for"] == "5m"


def test_dashboard_is_a_grafana_model_with_a_datasource_variable() -> None:
    dashboard = _dashboard()
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS" and dashboard["uid"] == "kube-syncer"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"DS_PROMETHEUS", "job", "instance"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Controllers", "Informers", "Member clusters", "Shards", "Webhooks", "API client and leadership"]
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"] == panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
            assert 'job=~"$job", instance=~"$instance"' in target["expr"], panel["title"]  # the variables apply


# -- against running sidecars -------------------------------------------------------------------------------
WEBHOOK_CONFIGURATION = "kube-syncer-monitoring-test"
_FAILING_PLUGIN = '''
from controllers import ManagedController
from informers import GVR


def syncer_controllers(settings):
    def create(ctx):
        raise RuntimeError("fails on purpose, for controller_manager_failures_total")
    return {"failing": ManagedController([GVR("", "v1", "configmaps")], create)}
'''


@pytest.fixture
def sidecars(control_plane: ControlPlane, namespace: str, admin_client: Any, tmp_path: Path) -> Iterator[list[Sidecar]]:
    """Two sidecars on the session's control plane: one with a member cluster (the same control plane, registered
    from its kubeconfig Secret), leader election, webhooks served and called by the API server, and a plugin whose
    controller fails; one sharded."""
    import kubernetes

    kubernetes.client.CoreV1Api(admin_client).create_namespaced_secret(namespace, {
        "metadata": {"name": "member", "labels": {"kube-syncer.io/kubeconfig": "true"}},
        "stringData": {"kubeconfig": control_plane.member_kubeconfig().decode()}})
    certs = tmp_path / "certs"
    CA.new().write_secret(certs)
    (tmp_path / "failing.py").write_text(_FAILING_PLUGIN)
    kubeconfig = str(control_plane.kubeconfig)
    plugins = ("examples.plugins.configmap_mirror", "examples.plugins.widget_webhook", str(tmp_path / "failing.py"))
    cars = [
        Sidecar(tmp_path, kubeconfig, name="fleet", plugins=plugins, extra=(
            f'[clusters]\nenabled = true\nnamespaces = ["{namespace}"]\n'
            f'[leader_election]\nenabled = true\nlease_name = "monitoring"\nlease_namespace = "{namespace}"\n'
            f'[webhooks]\nbind = "127.0.0.1:{free_port()}"\ncert_dir = "{certs}"\nmanage_configurations = true\n'
            f'configuration_name = "{WEBHOOK_CONFIGURATION}"\nprobe_namespace = "{namespace}"\n')),
        Sidecar(tmp_path, kubeconfig, name="sharded", plugins=("examples.plugins.configmap_mirror",), extra=(
            f'[sharding]\nenabled = true\ngroup = "monitoring"\nlease_namespace = "{namespace}"\n')),
    ]
    try:
        yield cars
    finally:
        for car in cars:  # a graceful stop: the webhook configurations and the Leases go with the process
            car.proc.send_signal(signal.SIGTERM)
        for car in cars:
            try:
                car.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                car.stop()
        admission = kubernetes.client.AdmissionregistrationV1Api(admin_client)
        for delete in (admission.delete_validating_webhook_configuration,
                       admission.delete_mutating_webhook_configuration):
            with contextlib.suppress(kubernetes.client.ApiException):  # already deleted by the stop
                delete(WEBHOOK_CONFIGURATION)


def test_every_metric_and_label_the_queries_name_is_exported(sidecars: list[Sidecar]) -> None:
    fleet, sharded = sidecars
    fleet.wait(lambda: (fleet.status().get("webhooks") or {}).get("called_by_api_server") is True,
               "the API server to call the webhooks", timeout=60)
    sharded.wait(lambda: any(u["state"] == "running" for u in (sharded.status().get("sharding") or {}).get("units", [])),
                 "a unit running", timeout=60)
    queries = _queries()
    assert len(queries) > 40

    def problems() -> list[str]:
        return Exported(*(car.get("/metrics")[1] for car in sidecars)).problems(queries)

    # Series come as their controllers start (a member's, the failing one's first failure): wait for them.
    deadline = time.monotonic() + 60
    while problems() and time.monotonic() < deadline and all(car.proc.poll() is None for car in sidecars):
        time.sleep(0.5)
    assert problems() == [], fleet.log[-3000:]
    exported = Exported(*(car.get("/metrics")[1] for car in sidecars))
    assert set(_UNSAMPLED_LABELS) <= exported.declared
    # The controls: the tokenizer finds the names, and a misspelt one would be reported.
    assert any("controller_runtime_reconcile_time_seconds_bucket" in q.selectors for q in queries)
    assert exported.problems([Query("typo", 'sum by (controler) (workqueue_depth{nme="x"})')]) == [
        "typo: sum by (controler) (workqueue_depth{nme=\"x\"})\n  workqueue_depth has no label(s) ['nme'] "
        "(it has ['name', 'priority'])",
        "typo: sum by (controler) (workqueue_depth{nme=\"x\"})\n  no metric of it has label(s) ['controler']"]
