#!/usr/bin/env bash
# One-command comparison of CoAP servers with CoAPBench (`cobalt bench`), on loopback:
# Cobalt, libcoap's coap-server, an aiocoap server, a Californium server, and the raw
# recvmmsg/sendmmsg responder (the floor). Each server runs alone, pinned to the server
# CPU(s); the load generator is pinned to the load CPU(s). Writes a markdown table and
# an SVG plot to bench/results/.
#
# Usage: bench/compare.sh [--clients 10,100,1000] [--duration 5] [--server-cpus 1]
#                         [--load-cpus 0] [--port 25700] [--only NAME[,NAME...]]
# Servers that cannot be started (a peer not installed) are reported as skipped.
set -uo pipefail

clients=10,100,1000
duration=5
server_cpus=1
load_cpus=0
port=25700
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --server-cpus) server_cpus=$2; shift 2 ;;
    --load-cpus) load_cpus=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
cobalt="$root/target/release/cobalt"
venv="$root/.venv-peers"
cf_dir="$root/bench/servers/californium"
stamp="$(date -u +%Y%m%d-%H%M%S)"
out="$root/bench/results/compare-$stamp"
mkdir -p "$out"

echo "building cobalt (release)" >&2
(cd "$root" && cargo build --release -q -p cobalt-cli) || { echo "compare.sh: build failed" >&2; exit 1; }

if ss -Hlun "sport = :$port" 2>/dev/null | grep -q .; then
  echo "compare.sh: UDP port $port is already in use (a stray server?); free it or pass --port" >&2
  exit 1
fi

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    server_pid=""
  fi
}
trap stop_server EXIT

# wait_ready PATH: polls the server (bounded: 60 × 0.25 s).
wait_ready() {
  for _ in $(seq 60); do
    if [ -n "$server_pid" ] && ! kill -0 "$server_pid" 2>/dev/null; then return 1; fi
    if "$cobalt" get --timeout 0.5 "coap://127.0.0.1:$port$1" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  return 1
}

# start NAME -- COMMAND...: starts a server pinned to the server CPUs.
start() {
  local name=$1; shift 2
  taskset -c "$server_cpus" "$@" >"$out/$name.server.log" 2>&1 &
  server_pid=$!
}

skipped=()
measure() {
  local name=$1 path=$2
  if ! wait_ready "$path"; then
    skipped+=("$name: did not answer GET $path (see $out/$name.server.log)")
    stop_server
    return
  fi
  echo "measuring $name (pid $server_pid)" >&2
  taskset -c "$load_cpus" "$cobalt" bench "coap://127.0.0.1:$port$path" -c "$clients" \
    -d "$duration" --warmup 1 --cooldown 1 --quiet --json --server-pid "$server_pid" \
    >"$out/$name.json" 2>"$out/$name.bench.log" || skipped+=("$name: cobalt bench failed (see $out/$name.bench.log)")
  stop_server
}

want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

if want cobalt; then
  start cobalt -- "$cobalt" serve --bind 127.0.0.1 --port "$port" --shards 1 --log-level warn
  measure cobalt /benchmark
fi

if want libcoap; then
  if command -v coap-server-notls >/dev/null; then
    start libcoap -- coap-server-notls -A 127.0.0.1 -p "$port" -d 4
    # libcoap's example server has no /benchmark: create it with PUT (-d allows that).
    if wait_ready / && coap-client-notls -B 3 -m put -e "hello world" "coap://127.0.0.1:$port/benchmark" >/dev/null 2>&1; then
      measure libcoap /benchmark
    else
      skipped+=("libcoap: could not create /benchmark with PUT"); stop_server
    fi
  else
    skipped+=("libcoap: coap-server-notls not installed (scripts/install-test-deps.sh)")
  fi
fi

if want aiocoap; then
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import aiocoap' 2>/dev/null; then
    start aiocoap -- "$venv/bin/python" "$root/bench/servers/aiocoap_benchmark.py" "$port"
    measure aiocoap /benchmark
  else
    skipped+=("aiocoap: not installed in .venv-peers (scripts/install-test-deps.sh)")
  fi
fi

if want californium; then
  if [ ! -d "$cf_dir/target/dependency" ] && command -v mvn >/dev/null; then
    echo "building the Californium server (Maven)" >&2
    (cd "$cf_dir" && mvn -q package dependency:copy-dependencies -DincludeScope=runtime) >"$out/californium.build.log" 2>&1
  fi
  if [ -d "$cf_dir/target/dependency" ] && command -v java >/dev/null; then
    start californium -- java -cp "$cf_dir/target/classes:$cf_dir/target/dependency/*" org.cobalt.bench.BenchmarkServer "$port"
    measure californium /benchmark
  else
    skipped+=("californium: needs java and mvn (cd bench/servers/californium && mvn package dependency:copy-dependencies)")
  fi
fi

if want floor; then
  start floor -- "$cobalt" bench-responder --bind "127.0.0.1:$port"
  measure floor /benchmark
fi

python3 "$root/bench/report.py" "$out" "CoAP servers: CON GET /benchmark, server on CPU $server_cpus, load on CPU $load_cpus, $duration s per step" "${skipped[@]}"
echo "results: $out/README.md and $out/plot.svg" >&2
