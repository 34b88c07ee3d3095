"""The ``/status`` document as a page for a person: ``GET /status`` from a browser (``Accept: text/html``).

One self-contained HTML page (no script, no external asset, ``meta refresh``, inline SVG trend charts), with a
linked section per controller and member. Every value may be user data: it goes through ``html.escape`` unless it
is ``Html`` made here, and the Content-Security-Policy allows no script.

Over 400 lines: one page, whose sections share the document, the helpers and the stylesheet (``_CSS``).
"""

from __future__ import annotations

import hashlib
import html
import re
import time
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from controllers.cluster import display_name

from .status_history import RECENT, Trend

__all__ = ["CONTENT_SECURITY_POLICY", "REFRESH", "render"]

REFRESH = 5
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; " \
                          "frame-ancestors 'none'; base-uri 'none'"

# Colours by state: every state the document has, from controllers, GVRs, members, shard units, tasks, stores
# and runnables. An unknown one is shown plain.
_GOOD = {"running", "synced", "ready", "True"}
_WARN = {"waiting", "starting", "stopping", "connecting", "discovering", "syncing", "degraded", "retrying",
         "stale", "handing-over", "recovering", "standby", "Unknown", "idle", "discovered"}
_BAD = {"backoff", "stuck", "error", "forbidden", "refused", "dead", "failed", "False"}
_MUTED = {"excluded", "elsewhere", "stopped", "superseded"}
_CLUSTER_ROW = re.compile(r"^(?P<name>.*) \(cluster (?P<cluster>.*)\)$")  # controllers.cluster.qualified's form
_MISSING = re.compile(r"^(?P<gvr>\S+) \((?P<reason>.*)\)$")  # ControllerStatus.missing's "gvr (reason)"
_HINT = "; did you mean "


class Html(str):
    """Markup this module made: inserted as is (anything else is escaped)."""


def _e(value: Any) -> Html:
    """``value`` as safe markup: ``Html`` as is, None as nothing, anything else as escaped text."""
    if isinstance(value, Html):
        return value
    return Html("" if value is None else html.escape(str(value), quote=True))


def _tag(name: str, content: Any, cls: str = "", **attrs: str) -> Html:
    """``<name class=cls attrs>content</name>``: the tag and attribute names are this module's, values escaped."""
    attrs = {"class": cls, **attrs} if cls else attrs
    rendered = "".join(f' {k}="{_e(v)}"' for k, v in attrs.items())
    return Html(f"<{name}{rendered}>{_e(content)}</{name}>")


def _join(parts: Iterable[Any], sep: str = "") -> Html:
    return Html(_e(sep).join(_e(p) for p in parts))


def render(doc: Mapping[str, Any], trends: Mapping[str, Trend], window: float, now: float | None = None) -> str:
    """The page of ``doc`` (the ``/status`` document) with ``trends`` (by controller name, over ``window``
    seconds); ``now`` (epoch seconds, the current time by default) is what the ages are counted from."""
    page = _Page(doc, trends, window, time.time() if now is None else now)
    return page.render()


