#!/usr/bin/env bash
# Observe fan-out under a burst of changes: starts `cobalt serve` (one shard) on a free
# port, runs cobalt/examples/fanout_flood.rs against its /state resource (observers on
# many loopback addresses, a PUT burst, other clients GETting /benchmark), and prints
# the server's RSS and CPU time afterwards.
#
#   bench/fanout.sh [--cobalt PATH] [fanout_flood arguments...]
#
# Defaults: 10,000 observers on 100 addresses, 2,000 PUTs, 20 other clients, 60 s.
# SERVE_ARGS adds arguments to `cobalt serve` (e.g. "--set limits.upload_idle_timeout=5s").
# Examples (see cobalt/examples/fanout_flood.rs for every argument):
#   bench/fanout.sh --seconds 30 --deregister          # fan-out, then RSS once the relations end
#   bench/fanout.sh --observers 100000 --puts 0 --seconds 5 --deregister   # observe flood
#   SERVE_ARGS="--set limits.upload_idle_timeout=5s" bench/fanout.sh --upload-flood 20000 --ips 50 --seconds 10
# Numbers on a shared 2-core machine are noisy: the tool and the server share the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
COBALT=target/release/cobalt
if [[ "${1:-}" == "--cobalt" ]]; then
    COBALT=$2
    shift 2
else
    cargo build --release -q -p cobalt-cli
fi
cargo build --release -q -p cobalt --example fanout_flood
PORT=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$COBALT" serve --bind 127.0.0.1 --port "$PORT" --shards 1 --log-level warn \
    --set limits.max_observers=1000000 ${SERVE_ARGS:-} >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 0.5
target/release/examples/fanout_flood --server "127.0.0.1:$PORT" --server-pid "$SERVER" \
    --observers 10000 --ips 100 --puts 2000 --probes 20 --seconds 60 "$@"
echo "server: RSS $(ps -o rss= -p $SERVER | tr -d ' ') KiB, CPU time $(ps -o cputime= -p $SERVER | tr -d ' ')"
