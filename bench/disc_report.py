"""Render the tables of RESULTS-discovery.md from the JSON files the three benchmarks write.

Usage: disc_report.py --discovery D.json --controller C.json --sidecar S.json  (prints Markdown on stdout)
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def ms(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.0f}"


def verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "n/a"
    return "met" if value <= limit else "**MISSED**"


def row(name: str, s: dict[str, Any], extra: str = "") -> str:
    if not s or not s.get("n"):
        return f"| {name} | 0 | - | - | - | - | - |{extra}"
    return (f"| {name} | {s['n']} | {ms(s['min'])} | {ms(s['p50'])} | {ms(s['p90'])} | {ms(s['p99'])} | "
            f"{ms(s['max'])} |{extra}")


HEAD = "| measure | n | min ms | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|---|"


def discovery(r: dict[str, Any]) -> str:
    out = []
    ab = r.get("ab")
    if ab:
        a = ab["a"]
        out.append("### (a) Established -> informer synced and subscriber notified\n")
        out.append(HEAD)
        out.append(row("Established -> first tick with the GVR in the synced dict", a["summary"]))
        passes = [x["passes"] for x in a["rows"]]
        out.append(f"\nFailed: {a['failed']}. Discovery passes per CRD: "
                   f"{ {p: passes.count(p) for p in sorted(set(passes))} } (passes: count of CRDs).")
        out.append(f"\nTargets: p50 <= 300 ms: {verdict(a['summary'].get('p50'), 300)}; "
                   f"p99 <= 1000 ms: {verdict(a['summary'].get('p99'), 1000)}.\n")
        for key, title in (("b_apply", "object created by server-side apply right after Established"),
                           ("b_post", "object POSTed right after Established (apiserver holds the create ~2 s)")):
            b = ab[key]
            out.append(f"### (b) ours vs kopf, {title}\n")
            out.append(HEAD)
            out.append(row("ours: Established -> handler sees the object", b["ours"]))
            out.append(row("kopf: Established -> handler sees the object", b["kopf"]))
            out.append(row("ours: Established -> informer synced + tick", b["ours_synced"]))
            out.append(row("kopf: Established -> watcher's initial list done", b["kopf_listed"]))
            out.append(row("object create request returned (after Established)", b["created_after"]))
            out.append(row("ours: create returned -> handler", b["ours_after_create"]))
            out.append(row("kopf: create returned -> handler", b["kopf_after_create"]))
            out.append(f"\nMissed within the per-CRD time-out: ours {b['ours_missed']}, kopf {b['kopf_missed']} "
                       f"(kopf groups missed: {[g for g, *_ in b.get('kopf_missed_groups', [])]}). "
                       f"Objects that ours received in the informer's initial list: {b['ours_initial_list']}. "
                       f"kopf event types seen: {b['kopf_event_types']}.\n")
        if ab.get("kopf_missed_at_end"):
            out.append(f"kopf's missed groups at the end of (b): {ab['kopf_missed_at_end']}\n")
    cd = r.get("cd")
    if cd:
        idle, base = cd.get("idle") or {}, cd.get("baseline") or {}
        n = idle.get("informers")
        out.append("### (c) idle informers\n")
        out.append("| measure | value |\n|---|---|")
        out.append(f"| CRD GVRs with a synced informer | {n} |")
        out.append(f"| RSS with 0 informers (factory started, after gc + malloc_trim) | "
                   f"{base.get('rss', 0) / 2**20:.1f} MiB |")
        out.append(f"| RSS with {n} informers, before the idle window | {idle['before']['rss'] / 2**20:.1f} MiB |")
        out.append(f"| RSS with {n} informers, after the idle window | {idle['after']['rss'] / 2**20:.1f} MiB |")
        out.append(f"| **RSS per informer** ((before - 0) / n) | **{cd['rss_per_informer_kib']:.0f} KiB** "
                   f"(without gc/trim: {cd['rss_raw_per_informer_kib']:.0f} KiB; after idle: "
                   f"{cd['rss_after_idle_per_informer_kib']:.0f} KiB) |")
        out.append(f"| **CPU over {idle['wall_s']:.0f} s idle** | **{idle['cpu_pct']:.2f} % of one core** "
                   f"({idle['cpu_s'] * 1000:.0f} ms CPU) |")
        out.append(f"| discovery passes during the idle window | {idle['passes_during']} |")
        out.append(f"| watch events during the idle window | {idle['watch_events']} |")
        out.append(f"| TCP connections to the apiserver (0 informers -> {n}) | {base['conns']['to_apiserver']} -> "
                   f"{idle['before']['conns']['to_apiserver']} |")
        out.append(f"| asyncio tasks (0 informers -> {n}) | {base.get('tasks')} -> {idle['before'].get('tasks')} |")
        out.append(f"| time to create the {n} CRDs / to sync all informers | {cd['crd_create_seconds']:.1f} s / "
                   f"{cd['all_synced']['after']:.1f} s after the baseline |")
        out.append(f"\nTargets: <= 100 KiB RSS per idle informer: {verdict(cd['rss_per_informer_kib'], 100)}; "
                   f"idle CPU < 2 %: {verdict(idle['cpu_pct'], 1.999)}.\n")
        pc = cd.get("pass_cost")
        if pc:
            out.append(f"### (d) one discovery pass with {pc['resources_served']} GVRs served\n")
            out.append("| call | run | requests | CPU ms | wall ms |\n|---|---|---|---|---|")
            for name, runs in (("f.discovery.discover()", pc["discover"]), ("whole factory pass", pc["whole_pass"])):
                for i, x in enumerate(runs):
                    out.append(f"| {name} | {i + 1} | {x['requests']} | {x['cpu_ms']:.1f} | {x['wall_ms']:.1f} |")
            out.append(f"\nf.last_pass.requests = {pc['last_pass_requests']}; aggregated discovery document sizes "
                       f"(decoded): /api {pc['response_bytes']['/api']} B, /apis {pc['response_bytes']['/apis']} B.\n")
    return "\n".join(out)


def controller(r: dict[str, Any]) -> str:
    run = r["run"]
    out = ["| variant | measure | n | min ms | p50 ms | p90 ms | p99 ms | max ms |",
           "|---|---|---|---|---|---|---|---|"]
    for v, title in (("apply", "server-side apply"), ("post", "POST (2 s apiserver hold)")):
        x = run[v]
        for key, name in (("first_reconcile", "Established -> first reconcile"),
                          ("controller_started", "Established -> controller started"),
                          ("object_created", "Established -> object create returned"),
                          ("reconcile_after_create", "create returned -> first reconcile")):
            s = x[key]
            if s.get("n"):
                out.append(f"| {title} | {name} | {s['n']} | {ms(s['min'])} | {ms(s['p50'])} | {ms(s['p90'])} | "
                           f"{ms(s['p99'])} | {ms(s['max'])} |")
        out.append(f"| {title} | failed (no reconcile within the time-out) | {x['failed']} | | | | | |")
    a = run["apply"]["first_reconcile"]
    p = run["post"]["first_reconcile"]
    out.append(f"\nTargets (Established -> first reconcile): p50 <= 500 ms / p99 <= 1500 ms: server-side apply "
               f"{verdict(a.get('p50'), 500)} / {verdict(a.get('p99'), 1500)}; POST {verdict(p.get('p50'), 500)} / "
               f"{verdict(p.get('p99'), 1500)}.\n")
    out.append(f"Controllers registered {run['controllers_registered']}, states at the end "
               f"{run['controller_states_at_end']}, manager passes {run['manager_passes']}, factory passes "
               f"{run['factory_passes']}, reconciles {run['reconciles_total']}, controller failures "
               f"{run['failures'] or 'none'}, manager.stop() {run['manager_stop_seconds'] * 1000:.0f} ms.")
    return "\n".join(out)


def sidecar(r: dict[str, Any]) -> str:
    s = r["summary"]
    out = ["| measure | value |", "|---|---|"]
    out.append(f"| runs (ready) | {s['runs']} ({s['ready_runs']}) |")
    out.append(f"| **process start -> /readyz 200, median** | **{s['ready_s']['median'] * 1000:.0f} ms** "
               f"(all: {', '.join(f'{x * 1000:.0f}' for x in s['ready_s']['all'])} ms) |")
    out.append(f"| process start -> first HTTP answer, median | {s['http_up_s_median'] * 1000:.0f} ms |")
    out.append(f"| ready -> both controllers running (/status), median | "
               f"{s['controllers_running_after_ready_s_median'] * 1000:.0f} ms |")
    out.append(f"| RSS at ready, median | {s['rss_at_ready_mib_median']:.1f} MiB |")
    out.append(f"| **RSS 20 s after ready, median** | **{s['rss_idle_mib']['median']:.1f} MiB** "
               f"(all: {', '.join(f'{x:.1f}' for x in s['rss_idle_mib']['all'])}) |")
    out.append(f"| USS 20 s after ready, median | {s['uss_idle_mib_median']:.1f} MiB |")
    out.append(f"| CPU while idle (ready+controllers -> +20 s), median | {s['idle_cpu_pct_median']:.2f} % of one core |")
    out.append(f"| TCP connections to the apiserver when idle | "
               f"{sorted({c['to_apiserver'] for c in s['tcp_to_apiserver'] if c})} |")
    out.append(f"| SIGTERM -> exit code | {s['exit_codes']} |")
    out.append(f"| SIGTERM -> process gone, median (max) | {s['shutdown_s']['median'] * 1000:.0f} ms "
               f"({s['shutdown_s']['max'] * 1000:.0f} ms) |")
    out.append(f"| ERROR lines in the sidecar logs | {len(s['log_errors'])} |")
    out.append(f"| WARNING lines in the sidecar logs | {len(s['log_warnings'])} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--discovery")
    p.add_argument("--controller")
    p.add_argument("--sidecar")
    a = p.parse_args()
    for path, fn in ((a.discovery, discovery), (a.controller, controller), (a.sidecar, sidecar)):
        if path:
            r = json.load(open(path))
            print(f"<!-- from {path}: {r['env']['date']}, {r['env']['cpus']} CPUs, {r['machine_note']}, "
                  f"wall {r['wall_seconds']:.0f} s -->")
            print(fn(r))
            print()


if __name__ == "__main__":
    main()