class _Page:
    def __init__(self, doc: Mapping[str, Any], trends: Mapping[str, Trend], window: float, now: float) -> None:
        self.doc, self.trends, self.window, self.now = doc, trends, window, now
        clusters = doc.get("clusters") or {}
        self.members: list[dict[str, Any]] = clusters.get("clusters") or []
        self.member_names = {m["name"] for m in self.members}
        # Controllers by name: each row of the document is one instance (one per member in a fleet).
        self.controllers: dict[str, list[tuple[str | None, dict[str, Any]]]] = defaultdict(list)
        for row in doc.get("controllers") or []:
            found = _CLUSTER_ROW.match(row["name"])
            name, cluster = (found["name"], found["cluster"]) if found else (row["name"], None)
            self.controllers[name].append((cluster, row))

    def render(self) -> str:
        doc = self.doc
        sections = [self.attention(), self.controllers_section(), self.members_section(), self.conflicts(),
                    self.fleet(), self.shards(), self.webhooks(), self.gvrs(), self.work(), self.tasks()]
        shown = [s for s in sections if s]
        nav = _join((_tag("a", title, href=f"#{anchor}") for anchor, title, _ in shown), " · ")
        identity = doc.get("identity", "")
        return (
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"refresh\" content=\"{REFRESH}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(identity)} · kube-syncer status</title><style>{_CSS}</style></head><body>"
            f"<header><h1>kube-syncer <span class=\"identity\">{_e(identity)}</span></h1>"
            f"<p class=\"facts\">{self.facts()}</p><nav>{nav}</nav></header><main>"
            + "".join(f"<section id=\"{anchor}\"><h2>{_e(title)}</h2>{body}</section>" for anchor, title, body in shown)
            + f"<footer>Generated {_e(_clock(self.now))} UTC; refreshes every {REFRESH} s. Charts: this replica's "
              f"metrics over the last {_e(_duration(self.window))} (or since it started), newest on the right. The "
              "same document as JSON: <code>curl /status</code>, or <a href=\"?format=json\">?format=json</a>."
              "</footer></main></body></html>\n")

    # -- header --------------------------------------------------------------------------------------------
    def facts(self) -> Html:
        doc = self.doc
        ready = _pill("ready" if doc.get("ready") else "not ready", "ready" if doc.get("ready") else "waiting")
        if not doc.get("leader_election"):
            parts = [_join([ready, " ", _pill("leader", "running")]), Html("leader election off")]
        else:
            leading = _pill("leader", "running") if doc.get("leader") else _pill("standby", "standby")
            parts = [_join([ready, " ", leading]),
                     _join(["lease holder ", _tag("strong", doc.get("lease_holder") or "none seen yet")])]
        states = Counter(row.get("state", "") for rows in self.controllers.values() for _, row in rows)
        if states:
            parts.append(_join(["controllers: ", _join((f"{n} {s}" for s, n in sorted(states.items())), ", ")]))
        if doc.get("clusters") is not None:
            up = sum(1 for m in self.members if m.get("ready"))
            parts.append(_e(f"members: {up} of {len(self.members)} ready"))
        return _join(parts, " · ")

    # -- sections: each (anchor, title, body) or None when there is nothing to show ---------------------------
    def attention(self) -> tuple[str, str, Html] | None:
        """What a person should look at first: controllers not running, members not ready, failed tasks."""
        items = []
        for name, rows in self.controllers.items():
            # One line per state and reason: in a fleet, the members where it is so are listed on it.
            where: dict[tuple[str, Html], list[str]] = defaultdict(list)
            for cluster, row in rows:
                state = row.get("state", "")
                if state not in ("running", "standby"):
                    why = _waiting_for(row, short=True) if state == "waiting" else _e(row.get("last_error", ""))
                    where[(state, why)].append(cluster or "")
            for (state, why), clusters in where.items():
                members = _join(["in ", _join((_member_link(self.member_name(c)) for c in clusters), ", "), " "]) \
                    if any(clusters) else ""
                items.append(_join([_controller_link(name), " ", members, _pill(state), " ",
                                    _tag("span", why, "error" if state != "waiting" else "")]))
        for m in self.members:
            if not m.get("ready"):
                items.append(_join([_member_link(m["name"]), " ", _pill(m.get("state", "")), " ", _problem(m)]))
        for t in self.doc.get("tasks") or []:
            if not t.get("healthy", True):
                items.append(_join(["task ", _tag("a", t["name"], href="#tasks"), " ",
                                    _pill("stuck" if t.get("wedged") else t.get("state", "")), " ", t["last_error"]]))
        conflicts = (self.doc.get("clusters") or {}).get("conflicts") or []
        if conflicts:
            items.append(_join([_tag("a", f"{len(conflicts)} conflicting cluster claim(s)", href="#conflicts"),
                                " are ignored"]))
        if not items:
            return None
        return "attention", "Needs attention", _tag("ul", _join(_tag("li", i) for i in items), "attention")

    def controllers_section(self) -> tuple[str, str, Html] | None:
        if not self.controllers:
            return None
        fleet = self.doc.get("clusters") is not None
        rows = []
        for name, instances in self.controllers.items():
            states = Counter(row.get("state", "") for _, row in instances)
            trend = self.trends.get(name)
            errors = [row.get("last_error") or row.get("last_reconcile_error") or "" for _, row in instances]
            rows.append([
                _controller_link(name),
                _join((_pill(s, label=f"{n} {s}" if fleet else s) for s, n in sorted(states.items())), " "),
                _join(sorted({w for _, row in instances for w in _waiting_gvrs(row)}), ", "),
                sum(row.get("restarts", 0) for _, row in instances),
                _count(sum(row.get("reconciles", 0) for _, row in instances),
                       sum(row.get("reconcile_errors", 0) for _, row in instances)),
                self.rate_cell(trend), _tag("span", _latency(trend.latency) if trend else "-", "nowrap"),
                self.depth_cell(trend), _clipped(next((e for e in errors if e), ""))])
        table = _table(["Controller", "State", "Waiting for", "Restarts", "Reconciles (errors)", "Reconciles/s",
                        "Mean time", "Queue", "Last error"], rows)
        cards = _join(self.controller_card(name, instances) for name, instances in self.controllers.items())
        note = (Html("<p class=\"note\">In a fleet a controller runs once per member cluster; the figures and "
                     "charts of its name count all of them.</p>") if fleet else Html(""))
        return "controllers", "Controllers", _join([table, note, cards])

    def controller_card(self, name: str, instances: Sequence[tuple[str | None, dict[str, Any]]]) -> Html:
        trend = self.trends.get(name)
        rows = []
        for cluster, row in instances:
            rows.append(([_member_link(self.member_name(cluster))] if cluster is not None else []) + [
                _pill(row.get("state", "")), self.since(row.get("running_since")),
                row.get("restarts", 0), row.get("failures", 0),
                _count(row.get("reconciles", 0), row.get("reconcile_errors", 0)), _details(row)])
        head = (["Cluster"] if instances[0][0] is not None else []) + [
            "State", "Running since", "Restarts", "Failures", "Reconciles (errors)", "Details"]
        charts = Html("")
        if trend is not None:
            charts = _tag("div", _join([
                _figure("Reconciles per second", self.chart(trend.rates, "reconciles/s", big=True),
                        f"now {_rate(trend.rate)}, errors {_rate(trend.error_rate)}, mean time "
                        f"{_latency(trend.latency)} (last {_duration(RECENT)})"),
                _figure("Queue depth", self.chart(trend.depths, "items", big=True), f"now {trend.depth}")]),
                "charts")
        return _tag("article", _join([_tag("h3", name), _table(head, rows), charts]), "card",
                    id=_anchor("controller", name))

    def members_section(self) -> tuple[str, str, Html] | None:
        if self.doc.get("clusters") is None:
            return None
        if not self.members:
            return "members", "Member clusters", Html("<p class=\"muted\">No member cluster yet.</p>")
        rows = [[_member_link(m["name"]), _pill(m.get("state", "")), m.get("source", ""),
                 _join((_condition(c) for c in m.get("conditions", [])), " "),
                 self.last_seen(m), m.get("attempts", ""), _clipped(_problem(m))]
                for m in self.members]
        table = _table(["Cluster", "State", "Provider", "Conditions", "Last seen", "Attempts", "Problem"], rows)
        cards = _join(self.member_card(m) for m in self.members)
        providers = (self.doc.get("clusters") or {}).get("providers") or {}
        listed = _table(["Provider", "Synced", "Watching"], [
            [name, "yes" if p.get("synced") else "no", _join(p.get("watching") or [], "; ")]
            for name, p in sorted(providers.items())]) if providers else Html("")
        return "members", "Member clusters", _join([table, listed, cards])

    def member_card(self, m: Mapping[str, Any]) -> Html:
        conditions = _table(["Condition", "Status", "Reason", "Message", "Since"], [
            [c["type"], _pill(c["status"]), c.get("reason", ""),
             _tag("span", c.get("message", ""), "error" if c["status"] == "False" else ""),
             self.since(c.get("since"))] for c in m.get("conditions", [])])
        shown = display_name(m["name"])
        here = [(name, row) for name, rows in self.controllers.items() for cluster, row in rows if cluster == shown]
        controllers = _join((_join([_controller_link(name), " ", _pill(row.get("state", ""))]) for name, row in here),
                            ", ")
        parts = [_tag("h3", shown), _tag("p", _join([_pill(m.get("state", "")), " from ", m.get("source", ""),
                                                     f"; {m.get('attempts', 0)} connection attempt(s)"])),
                 conditions, _tag("p", _join(["Controllers here: ", controllers or "none"]))]
        rotation = m.get("rotation")
        if rotation:
            parts.append(_tag("p", _join(["A changed config is being brought up: ", _pill(rotation.get("state", "")),
                                          " ", _problem(rotation)])))
        return _tag("article", _join(parts), "card", id=_anchor("member", m["name"]))

    def conflicts(self) -> tuple[str, str, Html] | None:
        found = (self.doc.get("clusters") or {}).get("conflicts") or []
        if not found:
            return None
        return "conflicts", "Conflicting cluster claims (ignored)", _table(
            ["Claim", "Cluster", "Ignored because"],
            [[c.get("secret") or c.get("claim", ""), _member_link(c["cluster"]) if c.get("cluster") in
              self.member_names else c.get("cluster", ""), _tag("span", c.get("message", ""), "error")]
             for c in found])

    def fleet(self) -> tuple[str, str, Html] | None:
        clusters = self.doc.get("clusters") or {}
        loops, components = clusters.get("fleet_controllers") or [], clusters.get("fleet_components") or []
        if not loops and not components:
            return None
        parts = []
        if loops:
            parts.append(_table(["Fleet controller", "GVR", "Clusters", "Queue", "Reconciles (errors)",
                                 "Reconciles/s", "Last error"], [
                [f["name"], f["gvr"], _join((_member_link(c) for c in f.get("clusters", [])), ", ") or "-",
                 f.get("queue", 0), _count(f.get("reconciles", 0), f.get("reconcile_errors", 0)),
                 self.rate_cell(self.trends.get(f["name"])),
                 _tag("span", f.get("last_reconcile_error", ""), "error")] for f in loops]))
        if components:
            parts.append(_table(["Fleet component", "Status"], [
                [c["name"], _tag("code", ", ".join(f"{k}={v}" for k, v in c.items() if k != "name"))]
                for c in components]))
        return "fleet", "Fleet controllers", _join(parts)

    def shards(self) -> tuple[str, str, Html] | None:
        s = self.doc.get("sharding")
        if s is None:
            return None
        clusters = s.get("kind") == "clusters"
        held = Counter(u.get("holder") for u in s.get("units", []))
        members = _table(["Shard member", "Units held"], [
            [_join([m["identity"], " (this replica)" if m.get("self") else ""]), held.get(m["identity"], 0)]
            for m in s.get("members", [])])

        def unit(name: str) -> Any:
            """A unit linked to its member's or controller's section when the page has one."""
            if clusters:
                return _member_link(name) if name in self.member_names else display_name(name)
            return _controller_link(name) if name in self.controllers else name

        units = _table([f"Unit ({s.get('kind', '')})", "State here", "Lease holder", "Transitions", "Assigned to"], [
            [unit(u["unit"]), _pill(u.get("state", "")), u.get("holder") or "-",
             "-" if u.get("transitions") is None else u["transitions"], u.get("assigned") or "-"]
            for u in s.get("units", [])])
        facts = _tag("p", _join([
            "Group ", _tag("strong", s.get("group", "")), f"; {s.get('owned', 0)} unit(s) owned here; leases ",
            "listed" if s.get("leases_synced") else "not listed yet",
            _join(["; handing over: ", _join((unit(h) for h in s["handovers"]), ", ")]) if s.get("handovers") else "",
            _join(["; stuck (their Lease kept): ", _join(s["stuck"], ", ")]) if s.get("stuck") else ""]))
        return "shards", "Shards", _join([facts, members, units])

    def webhooks(self) -> tuple[str, str, Html] | None:
        w = self.doc.get("webhooks")
        if not w:
            return None
        cert = w.get("certificate") or {}
        facts = _tag("p", _join([
            _pill("ready" if w.get("ready") else "not ready", "ready" if w.get("ready") else "waiting"), " serving on ",
            _tag("code", w.get("bind", "")), "; called by the API server: ", "yes" if w.get("called_by_api_server")
            else "not yet", "; configurations: ", w.get("configurations", ""),
            _join(["; ", _tag("span", w["last_error"], "error")]) if w.get("last_error") else ""]))
        certificate = _tag("p", _join([
            "Certificate: ", cert.get("source", ""), " ", _tag("code", cert.get("subject", "")), " ",
            self.expiry(cert.get("not_after", "")), "; its CA ",
            self.expiry(cert["ca_not_after"]) if cert.get("ca_not_after") else "not known (no ca.crt)",
            f"; reloaded {cert.get('reloads', 0)} time(s); client "
            f"certificates {cert.get('client_certificates', '')}",
            _join(["; ", cert["rotation"]]) if cert.get("rotation") else "",
            _join(["; ", _tag("span", cert["last_error"], "error")]) if cert.get("last_error") else ""]))
        rows = [[x["name"], x["kind"], _tag("code", x.get("path", "")), x.get("failure_policy", ""),
                 x["requests"], x["allowed"], x["denied"], x["errors"], _latency(x["latency_seconds"]["mean"]),
                 _latency(x["latency_seconds"]["max"])] for x in w.get("webhooks", [])]
        rows += [[c["crd"], "conversion", _tag("code", c.get("path", "")), c.get("configuration", ""),
                  c["requests"], c["converted"], "-", c["errors"], _latency(c["latency_seconds"]["mean"]),
                  _latency(c["latency_seconds"]["max"])] for c in w.get("conversions", [])]
        table = _table(["Webhook", "Kind", "Path", "Failure policy / configuration", "Requests",
                        "Allowed / converted", "Denied", "Errors", "Mean", "Max"], rows)
        return "webhooks", "Webhooks", _join([facts, certificate, table])

    def gvrs(self) -> tuple[str, str, Html] | None:
        all_gvrs = self.doc.get("gvrs") or []
        wanted: dict[str, tuple[str, set[str]]] = {}
        for name, rows in self.controllers.items():
            for _, row in rows:
                for entry in row.get("missing") or []:
                    gvr, reason = _split_missing(entry)
                    wanted.setdefault(gvr, (reason, set()))[1].add(name)
        if not all_gvrs and not wanted:
            return None
        parts = []
        if wanted:
            parts.append(_tag("h3", "Required but not served"))
            parts.append(_table(["GVR", "Why", "Did you mean", "Required by"], [
                [gvr, *_reason_and_hint(reason), _join((_controller_link(n) for n in sorted(names)), ", ")]
                for gvr, (reason, names) in sorted(wanted.items())]))
        shown = [g for g in all_gvrs if g.get("state") != "excluded"]
        excluded = [g for g in all_gvrs if g.get("state") == "excluded"]
        if shown:
            parts.append(_table(["GVR", "Kind", "State", "Source", "Reason", "Did you mean"], [
                [g["gvr"], g.get("kind", ""), _pill(g.get("state", "")), g.get("source", ""),
                 *_reason_and_hint(g.get("reason", ""))] for g in shown]))
        if excluded:
            parts.append(_tag("details", _join([
                _tag("summary", f"{len(excluded)} GVR(s) excluded (filters, verbs, permissions)"),
                _table(["GVR", "Kind", "Source", "Why"], [[g["gvr"], g.get("kind", ""), g.get("source", ""),
                                                            g.get("reason", "")] for g in excluded])])))
        return "gvrs", "GVRs", _join(parts)

    def work(self) -> tuple[str, str, Html] | None:
        stores, runnables = self.doc.get("stores") or [], self.doc.get("runnables") or []
        if not stores and not runnables:
            return None
        head = ["Name", "State", "Attempts", "Failures", "For", "Last error"]

        def rows(items: list[dict[str, Any]]) -> list[list[Any]]:
            return [[i["name"], _pill(i.get("state", "")), i.get("attempts", 0), i.get("failures", 0),
                     _duration(i.get("for_seconds") or 0), _tag("span", i.get("last_error", ""), "error")]
                    for i in items]
        parts = [_join([_tag("h3", "Stores"), _table(head, rows(stores))]) if stores else "",
                 _join([_tag("h3", "Runnables"), _table(head, rows(runnables))]) if runnables else ""]
        return "work", "Stores and runnables", _join(parts)

    def tasks(self) -> tuple[str, str, Html] | None:
        tasks = self.doc.get("tasks") or []
        if not tasks:
            return None
        head = ["Task", "State", "Restarts", "Busy for", "Last error"]

        def row(t: Mapping[str, Any]) -> list[Any]:
            return [t["name"], _pill("stuck" if t.get("wedged") else t.get("state", ""),
                                     label="wedged" if t.get("wedged") else None), t.get("restarts", 0),
                    _duration(t["busy_for"]) if t.get("busy_for") is not None else "-",
                    _join([_tag("span", t.get("last_error", ""), "error"),
                           f" ({self.ago(t['last_error_at'])})" if t.get("last_error_at") else ""])]
        troubled = [t for t in tasks if t.get("last_error") or not t.get("healthy", True)]
        parts = [_table(head, [row(t) for t in troubled]) if troubled else
                 Html("<p>Every background task is running without error.</p>"),
                 _tag("details", _join([_tag("summary", f"All {len(tasks)} background tasks"),
                                        _table(head, [row(t) for t in tasks])]))]
        return "tasks", "Background tasks", _join(parts)

    # -- cells ---------------------------------------------------------------------------------------------
    def member_name(self, shown: str) -> str:
        """The member name of a controller row's cluster (rows show ``display_name``)."""
        return "" if shown == display_name("") and "" in self.member_names else shown

    def last_seen(self, m: Mapping[str, Any]) -> Html:
        connected = next((c for c in m.get("conditions", []) if c["type"] == "Connected"), None)
        if connected is None or connected["status"] == "Unknown":
            return _e("never")
        if connected["status"] == "True":
            return _e("now")
        return _tag("span", f"down for {self.ago(connected['since'], suffix='')}", "bad-text",
                    title=f"unreachable since {_clock(connected['since'])} UTC")

    def since(self, at: float | None) -> Html:
        return _tag("span", f"{_clock(at)} ({self.ago(at)})", title=f"{_clock(at)} UTC") if at else _e("-")

    def ago(self, at: float, suffix: str = " ago") -> str:
        return f"{_duration(max(0.0, self.now - at))}{suffix}"

    def expiry(self, not_after: str) -> Html:
        if not not_after:
            return _e("no certificate loaded")
        try:
            left = datetime.fromisoformat(not_after).timestamp() - self.now
        except ValueError:
            return _e(f"expires {not_after}")
        state = "error" if left < 0 else "waiting" if left < 14 * 86400 else "ready"
        return _join([_pill("expired" if left < 0 else f"expires in {_duration(left)}", state), f" ({not_after})"])

    def rate_cell(self, trend: Trend | None) -> Html:
        if trend is None:
            return _e("-")
        return _tag("span", _join([_rate(trend.rate), " ", self.chart(trend.rates, "reconciles/s")]), "nowrap")

    def depth_cell(self, trend: Trend | None) -> Html:
        if trend is None:
            return _e("-")
        return _tag("span", _join([trend.depth, " ", self.chart(trend.depths, "items")]), "nowrap")

    def chart(self, points: Sequence[tuple[float, float]], unit: str, big: bool = False) -> Html:
        """A sparkline of ``points`` ((seconds ago, value), oldest first), newest on the right, over the time they
        span (the buffer's window once full: a young process's few minutes are not squeezed to one side)."""
        width, height = (260, 56) if big else (96, 22)
        if not points:
            return _tag("span", "collecting…", "muted")
        top = max(v for _, v in points) or 1.0
        oldest, newest = points[0][0], points[-1][0]
        xy = [(round(width * (oldest - age) / (oldest - newest), 1) if oldest > newest else width,
               round(height - 2 - (height - 4) * v / top, 1)) for age, v in points]
        line = " ".join(f"{x},{y}" for x, y in xy)
        area = f"{xy[0][0]},{height} {line} {xy[-1][0]},{height}"
        label = f"{_num(points[-1][1])} {unit} now, at most {_num(top)} in the last {_duration(oldest)}"
        x, y = xy[-1]
        return Html(f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
                    f'role="img" aria-label="{_e(label)}"><title>{_e(label)}</title>'
                    f'<polygon points="{area}"/><polyline points="{line}"/><circle cx="{x}" cy="{y}" r="2"/>'
                    + (f'<text x="2" y="10">{_e(_num(top))}</text>' if big else "") + "</svg>")


