#!/usr/bin/env bash
# The resource-directory cluster of scripts/cluster.sh, measured (root only):
#   - throughput through the VIP at 1, 2, 3... nodes: `cobalt bench` GETs of an
#     endpoint lookup (/rd-lookup/ep?ep=bench, answered from each node's memory) from
#     the host, closed loop; the ratio of each to one node;
#   - the balancer's CPU per request: the same load (one node) to the node's own
#     address, routed through the balancer's namespace without balancing, and to the
#     VIP, alternating; CPU per 2.xx answer from /proc/stat (all cores, softirq
#     included) and, since other work on this machine counts there too, of the
#     processes involved (the node, the load generator: their utime + stime, which
#     here include the packet work the kernel did in their context, the balancer's
#     forwarding and rewriting among it); the difference of the two paths is the
#     balancer's;
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
#          [--cpu-rounds 3] [--failovers 3] [--out bench/results]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"

node_counts=1,2,3
clients=30
seconds=5
rounds=2
cpu_rounds=3
failovers=3
out_dir=$repo_root/bench/results
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) node_counts=$2 ;;
    --clients) clients=$2 ;;
    --seconds) seconds=$2 ;;
    --rounds) rounds=$2 ;;
    --cpu-rounds) cpu_rounds=$2 ;;
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

# CPU ticks of the whole machine from the first line of /proc/stat: busy (user, nice,
# system, irq, softirq, steal) and the kernel's packet work (irq, softirq).
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
irq_ticks() { awk '/^cpu / {print $7 + $8; exit}' /proc/stat; }
# One load run at URI (path label $1) with the node's pid; appends its JSON row.
cpu_run() {
  local path=$1 uri=$2 round=$3 busy0 irq0 busy1 irq1 step
  busy0=$(busy_ticks) irq0=$(irq_ticks)
  step=$("$COBALT" bench "$uri" -c "$clients" -d "$seconds" --warmup 0 --json -q \
    --server-pid "$(cat "/tmp/cbcl-$CLUSTER_TAG/node1.pid")")
  busy1=$(busy_ticks) irq1=$(irq_ticks)
  python3 -c '
import json, os, sys
s = json.loads(sys.argv[1])["steps"][0]
tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
n = s["completed"]
node = s["server_cpu_us_per_req"]
client = s["client_cpu_percent"] / 100 * s["duration_s"] * 1e6 / n
irq = (int(sys.argv[5]) - int(sys.argv[4])) * tick_us / n
print(json.dumps({"kind": "cpu", "path": sys.argv[6], "round": int(sys.argv[7]), "answers": n,
    "lost": s["lost"], "requests_per_s": s["requests_per_s"],
    "machine_us": (int(sys.argv[3]) - int(sys.argv[2])) * tick_us / n,
    "node_us": node, "client_us": client, "softirq_irq_us": irq,
    "own_us": node + client}))' "$step" "$busy0" "$busy1" "$irq0" "$irq1" "$path" "$round" >>"$raw"
}
log "balancer CPU: one node, direct and through the VIP, $cpu_rounds rounds"
bash "$cluster" up --nodes 1 2>/dev/null
"$COBALT" rd register "coap://$vip" --ep bench --lt 3600 >/dev/null
for ((round = 1; round <= cpu_rounds; round++)); do
  cpu_run direct "coap://10.$CLUSTER_NET.2.11/rd-lookup/ep?ep=bench" "$round"
  cpu_run vip "coap://$vip/rd-lookup/ep?ep=bench" "$round"
done
bash "$cluster" down >/dev/null 2>&1

# The failure test uses its own cluster (tag f); its debug build is enough: the times
# are the health agent's probing and CoAP's retransmission, not CPU.
for failure in crash vanish; do
  for ((i = 1; i <= failovers; i++)); do
    log "failover: $failure, run $i"
    (cd "$repo_root" && COBALT_CLUSTER_RESULTS="$raw" COBALT_CLUSTER_FAILURE=$failure \
      COBALT_REQUIRE_NETNS=1 cargo test -q -p cobalt-cli --test cluster a_killed_node >/dev/null 2>&1) ||
      die "the failure test failed (cargo test -p cobalt-cli --test cluster -- --nocapture)"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$raw" "$report" <<EOF
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tp = [r for r in rows if r.get("kind") == "throughput"]
fo = [r for r in rows if "failure" in r]
cpu = [r for r in rows if r.get("kind") == "cpu"]
by_n = {}
for r in tp:
    by_n.setdefault(r["nodes"], []).append(r["requests_per_s"])
one = statistics.mean(by_n[min(by_n)])
out = ["# Resource-directory cluster: throughput and failover ($stamp UTC)", "",
       "Command: \`bench/cluster.sh --nodes $node_counts --clients $clients --seconds $seconds --rounds $rounds --cpu-rounds $cpu_rounds --failovers $failovers\`",
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
if cpu:
    out += ["", "## The balancer's CPU per request", "",
            "One node; the same load ($clients clients, closed loop, ${seconds} s, no warm-up) to the node's own address",
            "(from the host through the balancer's namespace: the same hop, no balancing) and to the VIP (jhash of",
            "address and port, bucket map, destination rewritten; the answer's source rewritten), alternating.",
            "µs of CPU per 2.xx answer. *machine*: /proc/stat, all cores, softirq included: everything this machine ran,",
            "other users' work included. *own*: the node's and the load generator's CPU (utime + stime; this kernel charges",
            "them the softirq work it runs in their context, where it forwards and rewrites these datagrams). *irq+softirq*:",
            "the machine's, for comparison (partly inside *own* already, so not added). Mean over the rounds.", "",
            "| path | rounds | requests/s | machine µs/answer | own µs/answer | node µs | load generator µs | irq+softirq µs |",
            "|---|---|---|---|---|---|---|---|"]
    mean = {}
    for path in ("direct", "vip"):
        rs = [r for r in cpu if r["path"] == path]
        m = {k: statistics.mean(r[k] for r in rs) for k in
             ("requests_per_s", "machine_us", "own_us", "node_us", "client_us", "softirq_irq_us")}
        mean[path] = m
        out.append(f"| {path} | {len(rs)} | {m['requests_per_s']:.0f} | "
                   + ", ".join(f"{r['machine_us']:.1f}" for r in rs) + f" (mean {m['machine_us']:.1f}) | "
                   + ", ".join(f"{r['own_us']:.1f}" for r in rs) + f" (mean {m['own_us']:.1f}) | "
                   f"{m['node_us']:.1f} | {m['client_us']:.1f} | {m['softirq_irq_us']:.1f} |")
    d, v = mean["direct"], mean["vip"]
    out += ["", f"The balancer's added CPU per answer (VIP − direct): {v['machine_us'] - d['machine_us']:+.1f} µs machine-wide,",
            f"{v['own_us'] - d['own_us']:+.1f} µs of the node's and the load generator's (irq + softirq "
            f"{v['softirq_irq_us'] - d['softirq_irq_us']:+.1f} µs); both directions of every exchange cross the balancer."]
if fo:
    out += ["", "## Failover: a node killed, 48 RdClients (about a third on that node) renewing at once", "",
            "Time from the kill to every client's renewal answered (the killed node's clients by another node),",
            "the health agent probing each node's /ready every 0.2 s.", "",
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
open(sys.argv[2], "w").write("\n".join(out).rstrip("\n") + "\n")
EOF
log "wrote $report"
cat "$report"
