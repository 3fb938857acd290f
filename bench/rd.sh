#!/usr/bin/env bash
# Resource directories side by side: registrations and lookups per second and the
# server's CPU µs per operation, at 100 and 1,000 clients, for `cobalt rd`, aiocoap-rd
# and libcoap's coap-rd-notls, one after the other in one run on this machine.
#
#   bench/rd.sh [-c "100 1000"] [-d SECONDS] [--out DIR] [--server-cpus N] [--client-cpus N]
#
# Every client of `cobalt bench` is its own endpoint (`?ep=b-{client}`, the client's
# number), so the directory holds one registration per client:
#   register  POST <registration interface>?ep=b-{client}&lt=3600, Content-Format 40,
#             two links (each request after a client's first replaces its registration,
#             RFC 9176 §5: the same ep and d)
#   lookup    GET <resource lookup>?ep=b-{client}: the client's own two links
# Only 2.xx answers count as operations; other codes are listed. libcoap's coap-rd
# (Debian's libcoap3-bin 4.3.1) has no lookup interface, so it has no lookup row.
# cobalt rd runs in memory with its per-address budget raised (every client is on
# 127.0.0.1); the others have no such budget.
# Servers: $COBALT (default: this checkout's release build), $AIOCOAP_RD (default
# .venv-peers/bin/aiocoap-rd), $COAP_RD (default coap-rd-notls); a missing one is
# skipped and said so. Results: bench/results/rd-<date>.md (+ the JSON of each run).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
clients="100 1000"
duration=10
warmup=2
while [ $# -gt 0 ]; do
  common_option "$@" || die "unknown option $1 (see --help)"
  shift "$shifts"
done
prepare_run
make_workdir rd
AIOCOAP_RD=${AIOCOAP_RD:-$repo_root/.venv-peers/bin/aiocoap-rd}
COAP_RD=${COAP_RD:-coap-rd-notls}
host=127.0.0.1
links='</sensors/temp>;rt="temperature";if="core.s";obs,</sensors/hum>;rt="humidity";if="core.s";obs'
stamp=$(date -u +%Y-%m-%d-%H%M)
results=$out_dir/rd-$stamp
mkdir -p "$results"

free_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# NAME START-CMD... : sets register_path/lookup_path before; starts, waits, measures, stops.
measure_server() {
  local name=$1 n op uri out
  shift
  port=$(free_port)
  local cmd=("$@")
  cmd=("${cmd[@]//PORT/$port}")
  start_server "$name" "$work/$name.log" "${cmd[@]}"
  if ! wait_ready "$name" "$COBALT" get "coap://$host:$port/.well-known/core" --timeout 1; then
    record_skip "$name" "$skip_reason" "-"
    stop_server
    return
  fi
  for n in $clients; do
    for op in register lookup; do
      if [ "$op" = lookup ] && [ -z "$lookup_path" ]; then
        record_skip "$name $op $n" "no lookup interface" "$op"
        continue
      fi
      out=$results/$name-$op-$n.json
      if [ "$op" = register ]; then
        uri="coap://$host:$port$register_path?ep=b-{client}&lt=3600"
        log "$name: $op, $n clients"
        pin_client "$COBALT" bench "$uri" -m post -t link-format -p "$links" -c "$n" \
          -d "$duration" --warmup "$warmup" --server-pid "$server_pid" --json -q >"$out" || true
      else
        uri="coap://$host:$port$lookup_path?ep=b-{client}"
        log "$name: $op, $n clients"
        pin_client "$COBALT" bench "$uri" -c "$n" -d "$duration" --warmup "$warmup" \
          --server-pid "$server_pid" --json -q >"$out" || true
      fi
      if [ -s "$out" ]; then record_ok "$name $op $n" "$out" "$op"; else record_skip "$name $op $n" "no result" "$op"; fi
    done
  done
  stop_server
}

register_path=/rd lookup_path=/rd-lookup/res
measure_server cobalt "$COBALT" rd --in-memory --bind "$host" -p PORT \
  --max-per-peer 1000000 --max-registrations 1000000 --log-level error
if [ -x "$AIOCOAP_RD" ]; then
  register_path=/resourcedirectory/ lookup_path=/resource-lookup/
  measure_server aiocoap-rd "$AIOCOAP_RD" --bind "$host:PORT"
else
  record_skip aiocoap-rd "$AIOCOAP_RD not found (scripts/install-test-deps.sh installs it)" "-"
fi
if command -v "$COAP_RD" >/dev/null; then
  register_path=/rd lookup_path=
  measure_server libcoap-coap-rd "$COAP_RD" -A "$host" -p PORT
else
  record_skip libcoap-coap-rd "$COAP_RD not found (apt-get install libcoap3-bin)" "-"
fi

report=$out_dir/rd-$stamp.md
python3 - "$manifest" "$report" "$(machine_info)" "$pinning" "$duration" "$warmup" "$(git -C "$repo_root" rev-parse --short HEAD)" <<'PY'
import json, sys
manifest, report, machine, pinning, duration, warmup, commit = sys.argv[1:8]
rows, skips = [], []
for line in open(manifest):
    label, status, what, desc = line.rstrip("\n").split("\t")
    if status != "ok":
        skips.append(f"- {label}: {what}")
        continue
    server, op, n = label.rsplit(" ", 2)
    run = json.load(open(what))
    for s in run["steps"]:
        other = ", ".join(f"{k}: {v}" for k, v in sorted(s["non_2xx_codes"].items())) or "-"
        cpu = s.get("server_cpu_us_per_req")
        rows.append(f"| {server} | {op} | {s['clients']} | {s['requests_per_s']:.0f} | "
                    f"{'-' if cpu is None else f'{cpu:.0f}'} | {s['p50_us']/1000:.1f} | {s['p99_us']/1000:.1f} | "
                    f"{other} | {s['lost']} |")
with open(report, "w") as f:
    f.write(f"# Resource directories: registrations and lookups (bench/rd.sh)\n\n")
    f.write(f"Commit {commit}; {machine}; {pinning}. {duration} s measured per cell after "
            f"{warmup} s of warm-up: short runs on a shared machine, read them as ratios. "
            "Ops/s counts 2.xx answers only; server CPU is the server process's user+system "
            "time per 2.xx answer.\n\n")
    f.write("| server | operation | clients | 2.xx ops/s | server CPU µs/op | p50 ms | p99 ms | other answers | lost |\n")
    f.write("|---|---|---|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
    if skips:
        f.write("\nNot measured:\n" + "\n".join(skips) + "\n")
print(open(report).read())
PY
log "report: $report (JSON in $results)"