# -- helpers -------------------------------------------------------------------------------------------------
def _table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> Html:
    body = _join(_tag("tr", _join(_tag("td", cell) for cell in row)) for row in rows)
    return Html(f"<table><thead><tr>{_join(_tag('th', h) for h in head)}</tr></thead><tbody>{body}</tbody></table>")


def _pill(state: str, kind: str | None = None, label: str | None = None, title: str = "") -> Html:
    """A state as a coloured label (its colour from ``kind``, or from the state itself)."""
    key = kind if kind is not None else state
    cls = ("good" if key in _GOOD else "warn" if key in _WARN else "bad" if key in _BAD else
           "muted" if key in _MUTED else "plain")
    return _tag("span", state if label is None else label, f"pill {cls}", **({"title": title} if title else {}))


def _anchor(prefix: str, name: str) -> str:
    """A stable fragment for ``name``: the name itself when it is plain, else a slug and a short hash."""
    if re.fullmatch(r"[A-Za-z0-9._-]+", name):
        return f"{prefix}-{name}"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:40]
    return f"{prefix}-{slug}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _controller_link(name: str) -> Html:
    return _tag("a", name, href=f"#{_anchor('controller', name)}")


def _member_link(name: str) -> Html:
    return _tag("a", display_name(name), href=f"#{_anchor('member', name)}")


