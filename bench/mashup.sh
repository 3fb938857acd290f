#!/usr/bin/env bash
# The mashup observing a fleet of simulated devices: notifications it receives per
# second, its CPU µs per notification, and its memory per observation; also the
# fleet's memory per device.
#
#   bench/mashup.sh [-c "1000 10000"] [-d SECONDS] [--rate CHANGES_PER_S] [--list-above N] [--out DIR]
#
# Beyond --list-above devices (default 20,000) the mashup follows the devices' list of
# addresses instead of a lookup: cobalt rd's resource lookup scans every registration
# for each request (at 100,000 registrations one page of 500 links, 56 KB in 55 Block2
# blocks, took 6.9 s: some 20 minutes to list them all). The row says which.
# 100,000 devices need --rate 0.1 or so on a 2-core machine (100,000 changes a second
# are more than the fleet can make there), and run as several `cobalt devices`
# processes when the hard limit on open files (a socket per device) is lower.
# For each fleet size N: `cobalt rd` (in memory), `cobalt devices -n N` registering
# there (spread over 127.0.0.0/16, one change per second each by default), then the
# mashup example (cobalt-fleet/examples/mashup.rs) with room for N observations. Once
# it observes all N and has a reading from each, two of its report lines D seconds
# apart give the rate and, with its CPU time (/proc/PID/stat) read as each line
# arrives, the CPU per notification. Memory per observation is the mashup's RSS growth
# from its first report (written before it follows anything) to the end of the
# window, over N; its heap per observation likewise, from the bytes allocated and
# not freed that the mashup counts. The mashup writes the time, its CPU time, RSS
# and heap into each line;
# the stamps taken on reading a line are only the fallback for a mashup that does
# not (read late, they once made a baseline from a half-grown process); memory
# per device is the fleet's RSS over N (runtime included).
# The three processes share this machine's CPUs (no pinning: the mashup and the fleet
# both need a core). Results: bench/results/mashup-<date>.md.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
clients="1000 10000"
duration=20
rate=1
list_above=20000
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --list-above) list_above=$2; shift 2 ;;
    *) common_option "$@" || die "unknown option $1 (see --help)"; shift "$shifts" ;;
  esac
done
prepare_run
make_workdir mashup
MASHUP=${MASHUP:-}
if [ -z "$MASHUP" ]; then
  log "building the mashup example (cargo build --release -p cobalt-fleet --example mashup)"
  (cd "$repo_root" && cargo build --release -q -p cobalt-fleet --example mashup) || die "cargo build failed"
  MASHUP=${CARGO_TARGET_DIR:-$repo_root/target}/release/examples/mashup
fi
stamp=$(date -u +%Y-%m-%d-%H%M)
mkdir -p "$out_dir"
report=$out_dir/mashup-$stamp.md
rows=()
free_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }

# One table row from a size's samples: python3 row.py SAMPLES N FLEET_RSS_KB SUMMARY.
cat >"$work/row.py" <<'PY'
import re, sys
path, label, devices_rss, summary = sys.argv[1], sys.argv[2], int(sys.argv[3] or 0), sys.argv[4]
n = int(label.split()[0])
samples = []
for line in open(path):
    parts = line.split(" ", 3)
    if len(parts) < 4:
        continue
    t, cpu, rss, text = float(parts[0]), float(parts[1]), int(parts[2] or 0), parts[3]
    heap = re.search(r' heap_kb (\d+)', text)
    heap = int(heap.group(1)) if heap else None
    m = re.search(r'"count":(\d+).* observing (\d+) notifications (\d+)', text)
    # The time, CPU and RSS the mashup wrote into the line, where it did: those of
    # the moment it wrote it (the reader's stamps come later, by however late it read).
    own = re.search(r' at ([\d.]+) cpu_s ([\d.]+) rss_kb (\d+)', text)
    if own:
        t, cpu, rss = float(own.group(1)), float(own.group(2)), int(own.group(3))
    if m:
        samples.append((t, cpu, rss, int(m.group(1)), int(m.group(2)), int(m.group(3)), heap))
if not samples:
    print(f"| {label} | the mashup reported nothing (see the log above) | | | | | | |")
    sys.exit()
base = samples[0]
full = [s for s in samples if s[3] == n and s[4] == n]
if len(full) < 2:
    print(f"| {label} | not all observed (last: {samples[-1][3]} readings, {samples[-1][4]} observing) | | | | | | |")
    sys.exit()
a, b = full[0], full[-1]
rate = (b[5] - a[5]) / (b[0] - a[0])
cpu_us = (b[1] - a[1]) * 1e6 / max(1, b[5] - a[5])
per_obs = (b[2] - base[2]) * 1024 / n
heap = f"{(b[6] - base[6]) * 1024 / n:.0f}" if b[6] is not None and base[6] is not None else "n/a"
print(f"| {label} | {b[0]-a[0]:.0f} | {rate:.0f} | {cpu_us:.1f} | {per_obs:.0f} | {heap} | {devices_rss * 1024 / n / 1024:.2f} | {summary} |")
PY

