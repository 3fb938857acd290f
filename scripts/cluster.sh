#!/usr/bin/env bash
# A Cobalt resource-directory cluster on this machine, in network namespaces:
#
#   host (clients) --veth-- [cbcl-TAG-lb: VIP 10.NET.1.1, nftables balancer, health agent]
#                                  |  bridge 10.NET.2.0/24
#        [cbcl-TAG-rds: redis-server 10.NET.2.2:6379]   [cbcl-TAG-n1..nN: cobalt rd 10.NET.2.1i:5683,
#                                                         metrics 10.NET.2.1i:9100]
#
# The balancer is stateless nftables (bench-measured recipe: shared/research/scale-out.md
# §3): no conntrack; each datagram to VIP:5683 goes to the node that owns bucket
# jhash(saddr . sport) mod 256, with the client's address and port kept (the RD's
# `base`, deduplication and observe need them); the nodes route back through the
# balancer, which rewrites their source to VIP:5683, so notifications and separate
# responses reach the client at any time. DTLS records with a Connection ID
# (VIP:5684, with CLUSTER_PSK_FILE) go to the node named by the CID's first byte
# instead, so a device keeps its session when its NAT gives it a new port. A health agent in the balancer's namespace
# reads every node's /metrics every 0.2 s and gives a dead node's buckets to the live
# ones (only those buckets move; they go back when it recovers). Every node stores
# registrations in the one Redis (`cobalt rd --store`), so any node answers for any
# registration.
#
# Usage (as root; needs iproute2, nftables, redis-server, curl):
#   scripts/cluster.sh up [--nodes N]     bring it up (default 3 nodes) and wait until ready
#   scripts/cluster.sh status             namespaces, processes, health, buckets per node
#   scripts/cluster.sh kill I [--vanish]  SIGKILL node I (a crash: its kernel still answers
#                                         ICMP port unreachable); --vanish also cuts its link
#                                         (a machine gone: its datagrams vanish)
#   scripts/cluster.sh start I            start node I again
#   scripts/cluster.sh down               stop everything and remove it (idempotent)
# Environment: CLUSTER_TAG (1-4 of [a-z0-9], default x: names cbcl-TAG-*), CLUSTER_NET
# (second octet of 10.NET.0.0/16, default 231), COBALT (the cobalt binary; default
# target/release/cobalt, else target/debug/cobalt), CLUSTER_RD_ARGS (more `cobalt rd`
# options for every node, e.g. --lookup-max-age 2), CLUSTER_PSK_FILE (PSKs, one
# identity:key a line: every node also serves coaps://10.NET.1.1/rd with them and
# grants DTLS Connection IDs that start with its number, which the balancer routes
# by). Clients on the host reach the directory at coap://10.NET.1.1/rd from
# 10.NET.1.2 and node I's metrics at
# http://10.NET.2.(10+I):9100/metrics (readiness at /ready); the host's datagrams to a
# node's own address (coap://10.NET.2.(10+I)) go from 10.NET.1.3 through the
# balancer's namespace without balancing (bench/cluster.sh's direct path); state and
# logs are in /tmp/cbcl-TAG/.
#
# A script rather than a `cobalt cluster` subcommand: it is root-only plumbing of
# other engines (iproute2, nftables, Redis) for this machine's tests and benchmarks,
# and a real deployment replaces every piece of it (deploy/README.md); the binary
# stays free of it.
set -euo pipefail

repo_root=$(cd "$(dirname "$0")/.." && pwd)
tag=${CLUSTER_TAG:-x}
net=${CLUSTER_NET:-231}
[[ $tag =~ ^[a-z0-9]{1,4}$ ]] || { echo "CLUSTER_TAG=$tag: give 1-4 of [a-z0-9]" >&2; exit 2; }
[[ $net =~ ^[0-9]+$ ]] && [ "$net" -ge 1 ] && [ "$net" -le 254 ] ||
  { echo "CLUSTER_NET=$net: give 1-254" >&2; exit 2; }

ns_lb=cbcl-$tag-lb
ns_redis=cbcl-$tag-rds
host_if=cbcl-$tag-c      # the host's end of the client link
vip=10.$net.1.1
client_ip=10.$net.1.2
direct_ip=10.$net.1.3    # the host's source towards the nodes themselves: not balanced
bridge_ip=10.$net.2.1
redis_ip=10.$net.2.2
state=/tmp/cbcl-$tag
table=cobalt_cluster
buckets=256
dtls_port=5684
probe_interval=0.2

