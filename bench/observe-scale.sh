#!/usr/bin/env bash
# Observe at cloud scale: what one relation costs the server to hold and to notify.
# Starts `cobalt serve` (one shard, limits.max_observers raised) on a free port,
# registers OBSERVERS relations on /state from IPS loopback addresses
# (cobalt/examples/fanout_flood.rs), sends one PUT, and reports
#   - bytes per relation: the server's RSS delta over the registrations / relations,
#   - server CPU per notification: the server process's user+system time from the PUT
#     until the notifications have arrived, over the notifications the observers got
#     (it includes the ACKs of confirmable notifications; no other clients run),
#   - the RSS 3 s after every relation ended (GET without Observe),
#   - the floor: the kernel's CPU per datagram for as many datagrams sent to as many
#     addresses with no CoAP at all (cobalt/examples/send_floor.rs), in the same run.
# The output is kept in bench/results/observe-scale-<date>-<label>.txt.
#
#   bench/observe-scale.sh [--cobalt PATH] [LABEL]
#
# --cobalt PATH: that `cobalt` binary instead of building this checkout's; the tool is
# then FLOOD (default: this checkout's fanout_flood example, built).
# OBSERVERS (default 100000), IPS (default 200), SECONDS_AFTER (default 10),
# SERVE_ARGS (added to `cobalt serve`), FLOOD_ARGS (added to fanout_flood, e.g.
# `--register-seconds 60` for a million) and LINGER_SECONDS (RSS sampled every 10 s for
# that long after the tool ends) change the run. Numbers on a shared 2-core
# machine are noisy (the tool and the server share the cores): run it three times.
set -euo pipefail
cd "$(dirname "$0")/.."
COBALT=target/release/cobalt
FLOOD=${FLOOD:-target/release/examples/fanout_flood}
if [[ "${1:-}" == "--cobalt" ]]; then
    COBALT=$2
    shift 2
else
    cargo build --release -q -p cobalt-cli
fi
SEND_FLOOR=${SEND_FLOOR:-target/release/examples/send_floor}
if [[ "$FLOOD" == target/release/examples/fanout_flood ]]; then
    cargo build --release -q -p cobalt --example fanout_flood
fi
if [[ "$SEND_FLOOR" == target/release/examples/send_floor ]]; then
    cargo build --release -q -p cobalt --example send_floor
fi
LABEL=${1:-$(git rev-parse --short HEAD)}
OBSERVERS=${OBSERVERS:-100000}
IPS=${IPS:-200}
mkdir -p bench/results
OUT=bench/results/observe-scale-$(date -u +%Y-%m-%d-%H%M)-$LABEL.txt
PORT=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
MAX=$((OBSERVERS > 1000000 ? OBSERVERS : 1000000))
"$COBALT" serve --bind 127.0.0.1 --port "$PORT" --shards 1 --log-level warn \
    --set limits.max_observers=$MAX ${SERVE_ARGS:-} >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 0.5
{
    echo "# observe-scale: $OBSERVERS relations on /state from $IPS addresses, one PUT"
    echo "# commit $(git rev-parse --short HEAD) ($LABEL), $(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# server: $COBALT serve --shards 1 --set limits.max_observers=$MAX ${SERVE_ARGS:-}"
    "$FLOOD" --server "127.0.0.1:$PORT" --server-pid "$SERVER" \
        --observers "$OBSERVERS" --ips "$IPS" --puts 1 --probes 0 \
        --seconds "${SECONDS_AFTER:-10}" --deregister ${FLOOD_ARGS:-}
    # The endpoint gives what the burst's exchanges took back at its housekeeping
    # (every quarter of EXCHANGE_LIFETIME, about 62 s): LINGER_SECONDS samples the RSS.
    for ((t = 10; t <= ${LINGER_SECONDS:-0}; t += 10)); do
        sleep 10
        echo "server RSS $t s after the tool ended: $(ps -o rss= -p $SERVER | tr -d ' ') KiB"
    done
    echo "server at the end: RSS $(ps -o rss= -p $SERVER | tr -d ' ') KiB, CPU time $(ps -o cputime= -p $SERVER | tr -d ' ')"
    "$SEND_FLOOR" --datagrams "$OBSERVERS" --ips "$IPS" --bytes "${NOTIFY_BYTES:-25}"
} | tee "$OUT"
echo "kept in $OUT"
