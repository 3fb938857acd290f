#!/usr/bin/env bash
# Load generators side by side: `cobalt bench` against a plain closed-loop Go generator
# (bench/go-generator: a goroutine and a UDP socket per client), both driving the raw
# responder (`cobalt bench-responder`), which is pinned to its own CPU and runs for the
# whole comparison. For each of --rounds rounds the Go generator and then each of the
# --io engines of `cobalt bench` (io_uring, epoll) run for --duration seconds each, one
# after the other, pinned to the other CPU, with the same clients, CON GET /benchmark
# and warm-up; only 2.xx answers count. The report gives every round and the medians,
# and each engine's median over the Go generator's. Writes
# bench/results/generator-compare-<date>.md.
#
# Usage: bench/generator-compare.sh [--clients 100] [--duration 10] [--rounds 3]
#          [--io uring,epoll] [--port 5690] [--server-cpus 1] [--client-cpus 0]
#          [--out bench/results]
# Needs Go (the generator is built from bench/go-generator, standard library only).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

clients=100
duration=10
rounds=3
io=uring,epoll
port=5690
server_cpus=1
client_cpus=0
out_dir=$repo_root/bench/results
ready_timeout=10
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --rounds) rounds=$2 ;;
    --io) io=$2 ;;
    --port) port=$2 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
go=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$go" ] || die "Go is needed to build bench/go-generator"
command -v python3 >/dev/null || die "python3 is needed to write the report"
find_cobalt
setup_pinning
check_port_free udp "$port"
make_workdir generator-compare
log "building bench/go-generator"
(cd "$bench_dir/go-generator" && "$go" build -o "$work/go-generator" .) || die "go build failed"

start_server "bench-responder" "$work/responder.log" "$COBALT" bench-responder --bind "127.0.0.1:$port"
skip_reason=""
wait_ready "bench-responder" "$COBALT" get "coap://127.0.0.1:$port/benchmark" --timeout 1 ||
  die "the responder did not come up: $skip_reason; log: $(log_tail "$work/responder.log")"

IFS=, read -r -a engines <<<"$io"
for round in $(seq 1 "$rounds"); do
  log "round $round of $rounds: go-generator -c $clients -d ${duration}s"
  line=$(pin_client "$work/go-generator" -addr "127.0.0.1:$port" -path benchmark \
    -c "$clients" -d "${duration}s" -warmup 1s -timeout 2s)
  log "  $line"
  printf 'go\t%s\t%s\n' "$round" "${line%% req/s*}" >>"$manifest"
  for engine in "${engines[@]}"; do
    log "round $round of $rounds: cobalt bench --io $engine -c $clients -d $duration"
    json=$work/cobalt-$engine-$round.json
    pin_client "$COBALT" bench "coap://127.0.0.1:$port/benchmark" -c "$clients" -d "$duration" \
      --warmup 1 --timeout 2 --threads 1 --io "$engine" --json -q >"$json" ||
      die "cobalt bench --io $engine failed"
    printf 'cobalt --io %s\t%s\t%s\n' "$engine" "$round" \
      "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"][0]["requests_per_s"])' "$json")" >>"$manifest"
  done
done
stop_server

mkdir -p "$out_dir"
report=$out_dir/generator-compare-$(date -u +%Y-%m-%d-%H%M).md
python3 - "$manifest" "$report" "$(machine_info)" "$pinning" \
  "bench/generator-compare.sh --clients $clients --duration $duration --rounds $rounds --io $io" <<'PY'
import statistics, sys
manifest, report, machine, pinning, command = sys.argv[1:]
runs = {}
for line in open(manifest):
    name, rnd, rate = line.rstrip("\n").split("\t")
    runs.setdefault(name, []).append((int(rnd), float(rate)))
go = statistics.median(r for _, r in runs["go"])
with open(report, "w") as f:
    f.write(f"# Load generators: `cobalt bench` against a goroutine-per-client Go generator\n\n{machine}; {pinning}.\n\n")
    f.write(f"- command: `{command}`\n- target: `cobalt bench-responder` (raw floor, one socket, recvmmsg/sendmmsg), "
            "CON GET /benchmark, 2.xx answers per second only; rounds interleaved (Go, then each engine).\n\n")
    f.write("| generator | " + " | ".join(f"round {r}" for r, _ in runs["go"]) + " | median 2.xx/s | ÷ Go |\n")
    f.write("|---|" + "---|" * (len(runs["go"]) + 2) + "\n")
    for name, rs in runs.items():
        med = statistics.median(r for _, r in rs)
        f.write(f"| {name} | " + " | ".join(f"{r:,.0f}" for _, r in rs) + f" | {med:,.0f} | {med / go:.2f}× |\n")
print(open(report).read())
PY
log "report: $report"
