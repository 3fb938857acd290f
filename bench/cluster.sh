#!/usr/bin/env bash
# The resource-directory cluster of scripts/cluster.sh, measured (root only):
#   - throughput through the VIP at 1, 2, 3... nodes: `cobalt bench` GETs of an
#     endpoint lookup (/rd-lookup/ep?ep=bench, answered from each node's memory) from
#     the host, closed loop; the ratio of each to one node;
#   - failover: the failure test (cobalt-cli/tests/cluster.rs) run several times for
#     each kind of failure, a process crash (the node's kernel answers ICMP port
#     unreachable) and a vanished machine (its link cut: no answer at all), giving the
#     time from the node's death to every client served again.
# Writes bench/results/cluster-DATE.md (and the raw JSON beside it).
#
# Every node, Redis, the balancer and the load generator share this machine's CPUs,
# so more nodes add no CPU: the ratios show the balancer's spread and overhead, not
# the scaling of a cluster of machines.
#
# Usage: bench/cluster.sh [--nodes 1,2,3] [--clients 30] [--seconds 5] [--rounds 2]
#          [--failovers 3] [--out bench/results]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

node_counts=1,2,3
clients=30
seconds=5
rounds=2
failovers=3
out_dir=$repo_root/bench/results
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) node_counts=$2 ;;
    --clients) clients=$2 ;;
    --seconds) seconds=$2 ;;
    --rounds) rounds=$2 ;;
    --failovers) failovers=$2 ;;
    --out) out_dir=$2 ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
  shift 2
done
[ "$(id -u)" = 0 ] || die "needs root (scripts/cluster.sh makes network namespaces)"
find_cobalt
export COBALT CLUSTER_TAG=b CLUSTER_NET=233
cluster="$repo_root/scripts/cluster.sh"
vip=10.$CLUSTER_NET.1.1
stamp=$(date -u +%Y-%m-%d-%H%M)
mkdir -p "$out_dir"
raw=$out_dir/cluster-$stamp.jsonl
report=$out_dir/cluster-$stamp.md
: >"$raw"
trap 'bash "$cluster" down >/dev/null 2>&1 || true' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

IFS=, read -r -a counts <<<"$node_counts"
for ((round = 1; round <= rounds; round++)); do
  for n in "${counts[@]}"; do
    log "throughput: $n node(s), round $round"
    bash "$cluster" down >/dev/null 2>&1
    bash "$cluster" up --nodes "$n" 2>/dev/null
    "$COBALT" rd register "coap://$vip" --ep bench --lt 3600 >/dev/null
    "$COBALT" bench "coap://$vip/rd-lookup/ep?ep=bench" -c "$clients" -d "$seconds" --json -q |
      python3 -c 'import json,sys; s=json.load(sys.stdin)["steps"][0]; print(json.dumps({"kind": "throughput", "nodes": int(sys.argv[1]), "round": int(sys.argv[2]), "requests_per_s": s["requests_per_s"], "p99_us": s["p99_us"], "lost": s["lost"]}))' \
        "$n" "$round" >>"$raw"
  done
done
bash "$cluster" down >/dev/null 2>&1

# The failure test uses its own cluster (tag f); its debug build is enough: the times
# are the health agent's probing and CoAP's retransmission, not CPU.
for failure in crash vanish; do
  for ((i = 1; i <= failovers; i++)); do
    log "failover: $failure, run $i"
    (cd "$repo_root" && COBALT_CLUSTER_RESULTS="$raw" COBALT_CLUSTER_FAILURE=$failure \
      COBALT_REQUIRE_NETNS=1 cargo test -q -p cobalt-cli --test cluster >/dev/null 2>&1) ||
      die "the failure test failed (cargo test -p cobalt-cli --test cluster -- --nocapture)"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$raw" "$report" <<EOF
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tp = [r for r in rows if r.get("kind") == "throughput"]
fo = [r for r in rows if "failure" in r]
by_n = {}
for r in tp:
    by_n.setdefault(r["nodes"], []).append(r["requests_per_s"])
one = statistics.mean(by_n[min(by_n)])
out = ["# Resource-directory cluster: throughput and failover ($stamp UTC)", "",
       "Command: \`bench/cluster.sh --nodes $node_counts --clients $clients --seconds $seconds --rounds $rounds --failovers $failovers\`",
       "(scripts/cluster.sh: stateless nftables balancer in a namespace, one redis-server, N \`cobalt rd --store redis://\` nodes;",
       "load from the host with \`cobalt bench\`, $clients clients, closed loop, CON GET /rd-lookup/ep?ep=bench, ${seconds} s per run).",
       "Machine: $(nproc) CPUs shared by every node, Redis, the balancer, the load generator and other",
       "users (load average $load_before before, $load_after after): more nodes add no CPU here, so the ratios",
       "show the balancer's spread and overhead, not the scaling of a cluster of machines. Short runs.", "",
       "## Throughput through the VIP", "",
       "| nodes | requests/s per round | mean | ratio to 1 node |", "|---|---|---|---|"]
for n in sorted(by_n):
    m = statistics.mean(by_n[n])
    out.append(f"| {n} | {', '.join(f'{v:.0f}' for v in by_n[n])} | {m:.0f} | {m / one:.2f} |")
out += ["", "## Failover: a node killed, 48 RdClients (about a third on that node) renewing at once", "",
        "Time from the kill to every client's renewal answered (the killed node's clients by another node),",
        "the health agent probing each node's /metrics every 0.2 s.", "",
        "| failure | runs | clients on the killed node | all served after (s) | slowest other client (s) |",
        "|---|---|---|---|---|"]
for kind in ("crash", "vanish"):
    rs = [r for r in fo if r["failure"] == kind]
    if rs:
        moved = ", ".join(str(r["on_killed_node"]) for r in rs)
        served = ", ".join("%.2f" % r["all_served_s"] for r in rs)
        other = max(r["slowest_other_client_s"] for r in rs)
        out.append(f"| {kind} | {len(rs)} | {moved} | {served} | {other:.3f} |")
out += ["", "crash: SIGKILL of the process; the agent's next probe is refused at once. vanish: the node's link",
        "cut as well (a machine gone); the probe waits its 0.5 s timeout. Either way the killed node's clients",
        "are answered at their next retransmission (Cobalt's default FASOR timers) after the buckets moved.", ""]
open(sys.argv[2], "w").write("\n".join(out))
EOF
log "wrote $report"
cat "$report"
