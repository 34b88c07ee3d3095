"""The status page (issue 31): ``GET /status`` from a browser answers a page of the ``/status`` document.

In a real browser first: headless Chromium loads the page of a fleet sidecar (``syncer run`` in a subprocess,
members east and west up, member down unreachable, a controller waiting for a GVR no server serves, one whose
error quotes markup) and the test reads what a person sees, the DOM after load; a screenshot is kept in
``test-artifacts/`` (git-ignored). Without Chromium that test is skipped with the reason and how to install it
(``./dev test`` installs it where it can), never passed. Then, without a browser: the choice of HTML or JSON,
the page's escaping of user data, every section, and the ring buffer of recent figures.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from prometheus_client import CollectorRegistry

from controllers import WorkQueue, reconcile_metrics
from syncer.http import StatusServer, prefers_html
from syncer.status_history import StatusHistory, Trend
from syncer.status_page import render
from syncer.testing import ControlPlane

from tests.helpers import free_port
from tests.plugins.status_page import MARKUP
from tests.sidecar import Sidecar

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
# The browser: Debian's chromium package, or any Chromium/Chrome named by this variable (./dev reads it too).
BROWSER_ENV = "KUBE_SYNCER_CHROMIUM"


def browser() -> str:
    """The Chromium to run, or the test is skipped saying how to get one."""
    name = os.environ.get(BROWSER_ENV, "chromium")
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"browser test not run: no {name!r} on PATH; install it with `apt-get install chromium` "
                    f"(./dev test does so as root), or set {BROWSER_ENV} to a Chromium or Chrome")
    return found


def chromium(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=...``), a profile of its own."""
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--hide-scrollbars", f"--user-data-dir={profile}", *args, url],
        capture_output=True, text=True, timeout=120)


INLINE = {"a", "span", "code", "strong", "svg", "polygon", "polyline", "circle", "text", "title"}


