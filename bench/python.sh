#!/usr/bin/env bash
# Python handlers: a Cobalt server whose handler is a Python async function (the cobalt
# package, cobalt-python: bench/servers/cobalt_python_benchmark.py) against an aiocoap
# server with the same handler (bench/servers/aiocoap_benchmark.py), with CoAPBench.
#
# Starts each server on loopback pinned to its CPU(s), drives it with `cobalt bench
# --server-pid PID --json` pinned to the other CPU(s), and writes
# bench/results/python-<date>.md (table) and .svg: requests/s and server CPU µs per
# request (every thread of the server process: Cobalt's shard and runtime threads and
# the Python event loop).
#
# Usage: bench/python.sh [--clients 10,100] [--duration 5] [--port 5683] [--shards 1]
#          [--server-cpus 1] [--client-cpus 0] [--servers cobalt-python,aiocoap]
#          [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt skips the cargo build of the load generator;
# COBALT_PYTHON=/path/to/python uses an interpreter that has the cobalt package (else
# it is built with `maturin develop --release` into .venv-python, which
# scripts/install-test-deps.sh makes); AIOCOAP_PYTHON as for bench/compare.sh.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=10,100
duration=5
port=5683
shards=1
servers=cobalt-python,aiocoap

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --port) port=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
check_port_free udp "$port"
make_workdir python

# The interpreter with the cobalt package, built for release unless given.
cobalt_python() {
  if [ -n "${COBALT_PYTHON:-}" ]; then
    echo "$COBALT_PYTHON"
    return 0
  fi
  local venv=$repo_root/.venv-python
  [ -x "$venv/bin/maturin" ] || return 1
  log "building the cobalt Python package (maturin develop --release)"
  (cd "$repo_root/cobalt-python" && VIRTUAL_ENV=$venv "$venv/bin/maturin" develop --release --quiet) \
    >"$work/maturin.log" 2>&1 || return 1
  echo "$venv/bin/python"
}

uri="coap://127.0.0.1:$port/benchmark"

IFS=, read -r -a server_list <<<"$servers"
for s in "${server_list[@]}"; do
  server_pid=""
  case $s in
    cobalt-python)
      label="cobalt (Python handler)"
      if ! py=$(cobalt_python); then
        record_skip "$label" "no cobalt package: set COBALT_PYTHON, or run scripts/install-test-deps.sh for .venv-python ($(log_tail "$work/maturin.log"))" "cobalt-python"
        continue
      fi
      desc="cobalt-python, $shards shard(s), async def handler on $("$py" --version 2>&1)"
      start_server "$label" "$work/server.log" "$py" "$bench_dir/servers/cobalt_python_benchmark.py" 127.0.0.1 "$port" "$shards"
      bench_one "$label" "$desc"
      ;;
    aiocoap)
      bench_aiocoap aiocoap "async def handler"
      ;;
    *) record_skip "$s" "unknown server name (known: cobalt-python, aiocoap)" "$s" ;;
  esac
done

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
python3 "$bench_dir/report.py" \
  --title "Python handlers: Cobalt (cobalt-python) and aiocoap with CoAPBench" \
  --manifest "$manifest" \
  --md "$out_dir/python-$stamp.md" --svg "$out_dir/python-$stamp.svg" \
  --command "bench/python.sh --clients $clients --duration $duration --shards $shards" \
  --setup "loopback 127.0.0.1 UDP port $port, CON GET /benchmark (11-byte \"hello world\" from an async def handler), closed loop; $pinning" \
  --machine "$(machine_info)"
log "wrote $out_dir/python-$stamp.md and .svg"
