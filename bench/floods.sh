#!/usr/bin/env bash
# Floods against `cobalt serve` (issue 14): for each attack, a fresh server with the
# default configuration and every transport (UDP, DTLS, TCP, TLS, WebSockets), the
# attacker (cobalt-cli/examples/flood.rs) from 127.0.0.2 and legitimate clients from
# 127.0.0.1 beside it. Records the legitimate clients' success rate (2.xx only) during
# the flood and after it, and the server's RSS before, at its peak, at the end of the
# flood and --settle seconds later, plus the server's gauges (cobalt serve --metrics).
# Writes bench/results/floods-<date>.md and the raw JSON of every run next to it.
#
# Usage: bench/floods.sh [--floods dtls-handshake,dtls-session,tcp,tcp-csm,tls,ws,wss,dedup,separate,upload,observe-non,observe-con]
#          [--duration 10] [--settle 30] [--rate N] [--ips 1] [--port 25683]
#          [--set section.key=value ...]
#          [--server-cpus 1] [--client-cpus 0] [--out bench/results] [--ready-timeout 30]
#          [-- extra flood options, e.g. --connections 3000]
# Environment: COBALT=/path/to/cobalt and FLOOD=/path/to/flood skip the cargo build.
#
# Ports: UDP --port (coap) and --port+1 (coaps); TCP --port (coap+tcp), --port+1
# (coaps+tcp), --port+2 (coap+ws), --port+3 (coaps+ws), --port+4 (metrics).
# --rate overrides the attack rate of every flood (default: the flood tool's per
# mode); --ips spreads the attacker over that many addresses from 127.0.0.2; --set
# (repeatable) changes the server's configuration from the default, e.g. to let a
# flood build more state (the report lists the settings).
#
# The lockouts of issue 28, from several addresses (the legitimate clients must still
# be served, the server's memory stay bounded):
#   bench/floods.sh --floods tcp-csm --ips 8 -- --connections 1024
#     eight addresses hold 128 connections each (their budget) that sent their CSM,
#     then idle: the listener's 1,024 places; legitimate clients from 127.0.0.1 get
#     in by eviction;
#   bench/floods.sh --floods dtls-session --ips 4 -- --connections 1024
#     anonymous DTLS sessions (the dtls-session server has a certificate, generated
#     here, and no client CA) held idle from four addresses; the legitimate clients
#     connect anonymously too. With --ips 1 --set dtls.max_sessions_per_ip=100000
#     -- --connections 1000, the RSS growth over 1,000 sessions is the memory one
#     established session costs.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

floods=dtls-handshake,dtls-session,tcp,tcp-csm,tls,ws,wss,dedup,separate,upload,observe-non,observe-con
duration=10
settle=30
rate=""
ips=1
port=25683
extra=()
settings=()

while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --floods) floods=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --ips) ips=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --set) settings+=(--set "$2"); shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

# The flood tool: $FLOOD, else built next to cobalt.
find_flood() {
  if [ -n "${FLOOD:-}" ]; then
    [ -x "$FLOOD" ] || die "FLOOD=$FLOOD is not an executable"
    return
  fi
  log "building the flood tool (cargo build --release -p cobalt-cli --example flood)"
  (cd "$repo_root" && cargo build --release -q -p cobalt-cli --example flood) || die "cargo build failed"
  FLOOD="${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/flood"
}

prepare_run
find_flood
dtls_port=$((port + 1)) tls_port=$((port + 1)) ws_port=$((port + 2)) wss_port=$((port + 3))
metrics_port=$((port + 4))
for p in "$port" "$dtls_port"; do check_port_free udp "$p"; done
for p in "$port" "$tls_port" "$ws_port" "$wss_port" "$metrics_port"; do check_port_free tcp "$p"; done

make_workdir floods
stamp=$(date -u +%Y-%m-%d-%H%M)
runs=$out_dir/floods-$stamp
mkdir -p "$runs"

psk_identity=cobalt-flood
psk_key=0x$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
printf '%s:%s\n' "$psk_identity" "$psk_key" >"$work/psk.txt"
psk=(--psk-identity "$psk_identity" --psk-key "$psk_key")
# A self-signed certificate for 127.0.0.1 (EC P-256, for the ECDHE-ECDSA suites): the
# dtls-session flood's server has it and no client CA, so clients need no credential.
if [[ ",$floods," == *,dtls-session,* ]]; then
  command -v openssl >/dev/null || die "the dtls-session flood needs the openssl command"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null || die "openssl req failed"
fi

h=127.0.0.1
coap=coap://$h:$port coaps=coaps://$h:$dtls_port tcp=coap+tcp://$h:$port
tls=coaps+tcp://$h:$tls_port ws=coap+ws://$h:$ws_port wss=coaps+ws://$h:$wss_port