class Dom(HTMLParser):
    """What a person sees of a document: its visible text, the elements by id, links, and what could run."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.text: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.handlers: list[str] = []  # on* attributes
        self.title = ""
        self._skip = 0
        self._in_title = False
        self._svg = 0
        self.feed(markup)
        self.visible = re.sub(r"\s+", " ", "".join(self.text))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag not in INLINE:  # a block or a cell: apart from what comes before, as a browser lays it out
            self.text.append(" ")
        for key, value in attrs:
            if key == "id" and value:
                self.ids.add(value)
            elif key == "href" and value:
                self.links.append(value)
            elif key.startswith("on"):
                self.handlers.append(f"{tag} {key}")
        self._svg += tag == "svg"
        if tag in ("style", "script", "title"):  # a chart's title is its tooltip
            self._skip += 1
            self._in_title = tag == "title" and not self._svg

    def handle_endtag(self, tag: str) -> None:
        self._svg -= tag == "svg"
        if tag in ("style", "script", "title"):
            self._skip -= 1
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.text.append(data)


def put_member(core: kubernetes.client.CoreV1Api, namespace: str, name: str, kubeconfig: bytes) -> None:
    core.create_namespaced_secret(namespace, {
        "metadata": {"name": name, "labels": {"kube-syncer.io/kubeconfig": "true"}},
        "data": {"kubeconfig": base64.b64encode(kubeconfig).decode()}})


def page(port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=5) as r:
        return str(r.read().decode())


def test_a_browser_shows_the_page_of_a_fleet_sidecar(control_plane: ControlPlane, admin_client: Any,
                                                     namespace: str, tmp_path: Path) -> None:
    browser()  # skipped at once, saying why, when there is none
    core = kubernetes.client.CoreV1Api(admin_client)
    for name in ("east", "west"):
        put_member(core, namespace, name, control_plane.member_kubeconfig())
    put_member(core, namespace, "down", control_plane.member_kubeconfig(server=f"https://127.0.0.1:{free_port()}"))
    car = Sidecar(tmp_path, str(control_plane.kubeconfig), name="fleet", plugins=("tests.plugins.status_page",),
                  settings=lambda port: (
                      f'kubeconfig = "{control_plane.kubeconfig}"\nplugins = ["tests.plugins.status_page"]\n'
                      f'include = ["core/configmaps"]\nhttp_bind = "127.0.0.1:{port}"\nshutdown_timeout = "10s"\n'
                      f'[clusters]\nenabled = true\nnamespaces = ["{namespace}"]\nsync_timeout = "20s"\n'))
    try:
        def running() -> bool:
            states = {c["name"]: c["state"] for c in car.status().get("controllers", [])}
            return all(states.get(f"configmap-count (cluster {m})") == "running" for m in ("east", "west"))

        car.wait(running, "configmap-count running in east and west", timeout=90)
        made = [0]

        def charted() -> bool:  # some reconciles meanwhile, so that the charts have something to show
            core.create_namespaced_config_map(namespace, {"metadata": {"name": f"cm-{made[0]}"}})
            made[0] += 1
            time.sleep(0.4)
            return "reconciles/s now" in page(car.port)

        car.wait(charted, "a reconcile rate chart of configmap-count (two history samples)", timeout=60)
        url = f"http://127.0.0.1:{car.port}/status"
        dumped = chromium(url, tmp_path, "--dump-dom")
        assert dumped.returncode == 0 and "<html" in dumped.stdout, dumped.stderr[-2000:]
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "status-page-fleet.png"
        shot.unlink(missing_ok=True)
        taken = chromium(url, tmp_path, "--window-size=1280,2200", f"--screenshot={shot}")
        assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-2000:]
        print(f"screenshot: {shot}")
    finally:
        car.stop()
    dom = Dom(dumped.stdout)
    seen = dom.visible
    assert "kube-syncer fleet" in seen and "members: 2 of 3 ready" in seen, seen[:500]
    # The controller waiting for a GVR, in both members, and why.
    assert re.search(r"gadget-sync in east, west waiting waits for gadgets\.v1\.page\.kube-syncer\.io: not served: "
                     r"no CRD or APIService provides it", seen), seen[:3000]
    # The member that is down: its state, its condition and since when.
    assert re.search(r"down retrying Connected: \S*Error: .*Connection refused", seen), seen[:3000]
    assert re.search(r"down retrying secret \S+/down ✗ Connected \? Discovered \? Synced down for \d+", seen), seen
    assert re.search(r"configmap-count 2 running 0 \d+ \(0\) [\d.]+/s", seen), seen
    # Each controller and member links to its own section.
    for target in ("controller-configmap-count", "controller-gadget-sync", "member-down", "member-east"):
        assert f"#{target}" in dom.links and target in dom.ids, (target, dom.links)
    # The error quoting markup is shown as text, and nothing of it became an element or ran.
    assert MARKUP in seen
    assert "script" not in dom.tags and "img" not in dom.tags and not dom.handlers, (dom.tags, dom.handlers)
    assert dom.title == "fleet · kube-syncer status"


def test_html_for_a_browser_json_for_everything_else(tmp_path: Path) -> None:
    assert prefers_html("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")  # a browser
    assert prefers_html("text/html")
    assert not prefers_html("")  # urllib
    assert not prefers_html("*/*")  # curl
    assert not prefers_html("application/json")
    assert not prefers_html("text/html;q=0.5, application/json")
    assert not prefers_html("text/html, */*")  # a tie keeps the JSON
    assert not prefers_html("text/html;q=oops")

    async def go() -> None:
        doc = {"identity": "x", "controllers": [{"name": "c", "state": "running"}]}
        server = StatusServer(f"127.0.0.1:{free_port()}", lambda: doc, lambda: (True, []), lambda: None)
        before = asyncio.all_tasks()
        await server.start()

        def get(query: str = "", accept: str | None = None) -> tuple[int, str, dict[str, str], str]:
            request = urllib.request.Request(f"http://127.0.0.1:{server.port}/status{query}",
                                             headers={"Accept": accept} if accept else {})
            try:
                with urllib.request.urlopen(request, timeout=5) as r:
                    return r.status, r.headers.get_content_type(), dict(r.headers), r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.headers.get_content_type(), dict(e.headers), e.read().decode()

        try:
            code, kind, _, body = await asyncio.to_thread(get)
            assert (code, kind, json.loads(body)) == (200, "application/json", doc)
            code, kind, headers, body = await asyncio.to_thread(get, "", "text/html,*/*;q=0.8")
            assert (code, kind) == (200, "text/html") and body.startswith("<!doctype html>")
            assert "script-src" not in headers["Content-Security-Policy"]
            assert headers["Content-Security-Policy"].startswith("default-src 'none'")
            assert headers["Vary"] == "Accept"
            assert (await asyncio.to_thread(get, "?format=html"))[1] == "text/html"
            code, kind, _, body = await asyncio.to_thread(get, "?format=json", "text/html")
            assert (code, kind, json.loads(body)) == (200, "application/json", doc)
            code, _, _, body = await asyncio.to_thread(get, "?format=yaml")
            assert code == 400 and "format=json or format=html" in body
        finally:
            await server.stop()
        assert not {t for t in asyncio.all_tasks() if not t.done()} - before - {asyncio.current_task()}

    asyncio.run(go())


def test_syncer_status_open_prints_the_page_url(tmp_path: Path) -> None:
    async def go() -> tuple[subprocess.CompletedProcess[str], str]:
        server = StatusServer(f"127.0.0.1:{free_port()}", lambda: {"identity": "x"}, lambda: (True, []),
                              lambda: None)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/status"
        try:
            return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "syncer", "status", "--open",
                                                            "--url", url], cwd=ROOT, capture_output=True,
                                           text=True, timeout=60), url
        finally:
            await server.stop()

    out, url = asyncio.run(go())
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{url}\n", "")
    gone = subprocess.run([sys.executable, "-m", "syncer", "status", "--open", "--url", url], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and gone.stdout == "" and f"no syncer answering at {url}" in gone.stderr


# -- the page without a browser ----------------------------------------------------------------------------------
NOW = 1_800_000_000.0
EXPIRY = datetime.fromtimestamp(NOW + 38.5 * 86400, timezone.utc).isoformat()
CA_EXPIRY = datetime.fromtimestamp(NOW + 10.5 * 86400, timezone.utc).isoformat()
EVIL = "<script>alert(1)</script>\"'&"


def controller(name: str, state: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "state": state, "missing": [], "not_synced": [], "running_since": None, "restarts": 0,
            "failures": 0, "last_error": "", "healthy": state not in ("backoff", "stuck"), "reconciles": 0,
            "reconcile_errors": 0, "last_reconcile_error": "", "last_reconcile_error_at": None, **kw}


def condition(kind: str, status: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": "", "message": message, "since": NOW - 300}


def member(name: str, state: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "display_name": name or "(local)", "source": f"secret ns/{name}", "state": state,
            "ready": state == "ready", "attempts": 1, "conditions": list(conditions), "rotation": None}


def full_doc() -> dict[str, Any]:
    """A document with every part: a fleet with a member down, shards, webhooks, stores, runnables, failed tasks;
    user data (names, messages) full of markup."""
    return {
        "identity": f"id-{EVIL}", "ready": True, "leader": False, "leader_election": True, "lease_holder": EVIL,
        "gvrs": [{"gvr": "configmaps.v1", "state": "synced", "reason": "", "kind": "ConfigMap", "source": "builtin"},
                 {"gvr": "widgets.v1.ex.io", "state": "error", "reason": f"list failed: {EVIL}", "kind": "Widget",
                  "source": "crd"},
                 {"gvr": "events.v1", "state": "excluded", "reason": "matches no include rule", "kind": "Event",
                  "source": "builtin"}],
        "controllers": [
            controller("mirror (cluster east)", "running", running_since=NOW - 125, reconciles=40),
            controller("mirror (cluster (local))", "running", running_since=NOW - 125, reconciles=2),
            controller("gadgets (cluster east)", "waiting", missing=[
                "gadgets.v1.ex.io (not served: no CRD or APIService provides it; did you mean gadget.v1.ex.io?)"]),
            controller(f"{EVIL} (cluster east)", "backoff", failures=3, last_error=f"create: {EVIL}"),
        ],
        "clusters": {
            "clusters": [member("", "ready", condition("Connected", "True")),
                         member("down", "retrying", condition("Connected", "False", f"refused {EVIL}")),
                         member("east", "ready", condition("Connected", "True"), condition("Synced", "True")),
                         member(EVIL, "refused", condition("Connected", "False", "bad kubeconfig"))],
            "conflicts": [{"secret": f"ns/{EVIL}", "claim": "secret", "cluster": "east",
                           "message": f"cluster name 'east' is held by secret ns/east {EVIL}"}],
            "providers": {"secrets": {"watching": [f"namespace ns labelSelector={EVIL}"], "synced": True}},
            "fleet_controllers": [{"name": "report", "gvr": "widgets.v1.ex.io", "clusters": ["east"], "queue": 1,
                                   "reconciles": 5, "reconcile_errors": 1, "last_reconcile_error": EVIL}],
            "fleet_components": [{"name": "cache", "replications": 2}],
        },
        "sharding": {"group": "g", "kind": "clusters", "identity": "a", "leases_synced": True,
                     "members": [{"identity": "a", "self": True}, {"identity": "b", "self": False}],
                     "owned": 1, "handovers": ["down"], "stuck": [],
                     "units": [{"unit": "east", "state": "running", "holder": "a", "transitions": 2, "assigned": "a"},
                               {"unit": "down", "state": "handing-over", "holder": "a", "transitions": 0,
                                "assigned": "b"}]},
        "tasks": [{"name": "discovery passes", "state": "running", "restarts": 2, "last_error": EVIL,
                   "last_error_at": NOW - 60, "busy_for": None, "wedged": False, "healthy": True},
                  {"name": "dead one", "state": "dead", "restarts": 9, "last_error": "boom", "last_error_at": NOW,
                   "busy_for": None, "wedged": False, "healthy": False}],
        "stores": [{"name": "s", "state": "backoff", "attempts": 3, "failures": 3, "last_error": EVIL,
                    "for_seconds": 12.5}],
        "runnables": [{"name": "r", "state": "running", "attempts": 1, "failures": 0, "last_error": "",
                       "for_seconds": 99.0}],
        "webhooks": {
            "ready": True, "self_dial": True, "called_by_api_server": True, "bind": "0.0.0.0:9443", "last_error": "",
            "certificate": {"source": "self-signed", "subject": f"CN={EVIL}", "not_after": EXPIRY, "ca_not_after": CA_EXPIRY,
                            "reloads": 1, "client_certificates": "not required", "rotation": "", "last_error": ""},
            "configurations": "managed: syncer-x",
            "webhooks": [{"name": "validate", "kind": "validating", "path": "/validate", "failure_policy": "Fail",
                          "timeout_seconds": 10, "requests": 10, "allowed": 7, "denied": 2, "errors": 1,
                          "latency_seconds": {"mean": 0.0021, "max": 0.03}}],
            "conversions": [{"crd": "widgets.ex.io", "path": "/convert", "configuration": "managed", "requests": 4,
                             "converted": 4, "errors": 0, "latency_seconds": {"mean": None, "max": None}}]},
    }


def test_the_page_shows_every_part_and_escapes_user_data() -> None:
    trends = {"mirror": Trend([(20.0, 1.0), (10.0, 3.0)], [(30.0, 0.0), (20.0, 4.0), (10.0, 1.0)], 2.0, 0.5, 0.012,
                              1),
              "report": Trend([], [(10.0, 1.0)], None, None, None, 1)}
    markup = render(full_doc(), trends, 600, now=NOW)
    dom = Dom(markup)
    # Nothing of the user data became markup: only the page's own elements, no handler, the text intact.
    assert dom.tags <= {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "span", "p",
                        "nav", "a", "main", "section", "ul", "li", "table", "thead", "tbody", "tr", "th", "td",
                        "article", "div", "pre", "code", "figure", "figcaption", "svg", "title", "polygon",
                        "polyline", "circle", "text", "details", "summary", "strong", "footer"}, dom.tags
    assert not dom.handlers and "<script>" not in markup and EVIL in dom.visible
    assert dom.title == f"id-{EVIL} · kube-syncer status"
    seen = dom.visible
    for part in (
        "ready standby · lease holder " + EVIL,
        "members: 2 of 4 ready",
        # the controllers: instances together by name, what they wait for with the suggestion apart
        "mirror 2 running 0 42 (0) 2/s 12.0 ms 1",
        f"{EVIL} in east backoff create: {EVIL}",
        "gadgets in east waiting waits for gadgets.v1.ex.io: not served: no CRD or APIService provides it",
        "did you mean gadget.v1.ex.io?",
        "Reconciles per second", "now 2/s, errors 0.5/s, mean time 12.0 ms (last 1 min)",
        # the members: state, provider, conditions, last seen; the local one by its display name
        "down retrying secret ns/down ✗ Connected down for 5 min",
        "(local) ready secret ns/ ✓ Connected now",
        f"Controllers here: mirror running, gadgets waiting, {EVIL} backoff",
        f"ns/{EVIL} east cluster name 'east' is held by secret ns/east {EVIL}",
        "report widgets.v1.ex.io east 1 5 (1)",
        "Group g; 1 unit(s) owned here; leases listed; handing over: down",
        "a (this replica) 2", "down handing-over a 0 b",
        "serving on 0.0.0.0:9443", f"CN={EVIL}", f"CN={EVIL} expires in 38 days ({EXPIRY}); its CA expires in 10 days ({CA_EXPIRY})",
        "validate validating /validate Fail 10 7 2 1 2.1 ms 30.0 ms",
        "widgets.ex.io conversion /convert managed 4 4 - 0 - -",
        f"widgets.v1.ex.io Widget error crd list failed: {EVIL}",
        "1 GVR(s) excluded",
        f"s backoff 3 3 12s {EVIL}",
        "dead one dead 9 - boom",
    ):
        assert part in seen, f"{part!r} not in {seen}"
    for anchor in ("controller-mirror", "controller-gadgets", "member-down", "member-east", "attention"):
        assert anchor in dom.ids and f"#{anchor}" in dom.links, anchor
    # Names that are not plain get a slug and a hash as their anchor; the links find them.
    evil_links = [link for link in dom.links if link.startswith("#controller-script-alert-1-script-")]
    assert evil_links and evil_links[0][1:] in dom.ids


def test_the_page_of_a_standby_and_of_a_single_cluster() -> None:
    standby = {"identity": "b", "ready": True, "leader": False, "leader_election": True, "lease_holder": None,
               "gvrs": [], "controllers": [{"name": "mirror", "state": "standby"}], "clusters": None,
               "sharding": None, "tasks": [], "stores": [], "runnables": [], "webhooks": None}
    seen = Dom(render(standby, {}, 600, now=NOW)).visible
    assert "lease holder none seen yet" in seen and "mirror standby" in seen and "Needs attention" not in seen
    assert "Member clusters" not in seen and "Webhooks" not in seen
    single = {**standby, "leader": True, "leader_election": False,
              "controllers": [controller("mirror", "running", running_since=NOW - 5, reconciles=3)]}
    seen = Dom(render(single, {}, 600, now=NOW)).visible
    assert "ready leader · leader election off" in seen and "mirror running 0 3 (0) - - -" in seen
    assert "Cluster" not in seen  # no member column outside a fleet


def test_history_keeps_the_last_samples_of_rates_latency_and_depth() -> None:
    registry = CollectorRegistry()
    clock = [100.0]
    history = StatusHistory(interval=5, size=4, registry=registry, clock=lambda: clock[0])
    history.sample()
    assert history.trends() == {} and history.window == 20
    assert not list(registry.collect())  # reading made no metric family
    metrics = reconcile_metrics("c", registry)
    queue: WorkQueue[str] = WorkQueue("c", metrics_registry=registry)
    idle: WorkQueue[str] = WorkQueue("idle-queue", metrics_registry=registry)
    for i in range(6):
        clock[0] += 5
        for _ in range(i):
            metrics.observe("success", 0.01)
        if i == 5:
            metrics.observe("error", 0.05)
        queue.add(f"k{i}")
        history.sample()
    trend = history.trends()["c"]
    # Four samples kept (the last 15 s): 3, 4 and 5+1 reconciles in the 5 s between them.
    assert [round(age) for age, _ in trend.depths] == [15, 10, 5, 0] and [v for _, v in trend.depths] == [3, 4, 5, 6]
    assert [(round(age), v) for age, v in trend.rates] == [(10, 0.6), (5, 0.8), (0, 1.2)]
    assert trend.rate == pytest.approx(13 / 15) and trend.error_rate == pytest.approx(1 / 15)
    assert trend.latency == pytest.approx((12 * 0.01 + 0.05) / 13) and trend.depth == 6
    assert idle.name in history.trends() and history.trends()[idle.name].rate == 0.0  # no reconcile (yet)
