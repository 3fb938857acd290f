#!/usr/bin/env bash
# The two DTLS backends of `cobalt serve` compared with CoAPBench (cobalt bench):
# OpenSSL (the default) and Mbed TLS 3.6 with a 6-byte Connection ID (RFC 9146).
#
# For each backend, one `cobalt serve --shards 1 --dtls-backend B` pinned to one CPU,
# driven from the other CPU by
#   cobalt bench coap://   (plain CoAP on the same server: the baseline)
#   cobalt bench coaps://  (DTLS 1.2 PSK, one session per client, handshakes before the
#                           measurement) at each --clients
#   cobalt bench coaps:// --new-session at --handshake-clients (a new session per
#                           request: req/s = handshakes/s)
# then the memory of DTLS sessions: the server's RSS before and after
# `dtls_hold` (cobalt/examples) opened --sessions idle PSK sessions, divided by their
# number. The coap and coaps runs use one generator design (cobalt bench's engine with
# io_uring over every client's socket; coaps protects each request in the client's own
# DTLS session), so the server sees the same batching and its CPU per request compares
# like with like. With --rate R they are open loop at R requests per second in all
# (cobalt bench --rate); without it closed loop. The backends
# alternate --repeat times, so that the background load of a
# shared machine spreads over both; the report gives the median of the repetitions.
# Writes bench/results/dtls-backends-<date>.md (req/s, p50/p99, server CPU µs/req,
# ratios to coap) and .svg, and the memory table into the same .md.
#
# Usage: bench/dtls-backends.sh [--clients 10,100] [--duration 5]
#          [--handshake-clients 10] [--sessions 1000] [--repeat 3] [--rate R] [--port 5683]
#          [--dtls-port 5684] [--threads 1] [--server-cpus 1] [--client-cpus 0]
#          [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt and DTLS_HOLD=/path/to/dtls_hold skip the builds.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=10,100
duration=5
handshake_clients=10
sessions=1000
repeat=3
port=5683
dtls_port=5684
threads=1
rate=""

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --handshake-clients) handshake_clients=$2; shift 2 ;;
    --sessions) sessions=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dtls-port) dtls_port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
if [ -z "${DTLS_HOLD:-}" ]; then
  log "building dtls_hold (cargo build --release -p cobalt --example dtls_hold)"
  (cd "$repo_root" && cargo build --release -q -p cobalt --example dtls_hold) || die "cargo build failed"
  DTLS_HOLD="${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/dtls_hold"
fi
[ -x "$DTLS_HOLD" ] || die "no dtls_hold at $DTLS_HOLD"
check_port_free udp "$port"
check_port_free udp "$dtls_port"

make_workdir dtls-backends
throwaway_psk cobalt-bench

host=127.0.0.1
udp_uri="coap://$host:$port/benchmark"
dtls_uri="coaps://$host:$dtls_port/benchmark"
ready_check() {
  "$COBALT" get "$udp_uri" --timeout 1 && "$COBALT" get "$dtls_uri" --timeout 1 "${psk[@]}"
}

skipped_labels="|"
measure() {
  local label=$1 uri=$2 desc=$3 json rc
  shift 3
  case $skipped_labels in *"|$label|"*) return 0 ;; esac
  json=$work/$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '_')-$rep.json
  if run_bench "$label" "$uri" "$json" --threads "$threads" "$@" 2>"$work/bench.err"; then
    record_ok "$label" "$json" "$desc"
  else
    rc=$?
    record_skip "$label" "cobalt bench exited with $rc: $(log_tail "$work/bench.err")" "$desc"
    skipped_labels="$skipped_labels$label|"
  fi
}

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status"; }

# hold_sessions BACKEND: RSS of the server before and after $sessions idle sessions,
# appended to $work/memory.tsv (backend, sessions, before KiB, after KiB).
hold_sessions() {
  local backend=$1 before after fifo line
  before=$(rss_kib)
  fifo=$work/hold.in
  rm -f "$fifo"
  mkfifo "$fifo"
  pin_client "$DTLS_HOLD" "$host:$dtls_port" "$sessions" "$psk_identity" "$psk_key" \
    <"$fifo" >"$work/hold.out" 2>&1 &
  local hold_pid=$!
  exec 9>"$fifo"
  for _ in $(seq 1 1200); do
    line=$(head -n 1 "$work/hold.out" 2>/dev/null || true)
    [ -n "$line" ] && break
    sleep 0.1
  done
  # Let the server publish and settle after the last handshake.
  sleep 1
  after=$(rss_kib)
  exec 9>&-
  wait "$hold_pid" 2>/dev/null || true
  case $line in
    "HELD "*) printf '%s\t%s\t%s\t%s\n' "$backend" "$sessions" "$before" "$after" >>"$work/memory.tsv" ;;
    *) log "dtls_hold against $backend: ${line:-no answer}" ;;
  esac
}