for n in $clients; do
  rd_port=$(free_port)
  mashup_port=$(free_port)
  start_server "rd-$n" "$work/rd-$n.log" "$COBALT" rd --in-memory --bind 127.0.0.1 -p "$rd_port" \
    --max-per-peer 1000000 --max-registrations 1000000 --log-level error
  rd_pid=$server_pid
  # A socket per device, and at most the hard limit on open files in one process: a
  # larger fleet runs as several `cobalt devices` processes (on 127.1.0.0/16,
  # 127.2.0.0/16, ...).
  per_process=$(($(ulimit -Hn) - 1000))
  devices_pids=()
  left=$n
  part=0
  while [ "$left" -gt 0 ]; do
    k=$((left < per_process ? left : per_process))
    part=$((part + 1))
    "$COBALT" devices -n "$k" --ep-prefix "dev-$part-" --rd "coap://127.0.0.1:$rd_port" \
      --source-net "127.$part.0.0/16" --rate "$rate" --lt 3600 --progress 2 \
      --addresses "$work/addresses-$n-$part" \
      >"$work/devices-$n-$part.out" 2>"$work/devices-$n-$part.log" &
    devices_pids+=($!)
    left=$((left - k))
  done
  registered_now() {
    local total=0 f c
    for f in "$work"/devices-"$n"-*.log; do
      c=$(grep -o 'registered [0-9]* (now [0-9]*' "$f" | tail -1 | sed 's/.*now //')
      total=$((total + ${c:-0}))
    done
    echo "$total"
  }
  wait_s=$((60 + n / 500))
  deadline=$((SECONDS + wait_s))
  until [ "$(registered_now)" -ge "$n" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "the $n devices did not all register within $wait_s s ($(registered_now) did)"
    sleep 1
  done
  log "$n devices registered; starting the mashup"
  # The mashup: lookups every hour (one at the start), room for every device.
  source="coap://127.0.0.1:$rd_port"
  how="lookup"
  if [ "$n" -gt "$list_above" ]; then
    # More than a lookup lists in time: the devices' own list of addresses instead.
    cat "$work"/addresses-"$n"-* | awk '{ print "coap://" $2 "/sensors/temp" }' >"$work/uris-$n"
    source="file:$work/uris-$n"
    how="list"
  fi
  "$MASHUP" "$source" "127.0.0.1:$mashup_port" "$n" 3600 >"$work/mashup-$n.out" 2>"$work/mashup-$n.log" &
  mashup_pid=$!
  # Each report line (every 5 s), stamped with the time and the mashup's CPU and RSS.
  : >"$work/samples-$n"
  tail -n +1 -F "$work/mashup-$n.out" 2>/dev/null > >(while read -r line; do
    echo "$(date +%s.%N) $(cpu_s "$mashup_pid") $(rss_kb "$mashup_pid") $line"
  done >>"$work/samples-$n") &
  sampler=$!
  deadline=$((SECONDS + 120 + n / 250))
  until grep -q "\"count\":$n,.* observing $n " "$work/samples-$n"; do
    if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$mashup_pid" 2>/dev/null; then
      log "the mashup did not observe all $n devices: $(tail -1 "$work/samples-$n") $(tail -3 "$work/mashup-$n.log")"
      break
    fi
    sleep 1
  done
  sleep "$duration"
  sleep 5
  devices_rss=0
  for pid in "${devices_pids[@]}"; do devices_rss=$((devices_rss + $(rss_kb "$pid"))); done
  kill "$sampler" 2>/dev/null || true
  kill -INT "$mashup_pid" 2>/dev/null || true
  wait "$mashup_pid" 2>/dev/null || true
  for pid in "${devices_pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${devices_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  stop_server
  summary="$part process(es): $(cat "$work"/devices-"$n"-*.out | tr '\n' ' ')"
  # The rows: first sample (baseline), and the window from the first sample with all
  # N observed and read to the last one.
  row=$(python3 "$work/row.py" "$work/samples-$n" "$n ($how)" "$devices_rss" "$summary")
  rows+=("$row")
  log "$row"
done

{
  echo "# The mashup observing simulated devices (bench/mashup.sh)"
  echo
  echo "Commit $(git -C "$repo_root" rev-parse --short HEAD); $(machine_info); unpinned (rd, fleet and mashup share the CPUs)."
  echo "Each device changes $rate time(s) per second; the window is about $duration s per row: short runs, read them as ratios."
  echo
  echo "| devices | window s | notifications received /s | mashup CPU µs / notification | mashup bytes / observation (RSS) | of which heap | fleet KiB / device | fleet summary at the end |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >"$report"
cat "$report"
log "report: $report"
