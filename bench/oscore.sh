#!/usr/bin/env bash
# OSCORE (RFC 8613) against plain CoAP on the same server, in one run: requests per
# second and the server's CPU time per request (user + system, from /proc/PID/stat)
# for CON GET /benchmark at each client count, plain and then protected with one
# OSCORE context (AES-CCM-16-64-128). The server is `cobalt serve --credentials`, so
# both kinds of request pass its OSCORE layer; the load comes from the example
# `oscore_load` (cobalt::Client, closed loop, one task per client).
#
# Each run sends at most 60,000 requests (the load generator stops there: its
# endpoint has 65,536 message IDs, and a reused one within 247 s is a duplicate).
#
# Then EDHOC (RFC 9528, method 3, cipher suite 2): handshakes per second and the
# server's CPU time per handshake (message_1 to message_4 and the OSCORE context), at
# each --edhoc-clients count of clients running handshakes back to back (the example
# `edhoc_load`; a server keeps at most 4 handshakes pending per client address).
#
# Usage: bench/oscore.sh [--clients "10 100"] [--edhoc-clients "1 4"] [--seconds 3]
#                        [--port 5783]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

clients_list="10 100"
edhoc_clients_list="1 4"
seconds=3
port=5783
while [ $# -gt 0 ]; do
  case $1 in
    --clients) clients_list=$2; shift ;;
    --edhoc-clients) edhoc_clients_list=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --port) port=$2; shift ;;
    *) die "unknown argument $1 (see the header of $0)" ;;
  esac
  shift
done
server_cpus=${server_cpus:-0}
client_cpus=${client_cpus:-1}
ready_timeout=${ready_timeout:-20}
setup_pinning
find_cobalt
log "building the load generators (cargo build --release --example oscore_load --example edhoc_load)"
(cd "$repo_root" && cargo build --release -q -p cobalt-oscore --example oscore_load --example edhoc_load)
load="${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/oscore_load"
edhoc_load="${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/edhoc_load"
check_port_free udp "$port"

work=$(mktemp -d)
trap 'stop_server; rm -rf "$work"' EXIT
secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
mkdir -p "$work/server" "$work/client"
# A window of 64: a hundred requests in flight arrive a little out of order.
printf '{"sender-id_hex": "01", "recipient-id_hex": "", "secret_hex": "%s", "window": 64}\n' "$secret" >"$work/server/settings.json"
printf '{"sender-id_hex": "", "recipient-id_hex": "01", "secret_hex": "%s", "window": 64}\n' "$secret" >"$work/client/settings.json"
# The server takes EDHOC too: its identity and the EDHOC client's credential.
"$edhoc_load" --write-credentials "$work" "coap://127.0.0.1:$port"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
server = json.load(open(f"{work}/edhoc-server.json"))
server[":bench"] = {"oscore": {"basedir": "server/"}}
json.dump(server, open(f"{work}/server.json", "w"))
PY
printf '{"coap://127.0.0.1:%s/*": {"oscore": {"basedir": "client/"}}}\n' "$port" >"$work/client.json"

start_server "cobalt serve --credentials" "$work/server.log" \
  "$COBALT" serve --credentials "$work/server.json" --bind 127.0.0.1 --port "$port" --shards 1
wait_ready "cobalt serve" "$COBALT" get "coap://127.0.0.1:$port/benchmark" --timeout 1 ||
  die "the server did not start: $(cat "$work/server.log")"

# The server's CPU time so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
hz=$(getconf CLK_TCK)

printf '%-7s %8s %10s %14s %8s\n' mode clients "req/s" "server µs/req" failed
for clients in $clients_list; do
  for mode in plain oscore; do
    creds=()
    [ "$mode" = oscore ] && creds=("$work/client.json")
    before=$(cpu_ticks)
    result=$(pin_client "$load" "coap://127.0.0.1:$port/benchmark" "$clients" "$seconds" "${creds[@]}")
    after=$(cpu_ticks)
    python3 - "$mode" "$clients" "$before" "$after" "$hz" "$result" <<'PY'
import json, sys
mode, clients, before, after, hz, result = sys.argv[1:]
r = json.loads(result)
cpu_us = (int(after) - int(before)) / int(hz) * 1e6
ok = max(r["ok"], 1)
print(f"{mode:<7} {clients:>8} {r['ok'] / r['seconds']:>10.0f} {cpu_us / ok:>14.1f} {r['failed']:>8}")
PY
  done
done

printf '\n%-7s %8s %12s %16s %8s\n' mode clients "handshakes/s" "server µs/hs" failed
for clients in $edhoc_clients_list; do
  before=$(cpu_ticks)
  result=$(pin_client "$edhoc_load" "coap://127.0.0.1:$port/benchmark" "$clients" "$seconds" "$work/edhoc-client.json")
  after=$(cpu_ticks)
  python3 - "$clients" "$before" "$after" "$hz" "$result" <<'PY'
import json, sys
clients, before, after, hz, result = sys.argv[1:]
r = json.loads(result)
cpu_us = (int(after) - int(before)) / int(hz) * 1e6
ok = max(r["ok"], 1)
print(f"{'edhoc':<7} {clients:>8} {r['ok'] / r['seconds']:>12.0f} {cpu_us / ok:>16.1f} {r['failed']:>8}")
PY
done
log "pinning: $pinning"
