#!/usr/bin/env bash
# Observe fan-out under a burst of changes: starts `cobalt serve` (one shard) on a free
# port, runs cobalt/examples/fanout_flood.rs against its /state resource (observers on
# many loopback addresses, a PUT burst, other clients GETting /benchmark), and prints
# the server's RSS and CPU time afterwards.
#
#   bench/fanout.sh [--cobalt PATH] [fanout_flood arguments...]
#
# Defaults: 10,000 observers on 100 addresses, 2,000 PUTs, 20 other clients, 60 s.
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
    --set limits.max_observers=1000000 >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 0.5
target/release/examples/fanout_flood --server "127.0.0.1:$PORT" \
    --observers 10000 --ips 100 --puts 2000 --probes 20 --seconds 60 "$@"
echo "server: RSS $(ps -o rss= -p $SERVER | tr -d ' ') KiB, CPU time $(ps -o cputime= -p $SERVER | tr -d ' ')"
