#!/usr/bin/env bash
# Proxy throughput in one short run: requests per second and the proxy's CPU time per
# request for GET /benchmark (`cobalt serve` as the origin) through `cobalt proxy`'s
# CoAP front (a reverse route, CON GET over UDP) and its HTTP front (HTTP/1.1
# keep-alive, /hc/coap://...), each cached (the origin's Max-Age 60: after the first
# request every answer comes from the cache) and uncached (a second proxy with
# --cache-bytes 0: every request goes to the origin), next to direct CoAP to the origin.
# Each step runs --duration seconds at one client count: warm-up figures, not steady
# state. The origin and both proxies share the server CPU(s), the load generator has
# its own; CPU per request is that of the process named in the table's last column
# (for uncached requests the origin's own CPU comes on top). The HTTP front takes at
# most 256 connections from one address, so --clients stays at or below 256. Writes
# bench/results/proxy-<date>.md.
#
# Usage: bench/proxy.sh [--clients 50] [--duration 5] [--server-cpus 1] [--client-cpus 0]
#          [--base-port 5790] [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt skips the cargo build.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=50
duration=5
base_port=5790

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --base-port) base_port=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
origin_port=$base_port
cached_port=$((base_port + 1))
uncached_port=$((base_port + 2))
for p in "$origin_port" "$cached_port" "$uncached_port"; do check_port_free udp "$p"; done
for p in "$cached_port" "$uncached_port"; do check_port_free tcp "$((p + 3000))"; done

make_workdir proxy
pids=()
stop_all() {
  local p
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; cleanup' EXIT

# spawn NAME CMD...: starts CMD on the server CPUs; its PID (exec: the process itself,
# what --server-pid measures) goes in pid_NAME.
spawn() {
  local name=$1
  shift
  log "starting $name: $*"
  {
    if [ -n "$server_cpus" ]; then exec taskset -c "$server_cpus" "$@"; else exec "$@"; fi
  } >"$work/$name.log" 2>&1 &
  pids+=("$!")
  printf -v "pid_$name" '%s' "$!"
}

origin="coap://127.0.0.1:$origin_port"
spawn origin "$COBALT" serve --shards 1 --port "$origin_port" --bind 127.0.0.1
spawn cached "$COBALT" proxy --shards 1 --coap "127.0.0.1:$cached_port" \
  --http "127.0.0.1:$((cached_port + 3000))" --allow 127.0.0.1 --reverse "/o=$origin/"
spawn uncached "$COBALT" proxy --shards 1 --coap "127.0.0.1:$uncached_port" \
  --http "127.0.0.1:$((uncached_port + 3000))" --allow 127.0.0.1 --reverse "/o=$origin/" \
  --cache-bytes 0

deadline=$((SECONDS + ready_timeout))
until "$COBALT" get "coap://127.0.0.1:$uncached_port/o/benchmark" --timeout 1 >/dev/null 2>&1 &&
  "$COBALT" get "coap://127.0.0.1:$cached_port/o/benchmark" --timeout 1 >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || die "the proxies did not answer within ${ready_timeout}s (logs in $work)"
  sleep 0.25
done

# step NAME URI PID: one cobalt bench run, its JSON in $work/NAME.json.
steps=()
step() {
  log "bench $1: $2 ($clients clients, ${duration}s)"
  pin_client "$COBALT" bench -q -c "$clients" -d "$duration" --warmup 1 --server-pid "$3" \
    --json "$2" >"$work/$1.json"
  steps+=("$1")
}
# shellcheck disable=SC2154 # pid_* are set by spawn
{
  step direct-coap "$origin/benchmark" "$pid_origin"
  step coap-front-cached "coap://127.0.0.1:$cached_port/o/benchmark" "$pid_cached"
  step coap-front-uncached "coap://127.0.0.1:$uncached_port/o/benchmark" "$pid_uncached"
  step http-front-cached "http://127.0.0.1:$((cached_port + 3000))/hc/$origin/benchmark" "$pid_cached"
  step http-front-uncached "http://127.0.0.1:$((uncached_port + 3000))/hc/$origin/benchmark" "$pid_uncached"
}

mkdir -p "$out_dir"
report=$out_dir/proxy-$(date -u +%Y-%m-%d-%H%M).md
python3 - "$work" "$report" "$clients" "$duration" "$(machine_info)" "$pinning" "${steps[@]}" <<'PY'
import json, sys
work, report, clients, duration, machine, pinning, *steps = sys.argv[1:]
measured = {
    "direct-coap": "origin",
    "coap-front-cached": "proxy", "coap-front-uncached": "proxy",
    "http-front-cached": "proxy", "http-front-uncached": "proxy",
}
lines = [
    "# Proxy throughput (bench/proxy.sh)",
    "",
    f"{machine}; {pinning}. {clients} clients, {duration} s per step after 1 s of warm-up:",
    "short runs, warm-up figures, not steady state. GET /benchmark of `cobalt serve`;",
    "uncached = a proxy with `--cache-bytes 0`.",
    "",
    "| path | req/s | p50 µs | p99 µs | non-2xx | lost | CPU µs/req | of |",
    "|---|---:|---:|---:|---:|---:|---:|---|",
]
for name in steps:
    s = json.load(open(f"{work}/{name}.json"))["steps"][0]
    cpu = s.get("server_cpu_us_per_req")
    lines.append(
        f"| {name} | {s['requests_per_s']:.0f} | {s['p50_us']:.0f} | {s['p99_us']:.0f} | "
        f"{s['non_2xx']} | {s['lost']} | {'' if cpu is None else f'{cpu:.1f}'} | {measured[name]} |"
    )
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
log "wrote $report"
