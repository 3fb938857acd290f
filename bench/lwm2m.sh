#!/usr/bin/env bash
# The LwM2M server with N simulated devices registering at once.
#
# Starts `cobalt lwm2m` (registrations in memory, the HTTP view on a free port) pinned to
# the server CPU, then `cobalt devices -n N --lwm2m ...` (each device its own socket,
# spread over 127.0.0.0/16, all starting to register at once) pinned to the other, and
# polls the HTTP view's `GET /clients` until every device is listed or --timeout passes.
# Writes bench/results/lwm2m-<date>.md: the time from the devices' start to the last
# registration, the server's CPU and RSS by then, how many were registered, and the
# devices' own summary (registrations, errors by code) after they de-register.
#
# Usage: bench/lwm2m.sh [--devices 10000] [--timeout 120] [--port 5683]
#          [--server-cpus 1] [--client-cpus 0] [--out bench/results]
# Environment: COBALT=/path/to/cobalt skips the cargo build.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

devices=10000
timeout=120
port=5683

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --devices | -n) devices=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
command -v curl >/dev/null || die "curl is needed to read the server's HTTP view"

prepare_run
check_port_free udp "$port"
make_workdir lwm2m
http_port=$((port + 2400))
check_port_free tcp "$http_port"

start_server lwm2m "$work/server.log" "$COBALT" lwm2m --in-memory --bind 127.0.0.1 \
  --port "$port" --http "127.0.0.1:$http_port" --max-per-peer "$devices" \
  --max-registrations "$((devices * 2))" --log-level error
listed() {
  curl -sf "http://127.0.0.1:$http_port/clients" |
    python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'
}
wait_ready lwm2m listed || die "cobalt lwm2m did not start: $skip_reason; $(log_tail "$work/server.log")"

# CPU seconds (user + system) of a process, from /proc.
cpu_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}
cpu0=$(cpu_seconds "$server_pid")
t0=$(date +%s.%N)
# The devices stay until the poll below has seen them all (or given up), then leave.
stay=$((timeout + 30))
pin_client "$COBALT" devices -n "$devices" --lwm2m "coap://127.0.0.1:$port" \
  --source-net 127.0.0.0/16 --registrations-per-second "$devices" --rate 0 \
  --lt 600 --duration "$stay" >"$work/devices.log" 2>&1 &
devices_pid=$!

count=0 took=""
while :; do
  count=$(listed || echo 0)
  now=$(date +%s.%N)
  if [ "$count" -ge "$devices" ]; then
    took=$(python3 -c "print(f'{$now - $t0:.2f}')")
    break
  fi
  if python3 -c "import sys; sys.exit(0 if $now - $t0 > $timeout else 1)"; then break; fi
  sleep 0.2
done
cpu1=$(cpu_seconds "$server_pid")
rss_kb=$(awk '/VmRSS/ { print $2 }' "/proc/$server_pid/status")
log "registered: $count of $devices${took:+ in $took s}"
kill -INT "$devices_pid" 2>/dev/null || true
wait "$devices_pid" 2>/dev/null || true
summary=$(grep -v '^\s*$' "$work/devices.log" | tail -n 1 | tr '|' '/')
stop_server

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
report=$out_dir/lwm2m-$stamp.md
cpu_ms=$(python3 -c "print(f'{($cpu1 - $cpu0) * 1000:.0f}')")
per_reg=$(python3 -c "print(f'{($cpu1 - $cpu0) * 1e6 / max($count, 1):.1f}')")
{
  echo "# The LwM2M server with $devices devices registering at once"
  echo
  echo "- Command: \`bench/lwm2m.sh --devices $devices --timeout $timeout\`"
  echo "- Setup: \`cobalt lwm2m --in-memory\` ($pinning); \`cobalt devices -n $devices --lwm2m\`"
  echo "  from 127.0.0.0/16, all starting at once, \`lt\` 600 s; \`GET /clients\` polled every 0.2 s"
  echo "- Machine: $(machine_info); $("$COBALT" --version)"
  echo "- **Caveat: a shared, noisy machine; one run.**"
  echo
  echo "| devices | registered | time to the last (s) | server CPU until then (ms) | CPU per registration (µs) | server RSS (MiB) |"
  echo "|--:|--:|--:|--:|--:|--:|"
  echo "| $devices | $count | ${took:-not reached in $timeout s} | $cpu_ms | $per_reg | $(python3 -c "print(f'{$rss_kb / 1024:.1f}')") |"
  echo
  echo "The devices' summary after they de-registered: \`$summary\`"
} >"$report"
cat "$report"
log "wrote $report"
