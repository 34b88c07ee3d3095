"""``syncer status``: a running sidecar's ``/status`` document as tables."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from controllers.cluster import display_name

from ..settings import SETTINGS_ENV, Settings, UnitKind, env_var, origin_of
from .common import print_table, settings_of

_UNIT_HEADERS = {UnitKind.CLUSTERS: "CLUSTER UNIT", UnitKind.CONTROLLERS: "CONTROLLER UNIT"}


def cmd_status(args: argparse.Namespace) -> int:
    """``syncer status``: the ``/status`` of the sidecar at ``--url`` or at the settings' ``http_bind``; with
    ``--open``, the URL of its page instead (the same address: a browser gets the page)."""
    url, origin = args.url, "--url"
    if not url:
        settings = settings_of(args)
        host, _, port = settings.http_bind.rpartition(":")
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}/status"
        origin = _http_bind_origin(settings)
    if args.open:
        return _page_url(url, origin)
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc = json.load(resp)
        warm = doc.get("warm_standby") or []
        election = (f"leader={doc['leader']}  lease holder={doc.get('lease_holder') or '-'}  "
                    f"warm standby={len(warm)} GVR{'s' if len(warm) != 1 else ''}"
                    if doc.get("leader_election") else "leader election off")
        header = f"identity {doc['identity']}  ready={doc['ready']}  {election}\n"
        controllers = [(c["name"], c["state"], str(c.get("restarts", 0)), str(c.get("reconcile_errors", 0)),
                        ",".join(c.get("missing", []) + c.get("not_synced", [])),
                        c.get("last_error") or c.get("last_reconcile_error") or "")
                       for c in doc["controllers"]]
        gvrs = [(g["gvr"], g["state"], g["source"], g["reason"]) for g in doc["gvrs"] if g["state"] != "excluded"]
        troubled = [(t["name"], t["state"] + (" (wedged)" if t.get("wedged") else ""), str(t["restarts"]),
                     t["last_error"]) for t in doc.get("tasks", []) if t["last_error"] or not t["healthy"]]
        fleet = _fleet_tables(doc["clusters"]) if doc.get("clusters") is not None else []
        fleet += _shard_tables(doc["sharding"]) if doc.get("sharding") is not None else []
        fleet += [_webhook_table(doc["webhooks"])] if doc.get("webhooks") else []
    except (urllib.error.URLError, OSError) as e:
        print(f"error: no syncer answering at {url} ({origin}): {e}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError) as e:  # something else answers there
        print(f"error: {url} did not answer with a syncer status ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    print(header)
    print_table([("CONTROLLER", "STATE", "RESTARTS", "ERRORS", "WAITING FOR", "LAST ERROR"), *controllers])
    print()
    print_table([("GVR", "STATE", "SOURCE", "REASON"), *gvrs])
    for rows in fleet:
        print()
        print_table(rows)
    if troubled:
        print()
        print_table([("BACKGROUND TASK", "STATE", "RESTARTS", "LAST ERROR"), *troubled])
    return 0


def _page_url(url: str, origin: str) -> int:
    """Print ``url`` once the sidecar there answers it with its page (asked as a browser asks)."""
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            page = resp.headers.get_content_type() == "text/html"
    except (urllib.error.URLError, OSError) as e:
        print(f"error: no syncer answering at {url} ({origin}): {e}", file=sys.stderr)
        return 1
    if not page:
        print(f"error: {url} did not answer with a status page (an older syncer, or something else)",
              file=sys.stderr)
        return 1
    print(url)
    return 0


def _http_bind_origin(settings: Settings) -> str:
    """Where the address ``status`` asks came from, so that a user whose sidecar runs elsewhere sees why."""
    origin = origin_of("http_bind", settings.source or None)
    if origin:
        return f"http_bind from {origin}"
    where = f"the settings file {settings.source!r} does not set it" if settings.source else "no settings file"
    return (f"http_bind's default: {where}, nor {env_var('http_bind')}; give `status` the settings `run` was "
            f"given (--settings or ${SETTINGS_ENV}, and the environment), or --url")


def _fleet_tables(doc: dict[str, Any]) -> list[list[tuple[str, ...]]]:
    """The multi-cluster part of ``syncer status``: the members, then the conflicts and the fleet controllers
    (those two only when there are any)."""
    tables: list[list[tuple[str, ...]]] = [[("CLUSTER", "STATE", "READY", "SOURCE", "PROBLEM")] + [
        (c["display_name"], c["state"], "yes" if c["ready"] else "no", c["source"], _problem(c))
        for c in doc["clusters"]]]
    if doc["conflicts"]:
        # A Secret's claim is shown by the Secret's key alone; other claims by their own key.
        tables.append([("CONFLICTING CLAIM", "IGNORED BECAUSE")] + [(c.get("secret") or c["claim"], c["message"])
                                                                    for c in doc["conflicts"]])
    if doc.get("fleet_controllers"):
        tables.append([("FLEET CONTROLLER", "GVR", "CLUSTERS", "RECONCILES", "ERRORS", "LAST ERROR")] + [
            (f["name"], f["gvr"], ",".join(display_name(n) for n in f["clusters"]) or "-", str(f["reconciles"]),
             str(f["reconcile_errors"]), f.get("last_reconcile_error") or "") for f in doc["fleet_controllers"]])
    return tables


def _shard_tables(doc: dict[str, Any]) -> list[list[tuple[str, ...]]]:
    """The sharding part of ``syncer status``: the live members, then every unit with its state here, the holder
    of its bucket's Lease and the member the assignment gives it (and its bucket, when units are bucketed)."""
    owned = {d["identity"]: 0 for d in doc["members"]}
    for u in doc["units"]:
        if u["holder"] in owned:
            owned[u["holder"]] += 1
    members = [("SHARD MEMBER", "UNITS HELD")] + [
        (f"{m}{' (this replica)' if m == doc['identity'] else ''}", str(n)) for m, n in owned.items()]
    kind = UnitKind(doc["kind"])
    bucketed = bool(doc.get("bucket_count"))
    units = [(_UNIT_HEADERS[kind], *(("BUCKET",) if bucketed else ()), "STATE HERE", "LEASE HOLDER", "TRANSITIONS",
              "ASSIGNED TO")] + [
        (display_name(u["unit"]) if kind is UnitKind.CLUSTERS else u["unit"],
         *((u.get("bucket", "-"),) if bucketed else ()), u["state"], u["holder"] or "-",
         "-" if u["transitions"] is None else str(u["transitions"]), u["assigned"] or "-") for u in doc["units"]]
    tables = [members, units]
    if doc.get("stuck"):
        tables.append([("STUCK CONTROLLER (lease kept)",)] + [(n,) for n in doc["stuck"]])
    return tables


def _webhook_table(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """The webhook part of ``syncer status``: each webhook's requests, how they were answered, and latency; a CRD
    conversion's converted reviews are in ALLOWED."""
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f}ms"

    return [("WEBHOOK", "KIND", "REQUESTS", "ALLOWED", "DENIED", "ERRORS", "MEAN", "MAX")] + [
        (w["name"], w["kind"], str(w["requests"]), str(w["allowed"]), str(w["denied"]), str(w["errors"]),
         ms(w["latency_seconds"]["mean"]), ms(w["latency_seconds"]["max"])) for w in doc["webhooks"]] + [
        (c["crd"], "conversion", str(c["requests"]), str(c["converted"]), "-", str(c["errors"]),
         ms(c["latency_seconds"]["mean"]), ms(c["latency_seconds"]["max"])) for c in doc.get("conversions", [])]


def _problem(cluster: dict[str, Any]) -> str:
    """What keeps a member from being ready: its first false condition, as ``Type: message``."""
    for c in cluster["conditions"]:
        if c["status"] == "False":
            return f"{c['type']}: {c['message'] or c['reason']}"
    return ""