def _split_missing(entry: str) -> tuple[str, str]:
    """A ``missing`` entry as (GVR, reason)."""
    found = _MISSING.match(entry)
    return (found["gvr"], found["reason"]) if found else (entry, "")


def _waiting_gvrs(row: Mapping[str, Any]) -> list[str]:
    return [_split_missing(m)[0] for m in row.get("missing") or []] + list(row.get("not_synced") or [])


def _waiting_for(row: Mapping[str, Any], short: bool = False) -> Html:
    """What a waiting controller waits for: each missing GVR with its reason, then those still listing."""
    parts = []
    for entry in row.get("missing") or []:
        gvr, reason = _split_missing(entry)
        why, hint = _reason_and_hint(reason)
        parts.append(_join(["waits for ", _tag("code", gvr), ": " if why else "", why,
                            _join([" ", hint]) if hint and not short else ""]))
    if row.get("not_synced"):
        parts.append(_join(["still listing ", _join((_tag("code", g) for g in row["not_synced"]), ", ")]))
    return _join(parts, "; ")


def _reason_and_hint(reason: str) -> tuple[Html, Html]:
    """A reason, and its "did you mean" suggestion apart (``informers.discovery.not_served``'s form)."""
    why, sep, hint = reason.partition(_HINT)
    return _e(why), (_tag("span", f"did you mean {hint}", "hint") if sep else _e(""))