rate_args=()
load_desc=""
loop_desc="closed loop"
rate_flag=""
if [ -n "$rate" ]; then
  rate_args=(--rate "$rate")
  load_desc=", open loop at $rate requests/s in all"
  loop_desc="coap and coaps open loop at $rate requests/s in all (handshake runs closed loop)"
  rate_flag=" --rate $rate"
fi

: >"$work/memory.tsv"
for rep in $(seq 1 "$repeat"); do
  log "repetition $rep of $repeat"
  for backend in openssl mbedtls; do
    cid_args=()
    desc_backend="OpenSSL (vendored)"
    if [ "$backend" = mbedtls ]; then
      cid_args=(--cid 6)
      desc_backend="Mbed TLS 3.6, 6-byte CID"
    fi
    start_server "cobalt $backend" "$work/server.log" "$COBALT" serve --bind "$host" \
      --port "$port" --shards 1 --dtls-port "$dtls_port" --dtls-psk-file "$work/psk.txt" \
      --dtls-backend "$backend" "${cid_args[@]}" --log-level error \
      --set dtls.max_handshakes_per_ip=1000 --set dtls.max_sessions_per_ip=100000 \
      --set dtls.max_sessions=100000
    skip_reason=""
    if ! wait_ready "$backend" ready_check; then
      die "the $backend server did not come up: $skip_reason; log: $(log_tail "$work/server.log")"
    fi
    clients_all=$clients
    measure "coap ($backend server)" "$udp_uri" "UDP, CON GET, on the server with the $backend DTLS backend$load_desc" "${rate_args[@]}"
    measure "coaps $backend" "$dtls_uri" "DTLS 1.2 PSK CCM_8 on $desc_backend (one session per client, handshake before the measurement), CON GET$load_desc" "${psk[@]}" "${rate_args[@]}"
    clients=$handshake_clients
    measure "coaps $backend --new-session" "$dtls_uri" "a new DTLS PSK session (cookie exchange + full handshake) for every request on $desc_backend: req/s = handshakes/s" "${psk[@]}" --new-session
    clients=$clients_all
    hold_sessions "$backend"
    stop_server
    check_port_free udp "$dtls_port"
  done
done

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
md=$out_dir/dtls-backends-$stamp.md
python3 "$bench_dir/report.py" \
  --title "DTLS backends of cobalt serve compared with CoAPBench: OpenSSL and Mbed TLS (CID)" \
  --label-header run --baseline "coap (openssl server)" \
  --manifest "$manifest" \
  --md "$md" --svg "$out_dir/dtls-backends-$stamp.svg" \
  --command "bench/dtls-backends.sh --clients $clients --duration $duration --handshake-clients $handshake_clients --sessions $sessions --repeat $repeat --threads $threads$rate_flag" \
  --setup "cobalt serve --shards 1 on loopback $host (UDP port $port, DTLS port $dtls_port), once per backend and repetition, GET /benchmark (11-byte \"hello world\"), $loop_desc, cobalt bench --threads $threads (coap and coaps on the same io_uring engine; OpenSSL client sessions); $pinning" \
  --machine "$(machine_info)"
python3 - "$work/memory.tsv" >>"$md" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("\n## Memory per established DTLS session\n")
print("The server's RSS before and after `dtls_hold` opened the sessions (idle, PSK, one")
print("source port each), per repetition; KiB per session = growth / sessions.\n")
print("| backend | sessions | RSS before (KiB) | RSS after (KiB) | KiB per session |")
print("|---|---:|---:|---:|---:|")
per = {}
for backend, n, before, after in rows:
    k = (int(after) - int(before)) / int(n)
    per.setdefault(backend, []).append(k)
    print(f"| {backend} | {n} | {before} | {after} | {k:.1f} |")
print()
for backend, ks in per.items():
    print(f"- {backend}: median {statistics.median(ks):.1f} KiB per session")
EOF
log "wrote $md and .svg"
