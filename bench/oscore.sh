#!/usr/bin/env bash
# OSCORE (RFC 8613) against plain CoAP and DTLS, and against aiocoap's and
# Californium's OSCORE servers, in one run: requests per second (2.xx answers) and the
# server's CPU time per request (user + system of the server process, from
# /proc/PID/stat, over the run) for CON GET /benchmark at each client count. Every
# row's load comes from the same generator, the example `oscore_load` (cobalt::Client
# on one UDP socket, closed loop, one task per client, single-threaded), with the same
# context material (one random master secret per run, AES-CCM-16-64-128, server
# Sender ID 01, client Sender ID empty):
#   cobalt       `cobalt serve --credentials` (one shard): plain CoAP, OSCORE, and
#                coaps:// with a pre-shared key from the same credentials file (DTLS 1.2)
#   aiocoap      tests/peers/aiocoap_server.py --credentials (OscoreSiteWrapper):
#                plain and OSCORE (skipped without a Python that has aiocoap[oscore])
#   californium  tests/peers/californium OscorePeer server --quiet (cf-oscore): plain and
#                OSCORE (skipped without java and the built peer)
# Each server gets one unrecorded second of OSCORE load first (the JVM's JIT; aiocoap's
# replay window starts uninitialized and is set up through an Echo exchange).
# Answers other than 2.xx are counted by code, apart from the rate. A run sends at most
# 60,000 requests (the generator's message IDs).
#
# Then EDHOC (RFC 9528, method 3, cipher suite 2) on the Cobalt server: handshakes per
# second and the server's CPU time per handshake, at each --edhoc-clients count of
# clients running handshakes back to back (the example `edhoc_load`).
#
# Servers run on CPU 1 and the generator on CPU 0 (taskset; bench/lib.sh's defaults).
# Writes a markdown report (default bench/results/oscore-compare-DATE.md) and prints it.
#
# Usage: bench/oscore.sh [--clients "10 100"] [--edhoc-clients "1 4"] [--seconds 3]
#                        [--port 5783] [--out FILE] [--skip "aiocoap californium"]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

clients_list="10 100"
edhoc_clients_list="1 4"
seconds=3
port=5783
out_file=""
skip_servers=""
while [ $# -gt 0 ]; do
  case $1 in
    --clients) clients_list=$2; shift ;;
    --edhoc-clients) edhoc_clients_list=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --port) port=$2; shift ;;
    --out) out_file=$2; shift ;;
    --skip) skip_servers=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see the header of $0)" ;;
  esac
  shift
done
dtls_port=$((port + 1))
uri=coap://127.0.0.1:$port/benchmark
out_file=${out_file:-$bench_dir/results/oscore-compare-$(date -u +%F).md}
command -v python3 >/dev/null || die "python3 is needed to write the report"
setup_pinning
find_cobalt
log "building the load generators (cargo build --release -p cobalt-oscore --features vendored-openssl --example oscore_load --example edhoc_load)"
(cd "$repo_root" && cargo build --release -q -p cobalt-oscore --features vendored-openssl \
  --example oscore_load --example edhoc_load)
load="${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/oscore_load"
edhoc_load="${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/edhoc_load"
check_port_free udp "$port"
check_port_free udp "$dtls_port"

make_workdir oscore
rows=$work/rows.tsv
: >"$rows"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# The context material, written for every server and client.
secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
psk_key=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# context_dir DIR SENDER RECIPIENT: an aiocoap-style context directory (a window of
# 64: a hundred requests in flight arrive a little out of order).
context_dir() {
  mkdir -p "$1"
  printf '{"sender-id_hex": "%s", "recipient-id_hex": "%s", "secret_hex": "%s", "window": 64}\n' \
    "$2" "$3" "$secret" >"$1/settings.json"
}
# client_file NAME: a fresh client context (sequence numbers from 0) for one server,
# in $work/NAME.json.
client_file() {
  context_dir "$work/$1" "" 01
  printf '{"coap://127.0.0.1:%s/*": {"oscore": {"basedir": "%s/"}}}\n' "$port" "$1" >"$work/$1.json"
}
context_dir "$work/cobalt-server" 01 ""
context_dir "$work/aiocoap-server" 01 ""
printf '{"coaps://127.0.0.1:%s/*": {"dtls": {"client-identity": {"ascii": "bench"}, "psk": {"hex": "%s"}}}}\n' \
  "$dtls_port" "$psk_key" >"$work/dtls-client.json"