def _details(row: Mapping[str, Any]) -> Html:
    parts = []
    if row.get("missing") or row.get("not_synced"):
        parts.append(_tag("div", _waiting_for(row)))
    if row.get("last_error"):
        parts.append(_tag("pre", row["last_error"], "error"))
    if row.get("last_reconcile_error"):
        parts.append(_join([_tag("div", "last reconcile error:"), _tag("pre", row["last_reconcile_error"], "error")]))
    return _join(parts) or _e("-")


def _problem(m: Mapping[str, Any]) -> str:
    """What keeps a member from being ready: its first false condition (``syncer status``'s PROBLEM)."""
    for c in m.get("conditions", []):
        if c["status"] == "False":
            return f"{c['type']}: {c.get('message') or c.get('reason', '')}"
    return ""


def _condition(c: Mapping[str, Any]) -> Html:
    """A condition as a pill: its type, with a mark for its status (not by colour alone)."""
    mark = {"True": "✓", "False": "✗"}.get(c["status"], "?")
    return _pill(c["status"], label=f"{mark} {c['type']}",
                 title=f"{c['type']}: {c['status']}" + (f" ({c['message']})" if c.get("message") else ""))


def _clipped(text: str) -> Html:
    """An error cut to one line in a table, whole in its tooltip (and in the section the row links to)."""
    return _tag("span", text, "error clip", title=text)


