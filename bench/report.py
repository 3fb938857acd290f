#!/usr/bin/env python3
"""Writes the markdown table and the combined SVG plot of bench/compare.sh,
bench/http-compare.sh and bench/transports.sh from `cobalt bench --json` outputs
(standard library only). With --baseline LABEL the table adds each row's req/s and
server CPU µs/req relative to that run's row with the same client count. A label that
appears more than once in the manifest (repetitions) is reported as the median of its
runs per client count, with lost and errors summed over them.

The manifest is a TSV file, one server a line:
  LABEL<TAB>ok<TAB>path/to/bench.json<TAB>description
  LABEL<TAB>skipped<TAB>reason<TAB>description
"""

import argparse
import datetime
import html
import json
import math
import statistics

# Below this server CPU %, a row is marked as limited by something other than the server.
BUSY_PERCENT = 70

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def load(manifest):
    runs, skipped = [], []
    with open(manifest, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            label, status, value = parts[0], parts[1], parts[2]
            desc = parts[3] if len(parts) > 3 else ""
            if status == "ok":
                with open(value, encoding="utf-8") as j:
                    runs.append((label, desc, json.load(j)))
            else:
                skipped.append((label, desc, value))
    return merge_repetitions(runs), skipped


# Step fields summed over repetitions; every other number is the median.
SUMMED = ("sent", "completed", "non_2xx", "lost", "errors", "resets")


def merge_repetitions(runs):
    """One run per label: repeated labels become the per-client-count median."""
    by_label = {}
    for label, desc, data in runs:
        by_label.setdefault(label, (desc, []))[1].append(data)
    merged = []
    for label, (desc, datas) in by_label.items():
        if len(datas) == 1:
            merged.append((label, desc, datas[0]))
            continue
        steps = {}
        for data in datas:
            for st in data.get("steps", []):
                steps.setdefault(st["clients"], []).append(st)
        out = []
        for clients in sorted(steps):
            group = steps[clients]
            step = {"clients": clients, "repetitions": len(group)}
            for key in group[0]:
                values = [g.get(key) for g in group]
                if key in step:
                    continue
                if key in SUMMED:
                    step[key] = sum(v or 0 for v in values)
                elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                    step[key] = statistics.median(values)
                else:
                    step[key] = values[0]
            out.append(step)
        merged.append((label, f"{desc} (median of {len(datas)} runs)", dict(datas[0], steps=out)))
    return merged


def fmt(value, spec, missing="–"):
    return missing if value is None else format(value, spec)


def markdown(args, runs, skipped):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# {args.title}", ""]
    out.append(f"- Date: {now}")
    out.append(f"- Command: `{args.command}`")
    out.append(f"- Setup: {args.setup}")
    out.append(f"- Machine: {args.machine}")
    out.append(
        "- **Caveat: a shared, noisy machine** (other builds and benchmarks may run at the "
        "same time, and the load generator shares the host with the server), so take the "
        "numbers as rough relative indications, not as reference results."
    )
    if args.svg:
        out.append(f"- Plot: [{args.svg_name}]({args.svg_name}) (req/s and server CPU µs/request per server)")
    out.append("")
    base = baseline_steps(runs, args.baseline)
    ratio_head = f" req/s ÷ {args.baseline} | CPU/req ÷ {args.baseline} |" if base is not None else ""
    out.append(
        f"| {args.label_header} | clients | req/s | p50 latency (ms) | p99 latency (ms) | "
        f"server CPU µs/req | server CPU % | RSS (MiB) | non-2.xx | lost | errors | bench CPU % |{ratio_head}"
    )
    out.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|" + ("--:|--:|" if base is not None else ""))
    starred = False
    for label, _desc, data in runs:
        for s in data.get("steps", []):
            ratios = ""
            if base is not None:
                b = base.get(s["clients"], {})
                ratios = " {} | {} |".format(
                    ratio(s.get("requests_per_s"), b.get("requests_per_s")),
                    ratio(s.get("server_cpu_us_per_req"), b.get("server_cpu_us_per_req")),
                )
            rss = s.get("server_rss_kb")
            rps = fmt(s.get("requests_per_s"), ",.0f")
            cpu_pct = s.get("server_cpu_percent")
            if cpu_pct is not None and cpu_pct < BUSY_PERCENT:
                rps += " *"
                starred = True
            out.append(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{}".format(
                    label,
                    s["clients"],
                    rps,
                    fmt(None if s.get("p50_us") is None else s["p50_us"] / 1000, ".3f"),
                    fmt(None if s.get("p99_us") is None else s["p99_us"] / 1000, ".3f"),
                    fmt(s.get("server_cpu_us_per_req"), ".1f"),
                    fmt(s.get("server_cpu_percent"), ".0f"),
                    fmt(None if rss is None else rss / 1024, ".1f"),
                    s.get("non_2xx", 0),
                    s.get("lost", 0),
                    s.get("errors", 0) + s.get("resets", 0),
                    fmt(s.get("client_cpu_percent"), ".0f"),
                    ratios,
                )
            )
    if starred:
        out.append("")
        out.append(
            f"\\* The server used less than {BUSY_PERCENT}% of its CPU: the load generator (one "
            "thread on one core) or other load on the shared machine limited this row, so its "
            "req/s understates the server; compare CPU µs/req instead."
        )
    out.append("")
    out.append(
        "*req/s* counts 2.xx answers only; *non-2.xx* counts the other answers (e.g. 5.03 "
        "from an overloaded server), which are never counted as completed."
    )
    out.append("")
    out.append(
        "*bench CPU %* is the load generator's own CPU use over the measured window "
        "(100 = one core busy; with `--threads 1` it cannot go faster at 100)."
    )
    out.append("")
    out.append(f"{args.label_header.capitalize()}s:")
    out.append("")
    for label, desc, _ in runs:
        out.append(f"- **{label}**: {desc}")
    if skipped:
        out.append("")
        out.append("Skipped:")
        out.append("")
        for label, desc, reason in skipped:
            out.append(f"- **{label}** ({desc}): {reason}")
    out.append("")
    return "\n".join(out)


