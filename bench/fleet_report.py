"""Markdown tables from the JSON of the issue 23 benchmarks, each headed by the commands that produced it.

    .venv/bin/python bench/fleet_report.py fleet [bench/out/fleet.json] [--out bench/RESULTS-fleet.md]
    .venv/bin/python bench/fleet_report.py transport [--transport bench/out/transport.json] \
        [--deadconn bench/out/deadconn.json] [--out bench/RESULTS-transport.md]

``--label TEXT`` puts a line under the title (e.g. "DRY RUN"); a fleet run below 50 members or 300 s of idle,
a transport run below 20,000 events or a dead-connection run below 50 watches is labelled a dry run anyway.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
CONTENDERS = ("ours", "client-go")
DRY = ("**DRY RUN at small size: checks that the harness works for both contenders; these are not the "
       "measurement.** Shared 2-core machine with other sessions' tests running.")

# (key, label, format, target): per-size figures of each contender, ratio ours / client-go.
FLEET_ROWS = [
    ("conn_per_member", "TCP connections per member, 5 s after all synced", ".2f", "1 (= client-go)"),
    ("conn_end_per_member", "TCP connections per member, end of the idle", ".2f", "1 (= client-go)"),
    ("conn_idle_max_per_member", "TCP connections per member, most seen while idle", ".2f", ""),
    ("rss_per_member_kib", "RSS per member after sync, KiB", ",.0f", "≤ 1.0× client-go"),
    ("rss_end_per_member_kib", "RSS per member after the idle, KiB", ",.0f", "≤ 1.0× client-go"),
    ("idle_cpu_pct", "idle CPU, whole process, % of a core", ".3f", "≤ 2× client-go; < 1 % at 500"),
    ("idle_cpu_pct_per_member", "idle CPU per member, % of a core", ".5f", ""),
    ("all_synced_s", "time from the first Secret to all synced, s", ".2f", "≤ 1.0× client-go"),
    ("all_reconciled_s", "time from the first Secret to all first-reconciled, s", ".2f", ""),
    ("sync_cpu_s", "CPU to bring all up, s", ".2f", "≤ 1.0× client-go"),
    ("base_rss_mib", "start-up RSS with 0 members, MiB", ".1f", "≤ 40 MiB"),
    ("rss_mib", "RSS after sync, MiB", ".1f", ""),
    ("rss_end_mib", "RSS after the idle, MiB", ".1f", ""),
]
# (key, label, format): the growth between consecutive sizes, per added member.
CURVE_ROWS = [
    ("rss_mib", "RSS after sync, KiB per added member", ",.0f", 1024),
    ("rss_end_mib", "RSS after the idle, KiB per added member", ",.0f", 1024),
    ("conn", "TCP connections after sync, per added member", ".2f", 1),
    ("conn_end", "TCP connections at the end of the idle, per added member", ".2f", 1),
    ("idle_cpu_pct", "idle CPU, % of a core per added member", ".5f", 1),
    ("all_synced_s", "time to all synced, ms per added member", ".2f", 1000),
    ("sync_cpu_s", "CPU to bring all up, ms per added member", ".2f", 1000),
]


def fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "n/a"
    if b == 0:
        return "∞" if a else "1.00"
    return f"{a / b:.2f}"


FULL_RUN = {
    "fleet": ["# about 25 minutes: 3 sizes x (300 s idle + bring-up and teardown)",
              ".venv/bin/python bench/fleet_bench.py --clusters 50,200,500 --idle 300",
              ".venv/bin/python bench/fleet_report.py fleet"],
    "transport": ["# about 13 minutes with HTTP/2 available (6 cases x 2 reps x ~60 s), 7 without;",
                  "# then about 2 minutes",
                  ".venv/bin/python bench/transport_bench.py",
                  ".venv/bin/python bench/deadconn_bench.py",
                  ".venv/bin/python bench/fleet_report.py transport"],
}


def header(title: str, which: str, commands: list[str], label: str | None, dry: bool,
           extra: list[str]) -> list[str]:
    report = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/fleet_report.py", *sys.argv[1:]])
    lines = [f"# {title}", ""]
    if label or dry:
        lines += [label or DRY, ""]
    if dry:
        lines += ["The measurement run, from a quiet machine:", "", "```sh", *FULL_RUN[which], "```", ""]
    lines += ["Commands of this run (from the repository root; the JSON goes to the git-ignored bench/out/):", "",
              "```sh", *commands, report, "```", "", *extra]
    return lines


def machine(d: dict[str, Any]) -> str:
    m = d.get("machine", {})
    return (f"Run {d.get('started', '?')} – {d.get('finished', '?')}; {m.get('cpus')} CPUs, Python "
            f"{m.get('python')}, {m.get('platform')}; load average at the end "
            f"{', '.join(f'{x:.1f}' for x in m.get('load_avg', []))}.")


# -- fleet -----------------------------------------------------------------------------------------------
def fleet(d: dict[str, Any], label: str | None) -> str:
    sizes = sorted(d["sizes"], key=int)
    a = d["args"]
    dry = int(sizes[-1]) < 50 or a["idle"] < 300
    lines = header("Fleet scale: ours vs client-go at " + ", ".join(sizes) + " members (issue 23)",
                   "fleet", [d["command"]], label, dry, [machine(d), ""])
    lines += [
        f"Apiserver flags raised: `{' '.join(d['apiserver_flags'])}` (defaults 400 and 200); "
        f"`--http2-max-streams-per-connection` at its default of 100. File limit of the contenders: "
        f"{d['fd_limit']}. Members over {a['apiservers']} workload apiserver(s). Idle window "
        f"{a['idle']:.0f} s, both contenders idle at once (CPU resolution one 10 ms clock tick: "
        f"{1 / a['idle']:.4f} % of a core); connections sampled every {a['sample']:.0f} s. "
        "One round per size, a fresh process per contender; order of bring-up per size: "
        + "; ".join(f"{n}: {' then '.join(d['sizes'][n]['order'])}" for n in sizes) + ".", "",
        "What runs (see bench/multicluster_bench.py and bench/RESULTS-multicluster.md): **ours** is "
        "`ClusterRegistry` + `ClusterControllers` as `syncer run` sets them up with default settings (member "
        "discovery, the per-cluster controller `for_(configmaps).watches(secrets).watches(widgets)`, 2 workers, "
        "its default transport: " + ("the ApiClient's default, which has an `http2` setting" if d.get(
            "client_has_http2_setting") else "HTTP/1.1 aiohttp, the ApiClient having no `http2` setting yet")
        + "); **client-go** is bench/clientgo_multicluster (v0.36.3), a DynamicSharedInformerFactory per member "
        "on the same three GVRs, its own transport per member. Every member is a kubeconfig Secret on a "
        "management plane pointing at the workload plane(s); each member is its own client on both sides, as "
        "with separate API servers. Measured from outside with psutil: RSS, user+sys CPU of all threads, "
        "ESTABLISHED TCP connections; per-member figures are (value − the 0-member start-up value) / members.",
        "", "Each cell: ours / client-go (ratio ours / client-go).", "",
        "| measure | target | " + " | ".join(f"{n} members" for n in sizes) + " |",
        "|---|---|" + "---:|" * len(sizes)]
    for key, text, spec, target in FLEET_ROWS:
        cells = []
        for n in sizes:
            o, g = (d["sizes"][n][c].get(key) for c in CONTENDERS)
            cells.append(f"{fmt(o, spec)} / {fmt(g, spec)} ({ratio(o, g)})")
        lines.append(f"| {text} | {target} | " + " | ".join(cells) + " |")
    lines.append("| apiserver+etcd CPU during the idle, % of a core (both contenders connected) | | "
                 + " | ".join(fmt(d["sizes"][n].get("server_idle_cpu_pct"), ".2f") for n in sizes) + " |")
    if len(sizes) > 1:
        steps = list(zip(sizes, sizes[1:]))
        lines += ["", "### The curve: cost per added member between sizes", "",
                  "Each cell: ours / client-go (ratio).", "",
                  "| measure | " + " | ".join(f"{x} → {y}" for x, y in steps) + " |", "|---|" + "---:|" * len(steps)]
        for key, text, spec, scale in CURVE_ROWS:
            cells = []
            for x, y in steps:
                o, g = ((d["sizes"][y][c][key] - d["sizes"][x][c][key]) / (int(y) - int(x)) * scale
                        for c in CONTENDERS)
                cells.append(f"{fmt(o, spec)} / {fmt(g, spec)} ({ratio(o, g)})")
            lines.append(f"| {text} | " + " | ".join(cells) + " |")
    top = d["sizes"][sizes[-1]]
    o, g = top["ours"], top["client-go"]
    checks: list[tuple[str, bool | None, str]] = [
        ("TCP connections per member = 1", o["conn_end_per_member"] <= 1.0 + 1e-9,
         f"{o['conn_end_per_member']:.2f} at the end of the idle"),
        ("RSS per member after sync ≤ 1.0× client-go", o["rss_per_member_kib"] <= g["rss_per_member_kib"],
         f"{ratio(o['rss_per_member_kib'], g['rss_per_member_kib'])}×"),
        ("RSS per member after the idle ≤ 1.0× client-go",
         o["rss_end_per_member_kib"] <= g["rss_end_per_member_kib"],
         f"{ratio(o['rss_end_per_member_kib'], g['rss_end_per_member_kib'])}×"),
        ("idle CPU ≤ 2× client-go", o["idle_cpu_pct"] <= 2 * g["idle_cpu_pct"],
         f"{ratio(o['idle_cpu_pct'], g['idle_cpu_pct'])}×"),
        ("idle CPU < 1 % of a core at 500 members", o["idle_cpu_pct"] < 1.0 if int(sizes[-1]) >= 500 else None,
         f"{o['idle_cpu_pct']:.3f} % at {sizes[-1]}"),
        ("time to all synced ≤ 1.0× client-go", o["all_synced_s"] <= g["all_synced_s"],
         f"{ratio(o['all_synced_s'], g['all_synced_s'])}×"),
        ("CPU to bring all up ≤ 1.0× client-go", o["sync_cpu_s"] <= g["sync_cpu_s"],
         f"{ratio(o['sync_cpu_s'], g['sync_cpu_s'])}×"),
        ("start-up RSS ≤ 40 MiB", max(d["sizes"][n]["ours"]["base_rss_mib"] for n in sizes) <= 40,
         f"{max(d['sizes'][n]['ours']['base_rss_mib'] for n in sizes):.1f} MiB (largest of the rounds)"),
    ]
    lines += ["", f"### Targets at {sizes[-1]} members", "", "| target | measured | met? |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'not measured' if ok is None else 'met' if ok else '**missed**'} |"
              for t, ok, m in checks]
    return "\n".join(lines) + "\n"


# -- transport -------------------------------------------------------------------------------------------
SINGLE_CLUSTER = (
    "Single-cluster reference (bench/RESULTS.md, `bench/informer_bench.py`, 20,000 patches at 350/s, asyncio "
    "loop): CPU s per 10k update events **ours 2.21** (2.05 in the follow-up run after 83a4b7d), "
    "**watch-floor 1.80** (a bare `ApiClient.stream` watch: the row to compare with 1 stream over HTTP/1.1 "
    "below), client-go 3.18. Rerun it side by side with:\n\n"
    "```sh\n.venv/bin/python bench/informer_bench.py --sizes 10000 --reps 1 --update-reps 2 \\\n"
    "    --contenders ours,watch-floor,client-go\n```\n")


def transport(t: dict[str, Any] | None, dc: dict[str, Any] | None, label: str | None) -> str:
    commands = [x["command"] for x in (t, dc) if x]
    dry = bool((t and t["args"]["updates"] < 20000) or (dc and dc["args"]["watches"] < 50))
    lines = header("Transport: CPU per watch event by streams, and a dead connection under 50 watches (issue 23)",
                   "transport", commands, label, dry, [])
    if t:
        modes = sorted({r["transport"] for r in t["runs"]}, key=lambda x: ("2" in x, x))
        streams = sorted({r["streams"] for r in t["runs"]})
        a = t["args"]
        lines += ["## Client CPU per watch event through `ApiClient.stream`", "", machine(t), "",
                  f"{a['updates']:,} update events per measurement, writer at "
                  f"{a['rate'] or 'unthrottled'} patches/s, {a['objects']} ConfigMaps, {a['reps']} rep(s), "
                  f"runner loop {a['loop']}; apiserver `{' '.join(t['apiserver_flags'])}`. CPU is the runner's "
                  "user+sys from \"go\" to its last event; median over reps.", "",
                  "| streams | " + " | ".join(f"{m}: CPU s / 10k events | p50 / p99 ms" for m in modes)
                  + (" | HTTP/2 / HTTP/1.1 |" if len(modes) == 2 else " |"),
                  "|---:|" + "---:|---:|" * len(modes) + ("---:|" if len(modes) == 2 else "")]
        for s in streams:
            cells, cpu = [], []
            for m in modes:
                runs = [r for r in t["runs"] if r["streams"] == s and r["transport"] == m and r.get("cpu_per_10k")]
                med = next((x["cpu_per_10k"] for x in t["medians"] if x["streams"] == s and x["transport"] == m),
                           None)
                cpu.append(med)
                lat = (f"{runs[0]['lat_p50'] * 1e3:.1f} / {runs[0]['lat_p99'] * 1e3:.1f}" if runs else "n/a")
                cells += [fmt(med, ".2f"), lat]
            row = f"| {s} | " + " | ".join(cells) + " |"
            if len(modes) == 2:
                row += f" {ratio(cpu[1], cpu[0])} |"
            lines.append(row)
        failed = [r for r in t["runs"] if r.get("error") or r.get("timed_out")]
        if failed:
            lines += ["", "**Not complete** (the runner's notes are in the JSON): " + "; ".join(
                f"{r['streams']} streams {r['transport']}: "
                + (r.get("error") or f"{r.get('events')} of {r['updates']} events before the cap")
                for r in failed)]
        notes = [n["note"] for r in t["runs"] for n in r.get("notes", []) if n.get("event") == "note"]
        if notes:
            lines += ["", f"Stream notes ({len(notes)}): " + "; ".join(notes[:10])]
        lines += ["", SINGLE_CLUSTER]
    if dc:
        a = dc["args"]
        lines += ["## A dead connection: 50 watches through a proxy that cuts them", "", machine(dc), "",
                  f"{a['watches']} ConfigMap informers (one namespace each, {a['objects']} objects each) on one "
                  f"ApiClient through a loopback proxy; a direct writer at {a['rate']:.0f} requests/s (a tenth of "
                  f"them delete + create); fault `{a['fault']}`, {a['cuts']} cuts {a['between']:.0f} s apart. "
                  "*reopen*: the watch answered again after the cut; *event*: the handler got an object written "
                  "after the cut (resolution: one writer period per namespace). Divergent: objects whose name "
                  "or resourceVersion differ between the caches and a fresh LIST once the writer stopped "
                  f"(allowed {a['settle']:.0f} s to catch up). Target: every watch within 2 s, 0 divergent.", "",
                  "| transport | connections through the proxy | watches × cuts recovered | within 2 s | reopen p50 / "
                  "max s | event p50 / p99 / max s | divergent | caught up in s | met? |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in dc["modes"]:
            total = sum(c["watches"] for c in m["cuts"])
            got = sum(c["recovered"] for c in m["cuts"])
            within = sum(c["within_2s"] for c in m["cuts"])
            reopen = sorted(x for c in m["cuts"] for x in c["reopen_s"] if x is not None)
            conns = "/".join(str(c["connections_before"]) for c in m["cuts"])
            ok = within == total and m["divergent"] == 0
            lines.append(
                f"| {m['transport']} | {conns} | {got}/{total} | {within}/{total} | "
                f"{fmt(reopen[len(reopen) // 2] if reopen else None, '.2f')} / {fmt(m['reopen_max_s'], '.2f')} | "
                f"{fmt(m['event_p50_s'], '.2f')} / {fmt(m['event_p99_s'], '.2f')} / {fmt(m['event_max_s'], '.2f')} | "
                f"{m['divergent']} | {m['settle_s']:.2f} | {'met' if ok else '**missed**'} |")
        lines += ["", "Per cut (a later cut can find the reflectors' backoff still grown from the one before):", "",
                  "| transport | cut | connections before | recovered | within 2 s | reopen p50 / max s | "
                  "event p50 / max s |", "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {m['transport']} | {c['cut'] + 1} | {c['connections_before']} | {c['recovered']}/{c['watches']} "
                  f"| {c['within_2s']}/{c['watches']} "
                  f"| {fmt(c['reopen_p50_s'], '.2f')} / {fmt(c['reopen_max_s'], '.2f')} "
                  f"| {fmt(c['event_p50_s'], '.2f')} / {fmt(c['event_max_s'], '.2f')} |"
                  for m in dc["modes"] for c in m["cuts"]]
    return "\n".join(lines) + "\n"


def load(path: str | None, what: str) -> dict[str, Any] | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"{what}: no such file {p} (run the benchmark first, or point at its --json)")
    try:
        data: dict[str, Any] = json.loads(p.read_text())
    except ValueError as e:
        raise SystemExit(f"{what}: {p} is not JSON: {e}") from None
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="which", required=True)
    f = sub.add_parser("fleet", help="bench/fleet_bench.py's JSON -> RESULTS-fleet.md")
    f.add_argument("json", nargs="?", default=str(OUT / "fleet.json"))
    f.add_argument("--out", default=str(BENCH / "RESULTS-fleet.md"))
    t = sub.add_parser("transport", help="transport_bench.py's and deadconn_bench.py's JSON -> RESULTS-transport.md")
    t.add_argument("--transport", default=str(OUT / "transport.json"), help="'' to leave it out")
    t.add_argument("--deadconn", default=str(OUT / "deadconn.json"), help="'' to leave it out")
    t.add_argument("--out", default=str(BENCH / "RESULTS-transport.md"))
    for s in (f, t):
        s.add_argument("--label", help="a line under the title (default: a dry-run note when the run was small)")
    args = p.parse_args()
    if args.which == "fleet":
        data = load(args.json, "fleet")
        assert data is not None
        text = fleet(data, args.label)
    else:
        tr, dc = load(args.transport or None, "--transport"), load(args.deadconn or None, "--deadconn")
        if tr is None and dc is None:
            p.error("transport: give --transport or --deadconn")
        text = transport(tr, dc, args.label)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
