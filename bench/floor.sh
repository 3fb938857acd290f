#!/usr/bin/env bash
# Cobalt against the raw UDP floor at every number of peers.
#
# For each client count, alternates `cobalt serve --shards 1` (default configuration,
# bound to 127.0.0.1) and `cobalt bench-responder` (recvmmsg/sendmmsg, no CoAP state:
# the floor), ROUNDS times each, on the same port, each driven by `cobalt bench`
# (CON GET /benchmark, closed loop) pinned to the other CPU. Prints and writes
# bench/results/floor-<date>.md: server CPU µs per 2.xx answer, the median over the
# rounds, for both servers side by side and their ratio. Non-2.xx answers, losses and
# errors are reported in their own columns and not counted as answers.
#
# --profile COUNTS adds, at those client counts, one more run of each server under
# `perf record` and a table of where the server's CPU went: kernel against user space,
# and the user-space functions that took most samples.
#
# Usage: bench/floor.sh [--clients 10,100,1000,10000,50000] [--duration 10]
#          [--long-duration 60] [--long-from 10000] [--rounds 3] [--port 5683]
#          [--profile 1000,10000] [--server-cpus 1] [--client-cpus 0] [--out bench/results]
# --long-duration applies from --long-from clients up (minutes there reach steady state).
# Above --per-generator clients (default 15000, under a typical 20,000 open-file limit)
# the load comes from several local `cobalt bench worker` processes (one socket per
# client each); more clients than the ephemeral port range holds need a wider
# net.ipv4.ip_local_port_range, which the script sets for the run (root) and restores.
# Environment: COBALT=/path/to/cobalt skips the cargo build.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=10,100,1000,10000,50000
duration=10
long_duration=60
long_from=10000
rounds=3
port=5683
profile=""
per_generator=15000

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --port) port=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --long-duration) long_duration=$2; shift 2 ;;
    --long-from) long_from=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --per-generator) per_generator=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
if [ -n "$profile" ]; then
  command -v perf >/dev/null || die "--profile needs perf (Debian: apt-get install linux-perf)"
fi

prepare_run
check_port_free udp "$port"
make_workdir floor
all_clients=$clients
short_duration=$duration
# set_duration COUNT: the run length for COUNT clients.
set_duration() {
  if [ "$1" -ge "$long_from" ]; then duration=$long_duration; else duration=$short_duration; fi
}
uri="coap://127.0.0.1:$port/benchmark"

# Local load generators for counts above $per_generator: `generators COUNT` starts
# enough `cobalt bench worker`s (pinned like the generator) and sets worker_args.
worker_pids=()
worker_args=()
stop_generators() {
  if [ "${#worker_pids[@]}" -gt 0 ]; then kill "${worker_pids[@]}" 2>/dev/null || true; fi
  worker_pids=()
  worker_args=()
}
generators() {
  local n=$1 k i list=""
  stop_generators
  [ "$n" -gt "$per_generator" ] || return 0
  k=$(((n + per_generator - 1) / per_generator))
  for i in $(seq 1 "$k"); do
    # exec, so that $! is the worker itself (what stop_generators ends).
    {
      set -- "$COBALT" bench worker --listen "127.0.0.1:$((port + 1000 + i))"
      if [ -n "$client_cpus" ]; then exec taskset -c "$client_cpus" "$@"; else exec "$@"; fi
    } >"$work/worker-$i.log" 2>&1 &
    worker_pids+=($!)
    list+="${list:+,}127.0.0.1:$((port + 1000 + i))"
  done
  sleep 0.5
  worker_args=(--workers "$list")
}
# Enough ephemeral ports for the largest count (each client has its own socket).
port_range_saved=""
widen_port_range() {
  local most=0 n lo hi
  for n in "${counts[@]}"; do [ "$n" -gt "$most" ] && most=$n; done
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range || return 0
  [ $((hi - lo)) -gt $((most + 1000)) ] && return 0
  [ $((65535 - 1024)) -gt $((most + 1000)) ] ||
    die "$most clients need more source ports than one address has"
  port_range_saved="$lo $hi"
  sysctl -qw net.ipv4.ip_local_port_range="1024 65535" 2>/dev/null ||
    die "$most clients need more than the $((hi - lo)) ephemeral ports of net.ipv4.ip_local_port_range ($lo-$hi): widen it (as root: sysctl -w net.ipv4.ip_local_port_range='1024 65535')"
  log "widened net.ipv4.ip_local_port_range from $lo-$hi to 1024-65535 for the run"
}
restore_port_range() {
  stop_generators
  if [ -n "$port_range_saved" ]; then
    sysctl -qw net.ipv4.ip_local_port_range="$port_range_saved" || true
  fi
}
trap 'restore_port_range; cleanup' EXIT

# start NAME: starts one of the two servers on $port.
start() {
  case $1 in
    cobalt) start_server cobalt "$work/server.log" "$COBALT" serve --bind 127.0.0.1 \
      --port "$port" --shards 1 --log-level error ;;
    floor) start_server floor "$work/server.log" "$COBALT" bench-responder \
      --bind "127.0.0.1:$port" ;;
  esac
  wait_ready "$1" ready_check || die "$1 did not start: $skip_reason; $(log_tail "$work/server.log")"
}

# The sweep: every count, every round, cobalt then the floor.
results=$work/runs.tsv
IFS=, read -r -a counts <<<"$all_clients"
widen_port_range
for n in "${counts[@]}"; do
  clients=$n
  set_duration "$n"
  generators "$n"
  for r in $(seq 1 "$rounds"); do
    for s in cobalt floor; do
      start "$s"
      json=$work/$s-$n-$r.json
      run_bench "$s round $r" "$uri" "$json" --timeout 5 "${worker_args[@]}"
      printf '%s\t%s\t%s\t%s\n' "$s" "$n" "$r" "$json" >>"$results"
      stop_server
      check_port_free udp "$port"
    done
  done
done

# The profiles: one run of each server under perf at each asked count.
profiles=$work/profiles.tsv
: >"$profiles"
if [ -n "$profile" ]; then
  IFS=, read -r -a pcounts <<<"$profile"
  for n in "${pcounts[@]}"; do
    clients=$n
    set_duration "$n"
    generators "$n"
    for s in cobalt floor; do
      start "$s"
      data=$work/perf-$s-$n.data
      perf record -q -F 999 -g -p "$server_pid" -o "$data" >/dev/null 2>&1 &
      perf_pid=$!
      run_bench "$s under perf" "$uri" "$work/perf-$s-$n.json" --timeout 5 "${worker_args[@]}"
      kill -INT "$perf_pid" 2>/dev/null || true
      wait "$perf_pid" 2>/dev/null || true
      perf report -i "$data" --no-children --sort dso,sym --stdio -q 2>/dev/null \
        >"$work/perf-$s-$n.txt" || true
      printf '%s\t%s\t%s\n' "$s" "$n" "$work/perf-$s-$n.txt" >>"$profiles"
      stop_server
      check_port_free udp "$port"
    done
  done
fi

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
report=$out_dir/floor-$stamp.md
python3 "$bench_dir/floor_report.py" --runs "$results" --profiles "$profiles" \
  --command "bench/floor.sh --clients $all_clients --duration $short_duration --long-duration $long_duration --long-from $long_from --rounds $rounds${profile:+ --profile $profile}" \
  --setup "loopback 127.0.0.1 UDP, CON GET /benchmark (11-byte \"hello world\"), closed loop; $pinning" \
  --machine "$(machine_info)" --cobalt-version "$("$COBALT" --version)" >"$report"
cat "$report"
log "wrote $report"