# aiocoap reads a basedir from its working directory: an absolute path.
printf '{":bench": {"oscore": {"basedir": "%s/aiocoap-server/"}}}\n' "$work" >"$work/aiocoap-server.json"
# Cobalt's server takes OSCORE, the DTLS key and EDHOC (its identity and the EDHOC
# client's credential) from one file.
"$edhoc_load" --write-credentials "$work" "coap://127.0.0.1:$port"
python3 - "$work" "$psk_key" <<'PY'
import json, sys
work, psk = sys.argv[1:]
server = json.load(open(f"{work}/edhoc-server.json"))
server[":bench"] = {"oscore": {"basedir": "cobalt-server/"}}
server[":bench-dtls"] = {"dtls": {"client-identity": {"ascii": "bench"}, "psk": {"hex": psk}}}
json.dump(server, open(f"{work}/cobalt-server.json", "w"))
PY

hz=$(getconf CLK_TCK)
# The server's CPU time so far, in clock ticks (utime + stime of the process, all threads).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server_pid/stat" 2>/dev/null || echo gone; }

# measure SERVER MODE CLIENTS URI [CREDENTIALS]: one row of $rows (the generator's JSON
# and the server's CPU ticks over it), or a skipped row when the generator failed.
measure() {
  local server=$1 mode=$2 clients=$3 uri=$4 before after result load_cpu
  shift 4
  log "$server $mode, $clients clients: oscore_load $uri $clients $seconds $*"
  before=$(cpu_ticks)
  # The generator's own CPU time (user and system seconds), from bash's time.
  if ! { TIMEFORMAT='%3U %3S' && time pin_client "$load" "$uri" "$clients" "$seconds" "$@" \
    >"$work/load.out" 2>"$work/load.err"; } 2>"$work/load.time"; then
    printf '%s\t%s\t%s\tskip\tthe generator failed: %s\n' "$server" "$mode" "$clients" \
      "$(log_tail "$work/load.err")" >>"$rows"
    return 0
  fi
  result=$(cat "$work/load.out")
  load_cpu=$(awk '{print $1 + $2}' "$work/load.time")
  after=$(cpu_ticks)
  if [ "$before" = gone ] || [ "$after" = gone ]; then
    printf '%s\t%s\t%s\tskip\tthe server exited: %s\n' "$server" "$mode" "$clients" \
      "$(log_tail "$work/server.log")" >>"$rows"
    return 0
  fi
  printf '%s\t%s\t%s\tok\t%s\t%s\t%s\t%s\n' "$server" "$mode" "$clients" "$result" "$((after - before))" "$hz" \
    "$load_cpu" >>"$rows"
}

# skip_server SERVER REASON: a row saying why SERVER was not measured.
skip_server() {
  log "skipped $1: $2"
  printf '%s\tall\t-\tskip\t%s\n' "$1" "$2" >>"$rows"
}

# bench_server SERVER MODES...: waits for the server just started, warms it up with
# OSCORE, measures each MODE (plain, oscore, dtls) at each client count, stops it.
bench_server() {
  local server=$1 mode clients
  shift
  skip_reason=""
  if ! wait_ready "$server" ready_check; then
    skip_server "$server" "$skip_reason; log: $(log_tail "$work/server.log")"
    stop_server
    return 0
  fi
  client_file "$server-client"
  pin_client "$load" "$uri" 10 1 "$work/$server-client.json" >/dev/null 2>&1 || true
  for clients in $clients_list; do
    for mode in "$@"; do
      case $mode in
        plain) measure "$server" "$mode" "$clients" "$uri" ;;
        oscore) measure "$server" "$mode" "$clients" "$uri" "$work/$server-client.json" ;;
        dtls) measure "$server" "$mode" "$clients" "coaps://127.0.0.1:$dtls_port/benchmark" "$work/dtls-client.json" ;;
      esac
    done
  done
  stop_server
  check_port_free udp "$port"
}