def baseline_steps(runs, label):
    """The baseline run's steps by client count, or None without --baseline."""
    if not label:
        return None
    for run_label, _desc, data in runs:
        if run_label == label:
            return {s["clients"]: s for s in data.get("steps", [])}
    return {}


def ratio(value, base):
    return "–" if not value or not base else f"{value / base:.2f}×"


def log_ticks(lo, hi):
    lo_e = math.floor(math.log10(lo))
    hi_e = math.ceil(math.log10(hi))
    if hi_e == lo_e:
        hi_e += 1
    return lo_e, hi_e


def panel(x0, y0, w, h, title, ylabel, clients, series, key):
    """One log-y panel: x = client counts (evenly spaced), one line per server."""
    parts = []
    values = [v for _, _, pts in series for c, v in pts.get(key, []) if v and v > 0]
    parts.append(f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" font-size="14" font-weight="bold">{html.escape(title)}</text>')
    parts.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#333"/>')
    if not values or not clients:
        parts.append(f'<text x="{x0 + w / 2}" y="{y0 + h / 2}" text-anchor="middle" font-size="12">no data</text>')
        return parts
    lo_e, hi_e = log_ticks(min(values), max(values))

    def ypos(v):
        return y0 + h - (math.log10(v) - lo_e) / (hi_e - lo_e) * h

    def xpos(i):
        return x0 + (i + 0.5) * w / len(clients)

    # Decade grid lines, plus 2x and 5x ones (labelled when the range is narrow).
    for e in range(lo_e, hi_e + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if v > 10.0 ** hi_e:
                break
            y = ypos(v)
            shade = "#ccc" if m == 1 else "#eee"
            parts.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="{shade}"/>')
            if m == 1 or hi_e - lo_e <= 2:
                label = f"{v:,.0f}" if v >= 1 else f"{v:g}"
                parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    for i, c in enumerate(clients):
        parts.append(f'<text x="{xpos(i):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{c}</text>')
    parts.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">clients (log y axis)</text>')
    parts.append(
        f'<text x="{x0 - 52}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 {x0 - 52} {y0 + h / 2})">{html.escape(ylabel)}</text>'
    )
    for _label, color, pts in series:
        coords = [(xpos(clients.index(c)), ypos(v)) for c, v in pts.get(key, []) if v and v > 0]
        if len(coords) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in coords:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')
    return parts


def svg(args, runs):
    clients = sorted({s["clients"] for _, _, d in runs for s in d.get("steps", [])})
    series = []
    for i, (label, _desc, data) in enumerate(runs):
        pts = {"rps": [], "cpu": []}
        for s in data.get("steps", []):
            pts["rps"].append((s["clients"], s.get("requests_per_s")))
            pts["cpu"].append((s["clients"], s.get("server_cpu_us_per_req")))
        series.append((label, COLORS[i % len(COLORS)], pts))
    width, height = 980, 470
    pw, ph = 360, 280
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{html.escape(args.title)}</text>',
        f'<text x="{width / 2}" y="42" text-anchor="middle" font-size="11" fill="#555">{html.escape(args.command)} (shared, noisy machine)</text>',
    ]
    parts += panel(90, 80, pw, ph, "Throughput", "requests/s", clients, series, "rps")
    parts += panel(540, 80, pw, ph, "Server CPU per request", "CPU µs/request", clients, series, "cpu")
    lx, ly = 90, 420
    for label, color, _ in series:
        parts.append(f'<rect x="{lx}" y="{ly - 10}" width="14" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 18}" y="{ly}" font-size="12">{html.escape(label)}</text>')
        lx += 30 + 7.2 * len(label)
        if lx > width - 150:
            lx, ly = 90, ly + 18
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--title", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--svg")
    p.add_argument("--command", default="")
    p.add_argument("--setup", default="")
    p.add_argument("--machine", default="")
    p.add_argument("--baseline", default="", help="label of the run the ratio columns compare with")
    p.add_argument("--label-header", default="server", help="heading of the first column")
    args = p.parse_args()
    args.svg_name = args.svg.rsplit("/", 1)[-1] if args.svg else ""
    runs, skipped = load(args.manifest)
    with open(args.md, "w", encoding="utf-8") as f:
        f.write(markdown(args, runs, skipped))
    if args.svg:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(svg(args, runs))


if __name__ == "__main__":
    main()
