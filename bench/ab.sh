#!/usr/bin/env bash
# A/B: two builds of cobalt, the same transports, side by side in one run.
#
# For each of --rounds rounds, starts `cobalt serve --shards 1 --tcp --ws
# --dtls-psk-file` of build A, drives it with `cobalt bench` (of build A: the same load
# generator for both) over coap, coaps (DTLS PSK), coap+tcp and coap+ws at each
# --clients, stops it, then does the same with build B; A and B alternate so that the
# background load of a shared machine falls on both alike. Server and generator are
# pinned to one CPU each. The report gives, per transport and client count, the medians
# of the rounds: 2.xx answers per second and the server's CPU µs per request for A and
# B, and B's CPU per request over A's. Writes bench/results/ab-<date>.md. The servers
# allow 1,000 handshakes in progress per address (see four_transports_serve_args in
# bench/lib.sh): every client comes from 127.0.0.1.
#
# Usage: bench/ab.sh --a PATH --b PATH [--clients 10,100] [--duration 5] [--rounds 3]
#          [--schemes coap,coaps,coap+tcp,coap+ws] [--port 5683] [--dtls-port 5684]
#          [--ws-port 8080] [--server-cpus 1] [--client-cpus 0] [--out bench/results]
#          [--label-a NAME] [--label-b NAME]
# Build A and B first, e.g. a worktree of the base commit:
#   git worktree add /tmp/base BASE && (cd /tmp/base && cargo build --release -p cobalt-cli)
#   bench/ab.sh --a /tmp/base/target/release/cobalt --b target/release/cobalt
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

clients=10,100
duration=5
rounds=3
schemes=coap,coaps,coap+tcp,coap+ws
port=5683
dtls_port=5684
ws_port=8080
a="" b="" label_a=A label_b=B
while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --a) a=$2 ;;
    --b) b=$2 ;;
    --label-a) label_a=$2 ;;
    --label-b) label_b=$2 ;;
    --rounds) rounds=$2 ;;
    --schemes) schemes=$2 ;;
    --port) port=$2 ;;
    --dtls-port) dtls_port=$2 ;;
    --ws-port) ws_port=$2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
[ -x "$a" ] || die "--a must name a cobalt binary (got '${a}')"
[ -x "$b" ] || die "--b must name a cobalt binary (got '${b}')"
command -v python3 >/dev/null || die "python3 is needed to write the report"
setup_pinning
COBALT=$a # the load generator of both runs
check_port_free udp "$port"
check_port_free tcp "$port"
make_workdir ab

throwaway_psk cobalt-ab
host=127.0.0.1
four_transports_serve_args
ready_check() {
  "$COBALT" get "$(uri_of coap)" --timeout 1 &&
    "$COBALT" get "$(uri_of coap+tcp)" --timeout 1 &&
    "$COBALT" get "$(uri_of coap+ws)" --timeout 1 &&
    "$COBALT" get "$(uri_of coaps)" --timeout 1 "${psk[@]}"
}

IFS=, read -r -a scheme_list <<<"$schemes"
IFS=, read -r -a client_list <<<"$clients"
for round in $(seq 1 "$rounds"); do
  for side in a b; do
    if [ "$side" = a ]; then bin=$a label=$label_a; else bin=$b label=$label_b; fi
    log "round $round of $rounds: $label ($bin)"
    start_server "$label" "$work/server.log" "$bin" "${serve_args[@]}"
    skip_reason=""
    wait_ready "$label" ready_check || die "$label did not come up: $skip_reason; log: $(log_tail "$work/server.log")"
    for scheme in "${scheme_list[@]}"; do
      scheme_options "$scheme"
      for c in "${client_list[@]}"; do
        clients=$c
        json=$work/$side-$(printf '%s' "$scheme" | tr -c 'A-Za-z0-9' '_')-$c-$round.json
        run_bench "$label $scheme" "$(uri_of "$scheme")" "$json" --threads 1 "${scheme_opts[@]}" ||
          die "cobalt bench failed for $label $scheme: see above"
        printf '%s\t%s\t%s\t%s\n' "$side" "$scheme" "$c" "$json" >>"$manifest"
      done
    done
    stop_server
  done
done

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
report=$out_dir/ab-$stamp.md
python3 - "$manifest" "$report" "$label_a" "$label_b" "$a" "$b" "$(machine_info)" "$pinning" \
  "bench/ab.sh --a $a --b $b --clients ${client_list[*]} --duration $duration --rounds $rounds --schemes $schemes" <<'PY'
import json, statistics, sys
manifest, report, la, lb, pa, pb, machine, pinning, command = sys.argv[1:]
runs = {}
for line in open(manifest):
    side, scheme, clients, path = line.rstrip("\n").split("\t")
    step = json.load(open(path))["steps"][0]
    ok = step["completed"] - step["non_2xx"]
    runs.setdefault((scheme, int(clients), side), []).append(
        (ok / step["duration_s"], step["server_cpu_us_per_req"], step["non_2xx"], step["lost"], step["errors"]))
med = lambda xs: statistics.median(xs)
rows = []
for scheme, clients in sorted({(s, c) for s, c, _ in runs}, key=lambda k: (k[0] != "coap", k[0], k[1])):
    a, b = runs[(scheme, clients, "a")], runs[(scheme, clients, "b")]
    ca, cb = med([r[1] for r in a]), med([r[1] for r in b])
    other = sum(r[2] + r[3] + r[4] for r in a + b)
    spread = lambda rs: f"{min(r[1] for r in rs):.2f}–{max(r[1] for r in rs):.2f}"
    rows.append(f"| {scheme} | {clients} | {med([r[0] for r in a]):,.0f} | {med([r[0] for r in b]):,.0f} "
                f"| {ca:.2f} ({spread(a)}) | {cb:.2f} ({spread(b)}) | {cb / ca:.3f} | {other} |")
with open(report, "w") as f:
    f.write(f"# A/B: {la} against {lb}\n\n{machine}; {pinning}.\n\n")
    f.write(f"- {la}: `{pa}`\n- {lb}: `{pb}`\n- command: `{command}`\n")
    f.write(f"- medians of {len(next(iter(runs.values())))} interleaved rounds; one `cobalt serve --shards 1` per build and round, "
            "CON GET /benchmark, `cobalt bench --threads 1` of the first build as the load generator for both.\n\n")
    f.write(f"| transport | clients | {la} 2.xx/s | {lb} 2.xx/s | {la} server CPU µs/req (range) | {lb} server CPU µs/req (range) | {lb} ÷ {la} (CPU) | non-2.xx, lost, errors |\n")
    f.write("|---|---|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(report).read())
PY
log "report: $report"