skipped() { [[ " $skip_servers " == *" $1 "* ]]; }

# Cobalt.
start_server "cobalt serve --credentials" "$work/server.log" \
  "$COBALT" serve --credentials "$work/cobalt-server.json" --bind 127.0.0.1 --port "$port" \
  --dtls-port "$dtls_port" --shards 1 --log-level error
wait_ready "cobalt serve" ready_check ||
  die "the Cobalt server did not start: $(cat "$work/server.log")"
# EDHOC first, on the same server (bench_server stops it).
hs_rows=$work/edhoc.tsv
: >"$hs_rows"
for clients in $edhoc_clients_list; do
  log "cobalt EDHOC, $clients clients: edhoc_load"
  before=$(cpu_ticks)
  result=$(pin_client "$edhoc_load" "coap://127.0.0.1:$port/benchmark" "$clients" "$seconds" "$work/edhoc-client.json")
  after=$(cpu_ticks)
  printf '%s\t%s\t%s\t%s\n' "$clients" "$result" "$((after - before))" "$hz" >>"$hs_rows"
done
bench_server cobalt plain oscore dtls

# aiocoap.
if skipped aiocoap; then
  skip_server aiocoap "--skip"
elif ! py=$(aiocoap_python); then
  skip_server aiocoap "no python with aiocoap (run scripts/install-test-deps.sh or set AIOCOAP_PYTHON)"
else
  aiocoap_version="aiocoap $("$py" -c 'import importlib.metadata as m; print(m.version("aiocoap"))' 2>/dev/null) on $("$py" --version 2>&1)"
  start_server aiocoap "$work/server.log" "$py" "$repo_root/tests/peers/aiocoap_server.py" \
    --bind 127.0.0.1 --port "$port" --credentials "$work/aiocoap-server.json"
  bench_server aiocoap plain oscore
fi

# Californium: the peer built in this checkout, else in the main checkout of a worktree.
cf_dir=""
main_checkout=$(dirname "$(git -C "$repo_root" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || echo .)")
for d in "$repo_root/tests/peers/californium" "$main_checkout/tests/peers/californium"; do
  if [ -f "$d/target/classpath.txt" ] && [ -d "$d/target/classes" ]; then cf_dir=$d; break; fi
done
if skipped californium; then
  skip_server californium "--skip"
elif [ -z "$cf_dir" ] || ! command -v java >/dev/null; then
  skip_server californium "no java or no built peer in tests/peers/californium (run scripts/install-test-deps.sh)"
else
  cf_version="$(tr ':' '\n' <"$cf_dir/target/classpath.txt" | sed -n 's|.*/\(cf-oscore-[^/]*\)\.jar|\1|p' | head -1) on $(java -version 2>&1 | head -1)"
  start_server californium "$work/server.log" java -cp "$cf_dir/target/classes:$(cat "$cf_dir/target/classpath.txt")" \
    org.cobalt.peers.OscorePeer server --secret "$secret" --sender 01 --recipient "" --port "$port" --quiet
  bench_server californium plain oscore
fi

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p "$(dirname "$out_file")"
REPORT_DATE=$(date -u +'%F %H:%M UTC') REPORT_MACHINE=$(machine_info) \
  REPORT_LOAD="$load_before before, $load_after after" REPORT_PINNING=$pinning \
  REPORT_COMMIT="$(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo_root" diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes')" \
  REPORT_SECONDS=$seconds REPORT_AIOCOAP=${aiocoap_version:-not run} REPORT_CALIFORNIUM=${cf_version:-not run} \
  python3 - "$rows" "$hs_rows" "$out_file" <<'PY'
