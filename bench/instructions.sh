#!/usr/bin/env bash
# Instructions per request: two builds of cobalt compared where CPU time is too noisy.
#
# A shared machine's CPU time per request varies by ±30 % between runs; the number of
# user-space instructions the server executes per request does not. For each build and
# transport, starts `cobalt serve --shards 1` under valgrind's callgrind, drives it with
# `cobalt bench -c CLIENTS -d SECONDS` (of build A) and reads the instructions callgrind
# counted (user space only: the kernel's UDP/TCP path is not in it), per 2.xx answer.
# Server and generator are pinned to one CPU each. A server started
# and stopped without load gives the start-up cost, which is subtracted. Rounds
# alternate A and B. Needs valgrind (Debian: valgrind).
#
# Usage: bench/instructions.sh --a PATH --b PATH [--schemes coap,coaps,coap+tcp,coap+ws]
#          [--clients 10] [--seconds 10] [--rounds 2] [--label-a NAME] [--label-b NAME]
#          [--path /benchmark] [--path-b PATH] [--port 5683] [--dtls-port 5684]
#          [--ws-port 8080] [--out bench/results]
# --path: the resource asked of both builds; --path-b: another one asked of B (e.g. A
# and B the same build, --path /benchmark/static --path-b /benchmark/1: `cobalt serve`
# answers both like /benchmark, the second through a route with a parameter).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

schemes=coap,coaps,coap+tcp,coap+ws
clients=10
seconds=10
rounds=2
host=127.0.0.1
port=5683
dtls_port=5684
ws_port=8080
a="" b="" label_a=A label_b=B path_a=/benchmark path_b=""
while [ $# -gt 0 ]; do
  case $1 in
    --a) a=$2 ;;
    --b) b=$2 ;;
    --label-a) label_a=$2 ;;
    --label-b) label_b=$2 ;;
    --schemes) schemes=$2 ;;
    --clients) clients=$2 ;;
    --seconds) seconds=$2 ;;
    --rounds) rounds=$2 ;;
    --path) path_a=$2 ;;
    --port) port=$2 ;;
    --dtls-port) dtls_port=$2 ;;
    --ws-port) ws_port=$2 ;;
    --path-b) path_b=$2 ;;
    --out) out_dir=$2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
[ -x "$a" ] || die "--a must name a cobalt binary (got '${a}')"
[ -x "$b" ] || die "--b must name a cobalt binary (got '${b}')"
command -v valgrind >/dev/null || die "valgrind not found (Debian: apt-get install valgrind)"
command -v python3 >/dev/null || die "python3 is needed to write the report"
setup_pinning
check_port_free udp "$port"
check_port_free tcp "$port"
make_workdir instructions
throwaway_psk cobalt-ir
four_transports_serve_args

# count BIN SCHEME SECONDS: prints "INSTRUCTIONS REQUESTS" (SECONDS 0: no load).
count() {
  local bin=$1 scheme=$2 secs=$3 uri reqs=0
  uri=$(uri_of "$scheme")
  scheme_options "$scheme"
  start_server callgrind "$work/server.log" valgrind --tool=callgrind \
    --callgrind-out-file="$work/cg.out" --log-file="$work/vg.log" "$bin" "${serve_args[@]}"
  skip_reason=""
  ready() { "$a" get "$uri" --timeout 1 "${scheme_opts[@]}"; }
  wait_ready callgrind ready || die "the server under valgrind did not come up: $skip_reason; log: $(log_tail "$work/server.log")"
  if [ "$secs" != 0 ]; then
    pin_client "$a" bench "$uri" -c "$clients" -d "$secs" --warmup 0 --timeout 30 --json -q \
      "${scheme_opts[@]}" >"$work/b.json"
    # Only 2.xx answers count.
    reqs=$(python3 -c "import json,sys; s = json.load(open(sys.argv[1]))['steps'][0]; print(s['completed'] - s['non_2xx'])" "$work/b.json")
  fi
  # Under valgrind the server answers before its signal handler is set: a SIGINT at
  # once would end it without callgrind's counts; its shutdown is slow too.
  sleep 2
  stop_server 60
  echo "$(awk '/^summary:/ {print $2; exit}' "$work/cg.out") $reqs"
}

IFS=, read -r -a scheme_list <<<"$schemes"
results=$work/results.tsv
for side in a b; do
  bin=$a; [ "$side" = b ] && bin=$b
  log "start-up cost of $side ($bin)"
  printf 'idle\t%s\t-\t%s\n' "$side" "$(count "$bin" coap 0)" >>"$results"
done
for round in $(seq 1 "$rounds"); do
  for scheme in "${scheme_list[@]}"; do
    for side in a b; do
      bin=$a bench_path=$path_a
      [ "$side" = b ] && bin=$b bench_path=${path_b:-$path_a}
      log "round $round: $scheme, $side ($bench_path)"
      printf '%s\t%s\t%s\t%s\n' "$scheme" "$side" "$round" "$(count "$bin" "$scheme" "$seconds")" >>"$results"
    done
  done
done

mkdir -p "$out_dir"
report=$out_dir/instructions-$(date -u +%Y-%m-%d-%H%M).md
python3 - "$results" "$report" "$label_a" "$label_b" "$a" "$b" "$(machine_info)" \
  "bench/instructions.sh --a $a --b $b --schemes $schemes --clients $clients --seconds $seconds --rounds $rounds --path $path_a${path_b:+ --path-b $path_b}" \
  "CON GET $path_a${path_b:+ of A, $path_b of B}" <<'PY'
import statistics, sys
results, report, la, lb, pa, pb, machine, command, asked = sys.argv[1:]
idle, runs = {}, {}
for line in open(results):
    scheme, side, _, counts = line.rstrip("\n").split("\t")
    ir, reqs = (int(x) for x in counts.split())
    if scheme == "idle":
        idle[side] = ir
    else:
        runs.setdefault((scheme, side), []).append((ir - idle[side]) / reqs)
rows = []
for scheme in dict.fromkeys(s for s, _ in runs):
    a, b = runs[(scheme, "a")], runs[(scheme, "b")]
    ma, mb = statistics.median(a), statistics.median(b)
    show = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)
    rows.append(f"| {scheme} | {ma:,.0f} ({show(a)}) | {mb:,.0f} ({show(b)}) | {mb / ma:.4f} |")
with open(report, "w") as f:
    f.write(f"# Instructions per request: {la} against {lb}\n\n{machine}.\n\n")
    f.write(f"- {la}: `{pa}`\n- {lb}: `{pb}`\n- command: `{command}`\n")
    f.write("- user-space instructions of `cobalt serve --shards 1` under callgrind per 2.xx answer "
            f"({asked}), the start-up cost of an unloaded server subtracted; the kernel's part is not counted.\n\n")
    f.write(f"| transport | {la} (each round) | {lb} (each round) | {lb} ÷ {la} |\n|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(report).read())
PY
log "report: $report"
