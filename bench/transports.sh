#!/usr/bin/env bash
# CoAP transports compared with CoAPBench (cobalt bench): one Cobalt server, every
# transport it speaks.
#
# Starts one `cobalt serve --shards 1 --tcp --ws --tls --dtls-psk-file` pinned to one CPU
# and drives it, from the other CPU, with
#   cobalt bench coap:// | coaps:// (DTLS 1.2, PSK) | coap+tcp:// | coap+ws://
#                | coaps+tcp:// (TLS, PSK) | coaps+ws:// (TLS, PSK)
# at each --clients, with --server-pid, then measures handshakes with --new-session (a
# fresh DTLS session, TCP connection or TLS connection for every request) at
# --handshake-clients. The whole list runs --repeat times, round-robin, so that the
# background load of a shared machine spreads over every transport alike; the report
# gives the median of the repetitions. Writes bench/results/transports-<date>.md (req/s,
# p50/p99, server CPU µs/req, ratios to UDP, the load generator's CPU) and .svg.
#
# Usage: bench/transports.sh [--clients 10,100] [--duration 5] [--handshake-clients 10]
#          [--repeat 3] [--port 5683] [--dtls-port 5684] [--ws-port 8080]
#          [--tls-port 5684] [--wss-port 8443] [--threads 1]
#          [--server-cpus 1] [--client-cpus 0] [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt skips the cargo build.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=10,100
duration=5
handshake_clients=10
repeat=3
port=5683
dtls_port=5684
ws_port=8080
tls_port=5684
wss_port=8443
threads=1

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --handshake-clients) handshake_clients=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --dtls-port) dtls_port=$2; shift 2 ;;
    --ws-port) ws_port=$2; shift 2 ;;
    --tls-port) tls_port=$2; shift 2 ;;
    --wss-port) wss_port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
check_port_free udp "$port"
check_port_free tcp "$port"
check_port_free udp "$dtls_port"
check_port_free tcp "$ws_port"
check_port_free tcp "$tls_port"
check_port_free tcp "$wss_port"

make_workdir transports

# A throwaway key for this run only.
throwaway_psk cobalt-bench

host=127.0.0.1
udp_uri="coap://$host:$port/benchmark"
dtls_uri="coaps://$host:$dtls_port/benchmark"
tcp_uri="coap+tcp://$host:$port/benchmark"
ws_uri="coap+ws://$host:$ws_port/benchmark"
tls_uri="coaps+tcp://$host:$tls_port/benchmark"
wss_uri="coaps+ws://$host:$wss_port/benchmark"
ready_check() {
  "$COBALT" get "$udp_uri" --timeout 1 &&
    "$COBALT" get "$tcp_uri" --timeout 1 &&
    "$COBALT" get "$ws_uri" --timeout 1 &&
    "$COBALT" get "$dtls_uri" --timeout 1 "${psk[@]}" &&
    "$COBALT" get "$tls_uri" --timeout 1 "${psk[@]}" &&
    "$COBALT" get "$wss_uri" --timeout 1 "${psk[@]}"
}

# measure LABEL URI DESCRIPTION [cobalt bench options]: one run (repetition $rep)
# against the server, recorded in the manifest; a run that fails (e.g. a scheme cobalt
# bench refuses) is recorded as skipped once and not tried again.
skipped_labels="|"
measure() {
  local label=$1 uri=$2 desc=$3 json rc
  shift 3
  case $skipped_labels in *"|$label|"*) return 0 ;; esac
  json=$work/$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '_')-$rep.json
  if run_bench "$label" "$uri" "$json" --threads "$threads" "$@" 2>"$work/bench.err"; then
    cat "$work/bench.err" >&2
    record_ok "$label" "$json" "$desc"
  else
    rc=$?
    cat "$work/bench.err" >&2
    record_skip "$label" "cobalt bench exited with $rc: $(log_tail "$work/bench.err")" "$desc"
    skipped_labels="$skipped_labels$label|"
  fi
}

desc_server="cobalt serve --shards 1 --tcp --ws --tls --dtls-psk-file ($("$COBALT" --version))"
start_server cobalt "$work/server.log" "$COBALT" serve --bind "$host" --port "$port" \
  --shards 1 --tcp "$port" --ws-port "$ws_port" --dtls-port "$dtls_port" \
  --tls "$tls_port" --wss-port "$wss_port" \
  --dtls-psk-file "$work/psk.txt" --log-level error
skip_reason=""
if ! wait_ready cobalt ready_check; then
  die "the server did not come up: $skip_reason; log: $(log_tail "$work/server.log")"
fi

full_clients=$clients
for rep in $(seq 1 "$repeat"); do
  log "repetition $rep of $repeat"
  clients=$full_clients
  measure "coap" "$udp_uri" "UDP, CON GET; $desc_server"
  measure "coaps" "$dtls_uri" "DTLS 1.2 PSK (one session per client, handshake before the measurement), CON GET" "${psk[@]}"
  measure "coap+tcp" "$tcp_uri" "RFC 8323 over TCP (one connection per client, CSM before the measurement)"
  measure "coap+ws" "$ws_uri" "RFC 8323 over WebSockets (one WebSocket per client, upgrade and CSM before the measurement)"
  measure "coaps+tcp" "$tls_uri" "RFC 8323 over TLS 1.3 with the PSK (one connection per client, handshake and CSM before the measurement)" "${psk[@]}"
  measure "coaps+ws" "$wss_uri" "RFC 8323 over secure WebSockets, TLS 1.3 with the PSK" "${psk[@]}"
  clients=$handshake_clients
  measure "coaps --new-session" "$dtls_uri" "a new DTLS PSK session (cookie exchange + full handshake) for every request: req/s = handshakes/s, CPU µs/req = per handshake + one request" "${psk[@]}" --new-session
  measure "coap+tcp --new-session" "$tcp_uri" "a new TCP connection and CSM exchange for every request" --new-session
  measure "coaps+tcp --new-session" "$tls_uri" "a new TCP connection, TLS PSK handshake and CSM exchange for every request" "${psk[@]}" --new-session
done
clients=$full_clients
stop_server

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
python3 "$bench_dir/report.py" \
  --title "CoAP transports of one Cobalt server compared with CoAPBench" \
  --label-header transport --baseline coap \
  --manifest "$manifest" \
  --md "$out_dir/transports-$stamp.md" --svg "$out_dir/transports-$stamp.svg" \
  --command "bench/transports.sh --clients $clients --duration $duration --handshake-clients $handshake_clients --repeat $repeat --threads $threads" \
  --setup "one cobalt serve --shards 1 on loopback $host (UDP and TCP port $port, DTLS port $dtls_port, WebSocket port $ws_port, TLS port $tls_port, secure WebSocket port $wss_port), GET /benchmark (11-byte \"hello world\"), closed loop, cobalt bench --threads $threads; $pinning" \
  --machine "$(machine_info)"
log "wrote $out_dir/transports-$stamp.md and .svg"
