#!/usr/bin/env python3
"""The report of bench/floor.sh: Cobalt's server CPU per 2.xx answer beside the raw
UDP floor's at each client count (medians over the rounds), and, where profiles were
taken, where each server's CPU went."""

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict


def step(path):
    """The one step of a `cobalt bench --json` result."""
    with open(path) as f:
        return json.load(f)["steps"][0]


def runs_by_count(runs_path):
    """{(server, clients): [step, ...]} in round order."""
    runs = defaultdict(list)
    with open(runs_path) as f:
        for line in f:
            server, clients, _round, path = line.rstrip("\n").split("\t")
            runs[(server, int(clients))].append(step(path))
    return runs


def cpu_cell(steps):
    """Median CPU µs per 2.xx answer and each round's, as a table cell."""
    per = [s["server_cpu_us_per_req"] for s in steps if s.get("server_cpu_us_per_req")]
    if not per:
        return None, "n/a"
    med = statistics.median(per)
    return med, f"{med:.2f} ({', '.join(f'{x:.2f}' for x in per)})"


def failures(steps):
    """Non-2.xx answers, losses and errors over all rounds, as a table cell."""
    non2 = sum(s["non_2xx"] for s in steps)
    lost = sum(s["lost"] for s in steps)
    errors = sum(s["errors"] for s in steps)
    return f"{non2} / {lost} / {errors}"


def profile_summary(path, top):
    """(kernel share, user share, [(share, function)]) of a perf report --sort dso,sym."""
    kernel = user = 0.0
    funcs = []
    line_re = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[([.k])\]\s+(.*)$")
    with open(path) as f:
        for line in f:
            m = line_re.match(line)
            if not m:
                continue
            share, dso, kind, sym = float(m[1]), m[2], m[3], m[4].strip()
            if kind == "k" or dso.startswith("[kernel"):
                kernel += share
            else:
                user += share
                funcs.append((share, f"{sym} ({dso})"))
    funcs.sort(reverse=True)
    return kernel, user, funcs[:top]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--profiles", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--setup", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--cobalt-version", required=True)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()

    runs = runs_by_count(a.runs)
    counts = sorted({n for (_, n) in runs})
    out = sys.stdout
    out.write("# Cobalt against the raw UDP floor at every number of peers\n\n")
    out.write(f"- Command: `{a.command}`\n")
    out.write(f"- Setup: {a.setup}\n")
    out.write(f"- Machine: {a.machine}; {a.cobalt_version}\n")
    out.write(
        "- Servers: `cobalt serve --shards 1` (default configuration) and `cobalt "
        "bench-responder` (recvmmsg/sendmmsg, no CoAP state: the floor), alternated on one "
        "port; only 2.xx answers count.\n"
    )
    out.write(
        "- **Caveat: a shared, noisy machine**; the rounds are listed so that the spread "
        "shows. The ratio is of the medians.\n\n"
    )
    out.write(
        "| clients | run (s) | Cobalt CPU µs / 2.xx (rounds) | floor CPU µs / 2.xx (rounds) "
        "| ratio | Cobalt req/s | floor req/s | Cobalt RSS (MiB) "
        "| Cobalt non-2.xx / lost / errors | floor non-2.xx / lost / errors |\n"
    )
    out.write("|--:|--:|--|--|--:|--:|--:|--:|--:|--:|\n")
    for n in counts:
        c, f = runs.get(("cobalt", n), []), runs.get(("floor", n), [])
        c_med, c_cell = cpu_cell(c)
        f_med, f_cell = cpu_cell(f)
        ratio = f"{c_med / f_med:.2f}" if c_med and f_med else "n/a"
        rps = lambda steps: f"{statistics.median(s['requests_per_s'] for s in steps):,.0f}" if steps else "n/a"
        rss = max((s.get("server_rss_kb") or 0) for s in c) / 1024 if c else 0
        secs = c[0]["duration_s"] if c else 0
        out.write(
            f"| {n:,} | {secs:g} | {c_cell} | {f_cell} | {ratio} | {rps(c)} | {rps(f)} "
            f"| {rss:.1f} | {failures(c)} | {failures(f)} |\n"
        )

    profiles = []
    with open(a.profiles) as f:
        for line in f:
            server, clients, path = line.rstrip("\n").split("\t")
            profiles.append((server, int(clients), path))
    if profiles:
        out.write("\n## Where the server's CPU went (perf, one extra run each)\n\n")
        for server, clients, path in profiles:
            kernel, user, funcs = profile_summary(path, a.top)
            out.write(
                f"### {server}, {clients:,} clients: kernel {kernel:.1f} %, "
                f"user space {user:.1f} % of samples\n\n"
            )
            if funcs:
                out.write("| share of all samples | user-space function |\n|--:|--|\n")
                for share, name in funcs:
                    out.write(f"| {share:.2f} % | `{name[:150]}` |\n")
                out.write("\n")


if __name__ == "__main__":
    main()
