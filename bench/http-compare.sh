#!/usr/bin/env bash
# CoAP vs HTTP with one tool (the paper's §III-B): `cobalt bench` drives Cobalt over
# CoAP (CON GET), and two HTTP/1.1 servers — nginx and `cobalt bench-http-responder`
# (a small tokio server written here; not hyper) — each with keep-alive and with a new
# TCP connection per request. Servers pinned to the server CPU(s), load to the load
# CPU(s). Writes a markdown table and an SVG plot to bench/results/.
#
# Usage: bench/http-compare.sh [--clients 10,100] [--duration 5] [--server-cpus 1]
#                              [--load-cpus 0] [--port 25800]
# nginx is installed with apt-get when missing (root); without it, it is skipped.
set -uo pipefail

clients=10,100
duration=5
server_cpus=1
load_cpus=0
port=25800
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --server-cpus) server_cpus=$2; shift 2 ;;
    --load-cpus) load_cpus=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "http-compare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
cobalt="$root/target/release/cobalt"
out="$root/bench/results/http-compare-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"
(cd "$root" && cargo build --release -q -p cobalt-cli) || { echo "http-compare.sh: build failed" >&2; exit 1; }

if ss -Hltun "sport = :$port" 2>/dev/null | grep -q .; then
  echo "http-compare.sh: port $port is already in use; free it or pass --port" >&2
  exit 1
fi

pid=""
stop() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""; fi; }
trap stop EXIT
skipped=()

# run NAME URI [bench flags...]: benchmarks the running server $pid.
run() {
  local name=$1 uri=$2; shift 2
  for _ in $(seq 40); do
    if [[ $uri == coap* ]]; then "$cobalt" get --timeout 0.5 "$uri" >/dev/null 2>&1 && break
    else python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=0.5)" "$uri" 2>/dev/null && break; fi
    sleep 0.25
  done
  echo "measuring $name" >&2
  taskset -c "$load_cpus" "$cobalt" bench "$uri" -c "$clients" -d "$duration" --warmup 1 --cooldown 1 \
    --quiet --json --server-pid "$pid" "$@" >"$out/$name.json" 2>"$out/$name.log" \
    || skipped+=("$name: cobalt bench failed (see $out/$name.log)")
}

taskset -c "$server_cpus" "$cobalt" serve --bind 127.0.0.1 --port "$port" --shards 1 --log-level warn >"$out/cobalt.server.log" 2>&1 &
pid=$!
run coap-cobalt "coap://127.0.0.1:$port/benchmark"
stop

taskset -c "$server_cpus" "$cobalt" bench-http-responder --bind "127.0.0.1:$port" >"$out/responder.server.log" 2>&1 &
pid=$!
run http-responder-keepalive "http://127.0.0.1:$port/benchmark"
run http-responder-close "http://127.0.0.1:$port/benchmark" --no-keepalive
stop

command -v nginx >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq nginx >/dev/null 2>&1; }
if command -v nginx >/dev/null; then
  prefix="$out/nginx"
  mkdir -p "$prefix/logs"
  sed "s/__PORT__/$port/" "$root/bench/servers/nginx.conf" >"$prefix/nginx.conf"
  taskset -c "$server_cpus" nginx -p "$prefix" -c "$prefix/nginx.conf" -g "daemon off; pid $prefix/nginx.pid;" >"$out/nginx.server.log" 2>&1 &
  pid=$!
  sleep 0.5
  # The worker process does the work; measure its CPU, not the master's.
  worker=$(pgrep -P "$pid" | head -1)
  master=$pid
  pid=${worker:-$master}
  run nginx-keepalive "http://127.0.0.1:$port/benchmark"
  run nginx-close "http://127.0.0.1:$port/benchmark" --no-keepalive
  pid=$master
  stop
  rm -rf "$prefix"
else
  skipped+=("nginx: not installed and could not be installed (apt-get install nginx)")
fi

python3 "$root/bench/report.py" "$out" "CoAP vs HTTP: GET /benchmark, server on CPU $server_cpus, load on CPU $load_cpus, $duration s per step" "${skipped[@]}"
echo "results: $out/README.md and $out/plot.svg" >&2
