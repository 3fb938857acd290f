#!/usr/bin/env bash
# One-command CoAP server comparison with CoAPBench (cobalt bench).
#
# Starts, one at a time on loopback, each server pinned to its own CPU(s):
#   cobalt serve --shards 1, libcoap coap-server-notls, an aiocoap server
#   (bench/servers/aiocoap_benchmark.py), a Californium server
#   (bench/servers/californium, built with Maven on first use) and cobalt bench-responder
#   (the recvmmsg/sendmmsg floor),
# drives each with `cobalt bench --server-pid PID --json` pinned to the other CPU(s), and
# writes bench/results/compare-<date>.md (table) and .svg (req/s and server CPU µs/req
# per server). A server that cannot be started is reported as skipped, with the reason.
#
# Usage: bench/compare.sh [--clients 10,100,1000] [--duration 5] [--port 5683]
#          [--server-cpus 1] [--client-cpus 0] [--servers cobalt,libcoap,aiocoap,californium,floor]
#          [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt skips the cargo build; AIOCOAP_PYTHON=/path/to/python
# picks the interpreter that has aiocoap (default: .venv-peers/bin/python of this checkout,
# or of the main checkout when this is a git worktree, then python3).
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=10,100,1000
duration=5
port=5683
servers=cobalt,libcoap,aiocoap,californium,floor

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --port) port=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
check_port_free udp "$port"

make_workdir compare

uri="coap://127.0.0.1:$port/benchmark"

# Builds the Californium server on first use; prints its class path.
californium_classpath() {
  local dir=$bench_dir/servers/californium
  if [ ! -s "$dir/target/classpath.txt" ] || [ ! -d "$dir/target/classes" ] ||
    [ -n "$(find "$dir/src" "$dir/pom.xml" -newer "$dir/target/classpath.txt" 2>/dev/null)" ]; then
    log "building the Californium server (mvn -q package, first use)"
    (cd "$dir" && mvn -q package dependency:build-classpath \
      -Dmdep.outputFile=target/classpath.txt) >"$work/mvn.log" 2>&1 || return 1
  fi
  echo "$dir/target/classes:$(cat "$dir/target/classpath.txt")"
}

IFS=, read -r -a server_list <<<"$servers"
for s in "${server_list[@]}"; do
  server_pid=""
  case $s in
    cobalt)
      desc="cobalt serve --shards 1 ($("$COBALT" --version))"
      start_server "$s" "$work/server.log" "$COBALT" serve --bind 127.0.0.1 --port "$port" \
        --shards 1 --log-level error
      bench_one "cobalt" "$desc"
      ;;
    libcoap)
      label="libcoap"
      if ! command -v coap-server-notls >/dev/null; then
        record_skip "$label" "coap-server-notls not installed (apt-get install libcoap3-bin)" "libcoap"
        continue
      fi
      ver=$(coap-server-notls -h 2>&1 | sed -n 's/.*coap-server-notls v\([^ ]*\).*/\1/p' | head -1 || true)
      desc="libcoap $ver coap-server-notls; /benchmark created with PUT (-d)"
      # libcoap's example server has no /benchmark; -d lets a PUT create it with the
      # same 11-byte "hello world" payload, which GET then returns.
      start_server "$label" "$work/server.log" coap-server-notls -A 127.0.0.1 -p "$port" -d 4 -v 0
      sleep 0.3
      "$COBALT" put "$uri" -p "hello world" --timeout 5 >/dev/null 2>&1 || true
      bench_one "$label" "$desc"
      ;;
    aiocoap)
      bench_aiocoap aiocoap
      ;;
    californium)
      label="californium"
      if ! command -v java >/dev/null; then
        record_skip "$label" "java not found (install a JDK 17, e.g. apt-get install openjdk-17-jdk-headless)" "Californium"
        continue
      fi
      if ! command -v mvn >/dev/null && [ ! -s "$bench_dir/servers/californium/target/classpath.txt" ]; then
        record_skip "$label" "mvn not found: install Maven (apt-get install maven) so that the script can build bench/servers/californium (mvn -q package dependency:build-classpath -Dmdep.outputFile=target/classpath.txt)" "Californium"
        continue
      fi
      if ! cp=$(californium_classpath); then
        record_skip "$label" "Maven build failed: $(grep -m1 ERROR "$work/mvn.log" | cut -c1-160)" "Californium"
        continue
      fi
      ver=$(printf '%s' "$cp" | tr ':' '\n' | sed -n 's/.*californium-core-\(.*\)\.jar/\1/p')
      desc="Californium $ver on $(java -version 2>&1 | head -1 || true)"
      start_server "$label" "$work/server.log" java -cp "$cp" org.cobalt.bench.BenchmarkServer 127.0.0.1 "$port"
      bench_one "$label" "$desc"
      ;;
    floor)
      desc="cobalt bench-responder: recvmmsg/sendmmsg, no CoAP stack (the floor)"
      start_server "$s" "$work/server.log" "$COBALT" bench-responder --bind "127.0.0.1:$port"
      bench_one "bench-responder (floor)" "$desc"
      ;;
    *) record_skip "$s" "unknown server name (known: cobalt, libcoap, aiocoap, californium, floor)" "$s" ;;
  esac
done

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
python3 "$bench_dir/report.py" \
  --title "CoAP servers compared with CoAPBench" \
  --manifest "$manifest" \
  --md "$out_dir/compare-$stamp.md" --svg "$out_dir/compare-$stamp.svg" \
  --command "bench/compare.sh --clients $clients --duration $duration" \
  --setup "loopback 127.0.0.1 UDP port $port, CON GET /benchmark (11-byte \"hello world\"), closed loop; $pinning" \
  --machine "$(machine_info)"
log "wrote $out_dir/compare-$stamp.md and .svg"