node_ns() { echo "cbcl-$tag-n$1"; }
node_ip() { echo "10.$net.2.$((10 + $1))"; }
log() { printf '%s\n' "cluster: $*" >&2; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }

find_cobalt() {
  if [ -n "${COBALT:-}" ]; then
    [ -x "$COBALT" ] || die "COBALT=$COBALT is not an executable"
  elif [ -x "$repo_root/target/release/cobalt" ]; then
    COBALT=$repo_root/target/release/cobalt
  elif [ -x "$repo_root/target/debug/cobalt" ]; then
    COBALT=$repo_root/target/debug/cobalt
  else
    die "no cobalt binary: cargo build --release -p cobalt-cli, or set COBALT=/path/to/cobalt"
  fi
}

need() { # the tools to check (default: all that `up` uses)
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, nftables)"
  local tool tools=("$@")
  [ $# -gt 0 ] || tools=(ip nft redis-server curl)
  for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || die "$tool not found: run scripts/install-test-deps.sh"
  done
}

# Runs a daemon in namespace $1 with its pid in $state/$2.pid and output in $state/$2.log.
spawn() {
  local ns=$1 name=$2
  shift 2
  ip netns exec "$ns" "$@" >"$state/$name.log" 2>&1 &
  echo $! >"$state/$name.pid"
}

