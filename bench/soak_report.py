#!/usr/bin/env python3
"""The soak benchmark's report (bench/soak.sh): verdicts and tables in markdown.

Usage: soak_report.py DIR SOAK_CLIENTS RSS_LIMIT_MIB MACHINE PINNING COBALT
DIR holds soak-<n>.json and soak-<n>-rss.csv per soak, and cpu.json.
"""
import csv
import json
import os
import sys


def load_steps(path):
    with open(path) as f:
        return json.load(f)["steps"]


def cpu_per_2xx(step):
    """Server CPU µs per 2.xx answer, from the server's CPU share over the step."""
    pct = step.get("server_cpu_percent")
    done = step.get("completed") or 0
    if pct is None or done == 0:
        return None
    return pct / 100.0 * step["duration_s"] * 1e6 / done


def codes(step):
    c = step.get("non_2xx_codes") or {}
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items())) or "none"


def rss_series(path):
    during, after = [], None
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["seconds"] == "after":
                after = int(row["rss_kb"])
            else:
                during.append((int(row["seconds"]), int(row["rss_kb"])))
    return during, after


def main():
    d, soak_clients, limit_mib, machine, pinning, cobalt = sys.argv[1:7]
    limit_kb = int(limit_mib) * 1024
    print("# Soak: `cobalt serve` with the default configuration under full load\n")
    print(f"Machine: {machine}; {pinning}. Binary: `{cobalt}`. Load: `cobalt bench` CON GET "
          "`/benchmark`, closed loop, one socket per virtual client; only 2.xx answers count "
          "as completed.\n")
    print("| clients | duration | 2.xx answers | 2.xx/s | other codes | lost | errors "
          "| server CPU µs per 2.xx | RSS at 60 s | max RSS after 60 s | RSS at end | "
          "RSS after the load | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in soak_clients.split(","):
        path = os.path.join(d, f"soak-{n}.json")
        if not os.path.exists(path):
            print(f"| {n} | — | no result | | | | | | | | | | failed |")
            continue
        step = load_steps(path)[0]
        during, after = rss_series(os.path.join(d, f"soak-{n}-rss.csv"))
        at60 = next((kb for t, kb in during if t >= 60), during[-1][1])
        later = [kb for t, kb in during if t >= 60] or [at60]
        peak, end = max(later), during[-1][1]
        ok_codes = (step.get("non_2xx") or 0) == 0
        ok_rss = max(kb for _, kb in during) <= limit_kb
        ok_flat = peak <= at60 * 1.10
        verdict = "pass" if ok_codes and ok_rss and ok_flat else "FAIL (" + ", ".join(
            w for w, ok in [("non-2.xx answers", ok_codes), (f"RSS > {limit_mib} MiB", ok_rss),
                            ("RSS grows after 60 s", ok_flat)] if not ok) + ")"
        cpu = cpu_per_2xx(step)
        print(f"| {n} | {step['duration_s']:.0f} s | {step['completed']:,} | "
              f"{step['requests_per_s']:,.0f} | {codes(step)} | {step.get('lost', 0):,} | "
              f"{step.get('errors', 0):,} | {'' if cpu is None else f'{cpu:.2f}'} | "
              f"{at60 / 1024:.1f} MiB | {peak / 1024:.1f} MiB | {end / 1024:.1f} MiB | "
              f"{'' if after is None else f'{after / 1024:.1f} MiB'} | {verdict} |")
    cpu_path = os.path.join(d, "cpu.json")
    if os.path.exists(cpu_path):
        print("\n## Server CPU per 2.xx answer\n")
        print("| clients | 2.xx/s | other codes | lost | server CPU µs per 2.xx | server CPU % "
              "| p50 µs | p99 µs |")
        print("|---|---|---|---|---|---|---|---|")
        for s in load_steps(cpu_path):
            cpu = cpu_per_2xx(s)
            print(f"| {s['clients']:,} | {s['requests_per_s']:,.0f} | {codes(s)} | "
                  f"{s.get('lost', 0):,} | {'' if cpu is None else f'{cpu:.2f}'} | "
                  f"{s.get('server_cpu_percent') or 0:.0f} | {s.get('p50_us', 0):.0f} | "
                  f"{s.get('p99_us', 0):.0f} |")
    print("\nRSS samples: `soak-<clients>-rss.csv`; bench output: `soak-<clients>.json`, "
          "`cpu.json` (in the directory of the same name).")


if __name__ == "__main__":
    main()