def _figure(title: str, chart: Html, caption: str) -> Html:
    return _tag("figure", _join([_tag("figcaption", title), chart, _tag("div", caption, "muted")]))


def _count(total: int, errors: int) -> Html:
    return _join([total, " (", _tag("span", errors, "bad-text") if errors else "0", ")"])


def _num(value: float) -> str:
    return f"{value:.0f}" if value >= 100 or value == int(value) else f"{value:.2g}" if value < 1 else f"{value:.1f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{_num(value)}/s"


def _latency(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60}s" if seconds % 60 else f"{seconds // 60} min"
    if seconds < 86400 * 2:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400} days"


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at)) if at else "-"


_CSS = """
:root{color-scheme:light dark;--fg:#1b1f24;--muted:#667085;--bg:#fff;--panel:#f6f8fa;--line:#d8dee4;
--good:#1a7f37;--warn:#9a6700;--bad:#cf222e;--accent:#0969da}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--muted:#8d96a0;--bg:#0d1117;--panel:#161b22;
--line:#30363d;--good:#3fb950;--warn:#d29922;--bad:#f85149;--accent:#58a6ff}}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
color:var(--fg);background:var(--bg)}
header{padding:14px 24px 8px;border-bottom:1px solid var(--line);background:var(--panel)}
h1{font-size:20px;margin:0 0 6px}.identity{font-weight:400;color:var(--muted)}
h2{font-size:17px;margin:22px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:0 0 8px}
main{padding:0 24px 24px}nav{margin-top:6px}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
.facts{margin:0}.facts>*{margin-right:4px}
table{border-collapse:collapse;margin:6px 0 10px;width:100%}
th,td{text-align:left;padding:4px 10px 4px 0;border-bottom:1px solid var(--line);vertical-align:middle}
th{font-size:12px;color:var(--muted);font-weight:600;text-transform:uppercase;letter-spacing:.02em}
.pill{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600;border:1px solid;
white-space:nowrap}
.good{color:var(--good)}.warn{color:var(--warn)}.bad{color:var(--bad)}.muted{color:var(--muted)}
.plain{color:var(--fg)}.bad-text{color:var(--bad)}.nowrap,td>a{white-space:nowrap}
.error{color:var(--bad);overflow-wrap:anywhere}.clip{display:inline-block;max-width:18em;white-space:nowrap;
overflow:hidden;text-overflow:ellipsis;vertical-align:bottom}
pre.error{white-space:pre-wrap;margin:2px 0;font-size:12px}code{font-size:12px}
.hint{color:var(--accent);font-style:italic}
ul.attention{margin:6px 0;padding-left:20px}ul.attention li{margin:3px 0}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 14px;margin:10px 0;background:var(--panel)}
.card:target{outline:2px solid var(--accent)}
.charts{display:flex;gap:24px;flex-wrap:wrap}figure{margin:4px 0}figcaption{font-size:12px;font-weight:600}
svg.chart{vertical-align:middle;color:var(--accent)}svg.chart polyline{fill:none;stroke:currentColor;stroke-width:1.5}
svg.chart polygon{fill:currentColor;opacity:.15;stroke:none}svg.chart circle{fill:currentColor}
svg.chart text{font-size:10px;fill:var(--muted)}
details{margin:6px 0}summary{cursor:pointer;color:var(--muted)}.note{color:var(--muted);font-size:12px;margin:0}
footer{margin-top:24px;color:var(--muted);font-size:12px}
"""