# Stops the daemon whose pid is in $state/$1.pid (SIGTERM, then SIGKILL after 2 s).
stop() {
  local file=$state/$1.pid pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

wait_for() { # what, tries (0.1 s apart), command...
  local what=$1 tries=$2
  shift 2
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "$what did not get ready (logs in $state/)"
}

# With CLUSTER_PSK_FILE: node $1's DTLS options (coaps on $dtls_port, a 6-byte
# Connection ID whose first byte is the node's number).
dtls_args() {
  [ -f "$state/psk.txt" ] || return 0
  printf -- '--dtls-psk-file %s --dtls-port %s --cid 6 --cid-node-id %02x' "$state/psk.txt" "$dtls_port" "$1"
}

start_node() {
  local i=$1 ip
  ip=$(node_ip "$i")
  find_cobalt
  # After `kill --vanish`: the link back up, and its default route with it.
  ip netns exec "$(node_ns "$i")" ip link set eth0 up
  ip netns exec "$(node_ns "$i")" ip route replace default via "$bridge_ip"
  # shellcheck disable=SC2086 # CLUSTER_RD_ARGS: more `cobalt rd` options, split on spaces
  spawn "$(node_ns "$i")" "node$i" "$COBALT" rd --bind "$ip" --port 5683 \
    --store "redis://$redis_ip:6379" --metrics "$ip:9100" \
    --max-per-peer 100000 --max-registrations 1000000 $(dtls_args "$i") ${CLUSTER_RD_ARGS:-}
  wait_for "node $i" 100 ip netns exec "$ns_lb" curl -sf -o /dev/null --max-time 1 "http://$ip:9100/metrics"
}

# The nftables table of the balancer (in its namespace; the host's ruleset is untouched).
# A DTLS record with a Connection ID (content type 25, RFC 9146: the CID follows the
# 11-byte header of type, version, epoch and sequence number, so its first byte, the
# node id, is at byte 8 + 11 of the UDP datagram) goes to the node of that id while it
# is live (map cid_nodes); every other datagram, and a CID record whose node is not
# in the map (the map lookup fails, so the rule stops there), goes by the hash. So a
# device whose NAT rebinds (a new source port, another bucket) still reaches the node
# that holds its session; after its node died it reaches another, which does not know
# the CID, and the device handshakes again.
balancer_rules() {
  cat <<EOF
table ip $table {
  map buckets { type mark : ipv4_addr; }
  map cid_nodes { typeof @th,152,8 : ip daddr; }
  chain raw_pre {
    type filter hook prerouting priority raw; policy accept;
    iifname "cf" ip daddr $vip udp dport $dtls_port @th,64,8 25 notrack ip daddr set @th,152,8 map @cid_nodes accept
    iifname "cf" ip daddr $vip udp dport { 5683, $dtls_port } notrack meta mark set jhash ip saddr . udp sport mod $buckets seed 0xc0ba17 ip daddr set meta mark map @buckets
    iifname "cf" ip saddr $direct_ip ip daddr 10.$net.2.0/24 notrack
    iifname "br0" ip saddr 10.$net.2.0/24 udp sport { 5683, $dtls_port } notrack
  }
  chain post {
    type filter hook postrouting priority 0; policy accept;
    oifname "cf" ip daddr != $direct_ip ip saddr 10.$net.2.0/24 udp sport { 5683, $dtls_port } ip saddr set $vip
  }
}
EOF
}

# The CID map for the live nodes $@: node i's Connection IDs start with the byte i.
cid_map() {
  local i elements=""
  for i in "$@"; do elements+="${elements:+, }$i : $(node_ip "$i")"; done
  printf 'flush map ip %s cid_nodes\nadd element ip %s cid_nodes { %s }\n' "$table" "$table" "$elements"
}

# The bucket map for the live nodes $@ (of $nodes): bucket b belongs to node
# b mod nodes + 1 while it lives, else to the live node b mod (live count); so a
# death moves only the dead node's buckets. One nft transaction: atomic.
bucket_map() {
  local live=("$@") b home owner elements=""
  for ((b = 0; b < buckets; b++)); do
    home=$((b % nodes + 1))
    if [[ " ${live[*]} " == *" $home "* ]]; then owner=$home; else owner=${live[$((b % ${#live[@]}))]}; fi
    elements+="${elements:+, }$b : $(node_ip "$owner")"
  done
  printf 'flush map ip %s buckets\nadd element ip %s buckets { %s }\n' "$table" "$table" "$elements"
}

# The health agent (runs inside the balancer's namespace): probes each node's /ready
# (200 while it is connected to the store); on a change of the live set rewrites the
# bucket map and logs the time. When no node is ready (the store is down) the nodes
# that answer at all stay live: lookups are still answered from their copies.
agent() {
  nodes=$(cat "$state/nodes")
  local last="" live alive i code
  while true; do
    live=()
    alive=()
    for ((i = 1; i <= nodes; i++)); do
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 0.5 "http://$(node_ip "$i"):9100/ready" || true)
      if [ "$code" = 200 ]; then live+=("$i"); fi
      if [ "$code" = 200 ] || [ "$code" = 503 ]; then alive+=("$i"); fi
    done
    if [ ${#live[@]} -eq 0 ]; then live=("${alive[@]}"); fi
    if [ "${live[*]}" != "$last" ]; then
      if [ ${#live[@]} -gt 0 ]; then
        { bucket_map "${live[@]}"; cid_map "${live[@]}"; } | nft -f -
      else
        nft flush map ip "$table" buckets
        nft flush map ip "$table" cid_nodes
      fi
      echo "$(date +%s.%N) live: ${live[*]}" >>"$state/agent.events"
      echo "${live[*]}" >"$state/live"
      last="${live[*]}"
    fi
    sleep "$probe_interval"
  done
}

up() {
  nodes=3
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=$2; shift ;;
      *) die "unknown option $1 (usage: up [--nodes N])" ;;
    esac
    shift
  done
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 32 ] || die "--nodes $nodes: give 1-32"
  need
  find_cobalt
  ip netns list | grep -q "^$ns_lb\b" && die "cluster $tag is up already (scripts/cluster.sh down first)"
  trap 'log "bringing up failed; tearing down"; down' EXIT
  mkdir -p "$state"
  echo "$nodes" >"$state/nodes"
  if [ -n "${CLUSTER_PSK_FILE:-}" ]; then
    cp "$CLUSTER_PSK_FILE" "$state/psk.txt" || die "CLUSTER_PSK_FILE=$CLUSTER_PSK_FILE cannot be read"
  fi

  # Balancer: the client link (host side $client_ip, VIP on its end) and the bridge.
  ip netns add "$ns_lb"
  ip netns exec "$ns_lb" ip link set lo up
  ip netns exec "$ns_lb" sysctl -qw net.ipv4.ip_forward=1
  ip link add "$host_if" type veth peer name cf netns "$ns_lb"
  ip addr add "$client_ip/24" dev "$host_if"
  ip addr add "$direct_ip/24" dev "$host_if"
  ip link set "$host_if" up
  # The nodes themselves (metrics; CoAP not balanced, for benchmarks), reachable
  # from the host through the balancer's namespace, from $direct_ip.
  ip route add "10.$net.2.0/24" via "$vip" dev "$host_if" src "$direct_ip"
  ip netns exec "$ns_lb" ip addr add "$vip/24" dev cf
  ip netns exec "$ns_lb" ip link set cf up
  ip netns exec "$ns_lb" ip link add br0 type bridge
  ip netns exec "$ns_lb" ip addr add "$bridge_ip/24" dev br0
  ip netns exec "$ns_lb" ip link set br0 up
  balancer_rules | ip netns exec "$ns_lb" nft -f -

  # One namespace on the bridge for Redis and one per node, routed via the balancer.
  attach() { # namespace, address, link name in the balancer
    ip netns add "$1"
    ip netns exec "$1" ip link set lo up
    ip link add "$3" netns "$ns_lb" type veth peer name eth0 netns "$1"
    ip netns exec "$ns_lb" ip link set "$3" master br0 up
    ip netns exec "$1" ip addr add "$2/24" dev eth0
    ip netns exec "$1" ip link set eth0 up
    ip netns exec "$1" ip route add default via "$bridge_ip"
  }
  attach "$ns_redis" "$redis_ip" rds
  # No password on this private bridge, so protected mode (loopback only) is off.
  spawn "$ns_redis" redis redis-server --bind "$redis_ip" --port 6379 --save "" --appendonly no \
    --protected-mode no
  wait_for redis-server 50 ip netns exec "$ns_redis" sh -c "redis-cli -h $redis_ip ping | grep -q PONG"
  local i
  for ((i = 1; i <= nodes; i++)); do
    attach "$(node_ns "$i")" "$(node_ip "$i")" "n$i"
    start_node "$i"
  done
  spawn "$ns_lb" agent bash "$0" agent
  wait_for "the health agent" 100 grep -q "^$(seq -s ' ' 1 "$nodes")\$" "$state/live"
  trap - EXIT
  log "up: $nodes nodes behind coap://$vip/rd (clients on the host, from $client_ip); status: $0 status"
}

down() {
  local ns i
  stop agent
  if [ -f "$state/nodes" ]; then
    for ((i = 1; i <= $(cat "$state/nodes"); i++)); do stop "node$i"; done
  fi
  stop redis
  # Anything still running in our namespaces (e.g. a node whose pid file was lost).
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^cbcl-$tag-" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
  ip link del "$host_if" 2>/dev/null || true
  rm -rf "$state"
  log "down: nothing of cluster $tag is left"
}

status() {
  if ! ip netns list | grep -q "^$ns_lb\b"; then echo "cluster $tag: down"; return 0; fi
  local nodes i pid ip served page
  nodes=$(cat "$state/nodes")
  echo "cluster $tag: coap://$vip/rd, $nodes nodes, redis $redis_ip:6379 (pid $(cat "$state/redis.pid" 2>/dev/null || echo -))"
  echo "live (health agent): $(cat "$state/live" 2>/dev/null)"
  for ((i = 1; i <= nodes; i++)); do
    ip=$(node_ip "$i")
    pid=$(cat "$state/node$i.pid" 2>/dev/null || echo -)
    if page=$(ip netns exec "$ns_lb" curl -sf --max-time 1 "http://$ip:9100/metrics"); then
      served=$(awk '/^cobalt_requests_total/ {s += $NF} END {print s + 0}' <<<"$page")
    else
      served="- (no metrics)"
    fi
    echo "node $i: $ip pid $pid, requests $served, buckets $(ip netns exec "$ns_lb" nft list map ip "$table" buckets | grep -o ": $ip\b" | wc -l)"
  done
}

kill_node() {
  local file=$state/node$1.pid
  [ -f "$file" ] || die "no node $1 is running"
  case ${2:---crash} in --crash | --vanish) ;; *) die "kill I [--crash|--vanish]" ;; esac
  if [ "${2:-}" = --vanish ]; then ip netns exec "$(node_ns "$1")" ip link set eth0 down; fi
  kill -9 "$(cat "$file")"
  rm -f "$file"
  echo "$(date +%s.%N) killed $1" >>"$state/agent.events"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) need ip; down ;;
  status) status ;;
  kill) [ $# -ge 2 ] || die "usage: kill I [--vanish]"; kill_node "$2" "${3:-}" ;;
  start) [ $# -eq 2 ] || die "usage: start I"; need; start_node "$2" ;;
  agent) agent ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