# The legitimate clients of each flood: flood options.
legit_for() {
  case $1 in
    dtls-handshake) echo "--legit $coaps/benchmark --legit-fresh $coaps/benchmark --legit-observe $coaps/obs" ;;
    dtls-session) echo "--legit $coaps/benchmark --legit-fresh $coaps/benchmark --ca $work/cert.pem" ;;
    tcp | tcp-csm) echo "--legit $tcp/benchmark --legit-fresh $tcp/benchmark" ;;
    tls) echo "--legit $tls/benchmark --legit-fresh $tls/benchmark" ;;
    ws) echo "--legit $ws/benchmark --legit-fresh $ws/benchmark" ;;
    wss) echo "--legit $wss/benchmark --legit-fresh $wss/benchmark" ;;
    dedup) echo "--legit $coap/benchmark --legit-fresh $coap/benchmark" ;;
    separate) echo "--legit $coap/benchmark --legit-fresh $coap/separate?delay=50" ;;
    upload) echo "--legit $coap/benchmark --legit-upload $coap/upload" ;;
    observe-*) echo "--legit $coap/benchmark --legit-observe $coap/obs" ;;
    *) die "unknown flood: $1 (see --help)" ;;
  esac
}
target_for() {
  case $1 in
    dtls-handshake | dtls-session) echo "$coaps" ;;
    tcp | tcp-csm) echo "$tcp" ;;
    tls) echo "$tls" ;;
    ws) echo "$ws" ;;
    wss) echo "$wss" ;;
    *) echo "$coap" ;;
  esac
}

# Server options of a flood besides the common ones: the certificate of dtls-session.
server_args_for() {
  case $1 in
    dtls-session) echo "--cert $work/cert.pem --key $work/key.pem" ;;
  esac
}

ready_check() {
  "$COBALT" get "$coap/benchmark" --timeout 1 &&
    "$COBALT" get "$coaps/benchmark" --timeout 1 "${psk[@]}" &&
    "$COBALT" get "$tcp/benchmark" --timeout 1
}

IFS=, read -r -a flood_list <<<"$floods"
for f in "${flood_list[@]}"; do
  legit_for "$f" >/dev/null
  # shellcheck disable=SC2046 # server_args_for's words are options
  start_server "cobalt" "$runs/$f.server.log" "$COBALT" serve --port "$port" --tcp "$port" \
    --dtls-psk-file "$work/psk.txt" --dtls-port "$dtls_port" --tls "$tls_port" \
    --ws-port "$ws_port" --wss-port "$wss_port" --metrics "$h:$metrics_port" "${settings[@]}" \
    $(server_args_for "$f")
  if ! wait_ready "cobalt" ready_check; then
    record_skip "$f" "$skip_reason" ""
    stop_server
    continue
  fi
  rate_opt=()
  [ -n "$rate" ] && rate_opt=(--rate "$rate")
  # shellcheck disable=SC2046 # legit_for's words are options
  log "$f: flood $(target_for "$f") for ${duration}s, then ${settle}s of settling"
  if pin_client "$FLOOD" "$f" "$(target_for "$f")" --duration "$duration" --settle "$settle" \
    --ips "$ips" --server-pid "$server_pid" --metrics "$h:$metrics_port" "${psk[@]}" \
    $(legit_for "$f") "${rate_opt[@]}" "${extra[@]}" --json \
    >"$runs/$f.json" 2>"$runs/$f.log"; then
    record_ok "$f" "$runs/$f.json" ""
  else
    record_skip "$f" "the flood tool failed: $(log_tail "$runs/$f.log")" ""
  fi
  stop_server
done

report=$out_dir/floods-$stamp.md
python3 - "$manifest" "$report" "$duration" "$settle" "$(machine_info)" "$pinning" "${settings[*]}" <<'EOF'
import json, sys
manifest, report, duration, settle, machine, pinning, settings = sys.argv[1:8]
config = "default configuration" + (f" with `{settings}`" if settings else "")

def mib(k):
    return "-" if k is None else f"{k / 1024:.0f}"

def legit_cell(loops, phase):
    cells = []
    for l in loops:
        t = l.get(phase) or {}
        if l["kind"] == "observe":
            cells.append(f"{l['kind']} {l['uri'].split('/', 3)[-1]}: {t.get('notifications', 0)} notif.")
            continue
        sent, ok = t.get("sent", 0), t.get("2.xx", 0)
        other = ", ".join(f"{k} {v}" for k, v in t.items() if k not in ("sent", "2.xx", "success_ratio"))
        cells.append(f"{l['kind']}: {ok}/{sent}" + (f" ({other})" if other else ""))
    return "<br>".join(cells)

rows, skipped = [], []
for line in open(manifest):
    label, status, path, _ = (line.rstrip("\n").split("\t") + ["", ""])[:4]
    if status != "ok":
        skipped.append(f"- {label}: {path}")
        continue
    r = json.load(open(path))
    rss = r["rss_kib"]
    attack = ", ".join(f"{k} {v}" for k, v in r["attacker"].items())
    rows.append(f"| {label} | {r['rate']} | {attack} | {legit_cell(r['legit'], 'flood')} | "
                f"{legit_cell(r['legit'], 'after')} | {mib(rss['before'])} | {mib(rss['peak'])} | "
                f"{mib(rss['end'])} | {mib(rss['after'])} |")

with open(report, "w") as out:
    out.write(f"# Floods against cobalt serve\n\n{machine}; {pinning}.\n"
              f"Each flood ran {duration} s against a fresh `cobalt serve` ({config}), "
              f"then {settle} s of settling. Legitimate clients: successes (2.xx) / requests, "
              f"other answers and errors in brackets. RSS in MiB.\n\n")
    out.write("| flood | rate/s | attacker | legit during | legit after | RSS before | peak | end | after |\n")
    out.write("|---|---|---|---|---|---|---|---|---|\n")
    out.write("\n".join(rows) + "\n")
    if skipped:
        out.write("\n## Skipped\n\n" + "\n".join(skipped) + "\n")
print(report)
EOF
log "report: $report (raw runs in $runs)"