import json, os, sys
rows_file, hs_file, out = sys.argv[1:]
meta = {k[len("REPORT_"):].lower(): v for k, v in os.environ.items() if k.startswith("REPORT_")}
lines = [f"# OSCORE vs plain CoAP and DTLS, and vs aiocoap's and Californium's OSCORE ({meta['date'][:10]})", ""]
lines += [
    f"Written by `bench/oscore.sh` at {meta['date']} (commit {meta['commit']}), {meta['seconds']} s per row.",
    f"Machine: {meta['machine']}; load average {meta['load']}; {meta['pinning']}.",
    f"Peers: {meta['aiocoap']}; {meta['californium']}.",
    "",
    "CON GET /benchmark from the `oscore_load` example (one socket, one thread, closed loop) with",
    "one OSCORE context (AES-CCM-16-64-128) or a DTLS pre-shared key. req/s counts 2.xx answers;",
    "server µs/req is the server process's user + system CPU time over the row divided by",
    "its 2.xx answers; server CPU % and generator CPU % are each process's CPU time over",
    "the row's wall time. A server below 100 % did not set the rate: the generator (one",
    "thread) or the other work on the two CPUs did (where neither process reaches 100 %,",
    "other processes on the pinned CPUs took the rest: see the load average), and the",
    "server woke for a few requests at a time, so its µs/req include a wake-up's system",
    "calls per few requests (more than a saturated server spends per request). The",
    "µs/req, not req/s, are what compare servers here. Clients are tasks of one client",
    "endpoint (one socket; for DTLS one session, set up in the row).",
    "",
    "| server | mode | clients | req/s | server µs/req | server CPU % | generator CPU % | other answers |",
    "|---|---|---|---|---|---|---|---|",
]
per_req = {}
for line in open(rows_file):
    f = line.rstrip("\n").split("\t")
    server, mode, clients, status = f[:4]
    if status != "ok":
        lines.append(f"| {server} | {mode} | {clients} | – | – | – | – | not measured: {f[4]} |")
        continue
    r = json.loads(f[4]); ticks, hz, load_cpu_s = int(f[5]), int(f[6]), float(f[7])
    cpu_s = ticks / hz
    ok = r["ok"]
    us = cpu_s * 1e6 / ok if ok else float("nan")
    per_req[(server, mode, clients)] = us
    other = ", ".join(f"{k}: {v}" for k, v in r.get("failures", {}).items()) or "none"
    lines.append(f"| {server} | {mode} | {clients} | {ok / r['seconds']:,.0f} | {us:.1f} | {100 * cpu_s / r['seconds']:.0f} | {100 * load_cpu_s / r['seconds']:.0f} | {other} |")

lines += ["", "## The goals of issue 25", ""]
for clients in sorted({k[2] for k in per_req}, key=int):
    plain, oscore = per_req.get(("cobalt", "plain", clients)), per_req.get(("cobalt", "oscore", clients))
    if plain and oscore:
        ratio = oscore / plain
        lines.append(f"- {clients} clients: Cobalt OSCORE ÷ plain per request = {ratio:.2f} "
                     f"({'met' if ratio <= 2 else 'NOT met'}: goal ≤ 2).")
    dtls = per_req.get(("cobalt", "dtls", clients))
    if oscore and dtls:
        lines.append(f"- {clients} clients: Cobalt OSCORE ÷ DTLS per request = {oscore / dtls:.2f}.")
    for peer in ("aiocoap", "californium"):
        theirs = per_req.get((peer, "oscore", clients))
        if oscore and theirs:
            lines.append(f"- {clients} clients: Cobalt OSCORE {oscore:.1f} µs/req vs {peer} {theirs:.1f} µs/req "
                         f"({theirs / oscore:.1f}× Cobalt's; {'met' if oscore < theirs else 'NOT met'}: goal faster).")
        elif oscore:
            lines.append(f"- {clients} clients: {peer} OSCORE not measured in this run.")

hs = [l.rstrip("\n").split("\t") for l in open(hs_file) if l.strip()]
if hs:
    lines += ["", "## EDHOC on the Cobalt server", "",
              "Handshakes (method 3, suite 2, message_1 to message_4 and the OSCORE context) back to back",
              "per client, the example `edhoc_load`.", "",
              "| clients | handshakes/s | server µs/handshake | failed |", "|---|---|---|---|"]
    for clients, result, ticks, hz in hs:
        r = json.loads(result)
        ok = max(r["ok"], 1)
        lines.append(f"| {clients} | {r['ok'] / r['seconds']:,.0f} | {int(ticks) / int(hz) * 1e6 / ok:,.0f} | {r['failed']} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
log "report: $out_file"
