#!/usr/bin/env python3
"""Turns the `cobalt bench --json` files of one comparison run into a markdown table
(README.md) and an SVG plot (plot.svg) in the same folder.

Usage: report.py DIR TITLE [SKIPPED-LINE ...]
"""
import json
import math
import pathlib
import platform
import sys


def main() -> None:
    folder = pathlib.Path(sys.argv[1])
    title = sys.argv[2]
    skipped = sys.argv[3:]
    runs = {}
    for f in sorted(folder.glob("*.json")):
        try:
            runs[f.stem] = json.loads(f.read_text())["steps"]
        except (ValueError, KeyError):
            skipped.append(f"{f.stem}: unreadable results")
    lines = [
        f"# {title}",
        "",
        f"Machine: {platform.node()} ({platform.machine()}), shared and noisy: compare the",
        "servers within this run, not against other runs. CPU µs/request is the server's",
        "utime+stime over the step divided by the requests it answered.",
        "",
        "| server | clients | req/s | lost | p50 µs | p99 µs | server CPU µs/req | RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, steps in runs.items():
        for s in steps:
            cpu = s.get("server_cpu_us_per_req")
            rss = s.get("server_rss_kb")
            lines.append(
                f"| {name} | {s['clients']} | {s['requests_per_s']:,.0f} | {s['lost']} | "
                f"{s['p50_us']:,.0f} | {s['p99_us']:,.0f} | "
                f"{'-' if cpu is None else f'{cpu:.1f}'} | {'-' if rss is None else f'{rss / 1024:.0f}'} |"
            )
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {s}" for s in skipped]
    (folder / "README.md").write_text("\n".join(lines) + "\n")
    (folder / "plot.svg").write_text(plot(runs, title))
    print("\n".join(lines))


def plot(runs: dict, title: str) -> str:
    """Three panels against clients (log x): requests/s, p99 latency, server CPU µs/request."""
    w, h, pad = 900, 380, 90
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    xs = sorted({s["clients"] for steps in runs.values() for s in steps}) or [1]
    lo, hi = math.log10(min(xs)), math.log10(max(xs)) if max(xs) > min(xs) else math.log10(min(xs)) + 1
    panels = [
        ("requests/s", "requests_per_s"),
        ("p99 latency µs", "p99_us"),
        ("server CPU µs/request", "server_cpu_us_per_req"),
    ]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(panels) + 40}" font-family="sans-serif" font-size="12">',
           f'<rect width="100%" height="100%" fill="white"/><text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for p, (label, key) in enumerate(panels):
        top = 40 + p * h
        vals = [s.get(key) or 0 for steps in runs.values() for s in steps]
        vmax = max(vals + [1]) * 1.1
        x0, x1, y0, y1 = pad, w - 160, top + h - pad, top + 20
        def px(c):
            return x0 + (x1 - x0) * ((math.log10(c) - lo) / (hi - lo) if hi > lo else 0.5)
        def py(v):
            return y0 - (y0 - y1) * v / vmax
        svg.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
        svg.append(f'<text x="{x0 - 70}" y="{(y0 + y1) / 2}" transform="rotate(-90 {x0 - 70} {(y0 + y1) / 2})" text-anchor="middle">{label}</text>')
        for c in xs:
            svg.append(f'<text x="{px(c)}" y="{y0 + 16}" text-anchor="middle">{c}</text>')
        for i in range(5):
            v = vmax * i / 4
            svg.append(f'<text x="{x0 - 5}" y="{py(v) + 4}" text-anchor="end">{v:,.0f}</text>' if v >= 100
                       else f'<text x="{x0 - 5}" y="{py(v) + 4}" text-anchor="end">{v:.1f}</text>')
        svg.append(f'<text x="{(x0 + x1) / 2}" y="{y0 + 34}" text-anchor="middle">concurrent clients (log scale)</text>')
        for n, (name, steps) in enumerate(runs.items()):
            color = colors[n % len(colors)]
            pts = [(px(s["clients"]), py(s.get(key) or 0)) for s in steps]
            svg.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
            for a, b in pts:
                svg.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
            svg.append(f'<text x="{x1 + 15}" y="{y1 + 15 + 18 * n}" fill="{color}">{name}</text>')
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


if __name__ == "__main__":
    main()
