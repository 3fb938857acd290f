#!/usr/bin/env bash
# Soak benchmark: does `cobalt serve` with its default configuration hold full rate for
# minutes, answering only 2.xx, with bounded, flat memory?
#
# For each client count of --soak-clients it starts a fresh `cobalt serve` (no flags,
# no config file) pinned to the server CPU(s), runs `cobalt bench` (CON GET /benchmark,
# closed loop, every virtual client with its own socket) for --soak-duration seconds,
# and samples the server's RSS every --sample seconds. Then, on another fresh server, it
# measures server CPU µs per 2.xx answer at each of --cpu-clients for --cpu-duration
# seconds each. Writes bench/results/soak-<date>.md (verdicts, tables), the bench JSON
# and the RSS samples (CSV) next to it.
#
# Verdicts per soak: no answer other than 2.xx, RSS at most --rss-limit MiB, and RSS
# flat after the first minute (its maximum after 60 s at most 10 % above its value at
# 60 s).
#
# Usage: bench/soak.sh [--soak-clients 100,10000] [--soak-duration 600]
#          [--cpu-clients 10,100,1000,10000] [--cpu-duration 30] [--sample 5]
#          [--rss-limit 256] [--port 5683] [--server-cpus 1] [--client-cpus 0]
#          [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt skips the cargo build.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

soak_clients=100,10000
soak_duration=600
cpu_clients=10,100,1000,10000
cpu_duration=30
sample=5
rss_limit=256
port=5683
clients=$soak_clients
duration=$soak_duration

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --soak-clients) soak_clients=$2; shift 2 ;;
    --soak-duration) soak_duration=$2; shift 2 ;;
    --cpu-clients) cpu_clients=$2; shift 2 ;;
    --cpu-duration) cpu_duration=$2; shift 2 ;;
    --sample) sample=$2; shift 2 ;;
    --rss-limit) rss_limit=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
check_port_free udp "$port"
make_workdir soak
stamp=$(date -u +%Y-%m-%d-%H%M)
dest=$out_dir/soak-$stamp
mkdir -p "$dest"

uri="coap://127.0.0.1:$port/benchmark"

# start_default: a fresh `cobalt serve` with the default configuration (port aside).
start_default() {
  start_server "cobalt serve" "$work/server.log" "$COBALT" serve --port "$port"
  wait_ready "cobalt serve" ready_check || die "cobalt serve did not start: $(log_tail "$work/server.log")"
}

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

for n in ${soak_clients//,/ }; do
  start_default
  samples=$dest/soak-$n-rss.csv
  echo "seconds,rss_kb" >"$samples"
  echo "0,$(rss_kb "$server_pid")" >>"$samples"
  log "soak: $n clients for ${soak_duration}s"
  pin_client "$COBALT" bench "$uri" -c "$n" -d "$soak_duration" \
    --server-pid "$server_pid" --json -q >"$dest/soak-$n.json" &
  bench_pid=$!
  start=$SECONDS
  while kill -0 "$bench_pid" 2>/dev/null; do
    sleep "$sample"
    echo "$((SECONDS - start)),$(rss_kb "$server_pid")" >>"$samples"
  done
  wait "$bench_pid" || log "cobalt bench exited with $? (the report says why)"
  # After the load: does the memory come back?
  sleep "$sample"
  echo "after,$(rss_kb "$server_pid")" >>"$samples"
  stop_server
  check_port_free udp "$port"
done

start_default
log "server CPU per 2.xx answer: ${cpu_clients} clients, ${cpu_duration}s each"
pin_client "$COBALT" bench "$uri" -c "$cpu_clients" -d "$cpu_duration" \
  --server-pid "$server_pid" --json -q >"$dest/cpu.json"
stop_server

python3 "$bench_dir/soak_report.py" "$dest" "$soak_clients" "$rss_limit" \
  "$(machine_info)" "$pinning" "$COBALT" >"$out_dir/soak-$stamp.md"
log "report: $out_dir/soak-$stamp.md (data in $dest/)"
cat "$out_dir/soak-$stamp.md"
