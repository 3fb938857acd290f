# Shared helpers of the bench/*.sh scripts (sourced, not run).
# shellcheck shell=bash
# The sourcing script sets clients and duration and may override the defaults below
# (server_cpus, client_cpus, out_dir, ready_timeout); pinning, work and manifest are
# set here.
# shellcheck disable=SC2034,SC2154

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$bench_dir/.." && pwd)

log() { printf '%s\n' "[$(date -u +%H:%M:%S)] $*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# The cobalt binary: $COBALT if set, else target/release/cobalt, built when missing or
# when the sources are newer (cargo decides; it is a no-op when up to date).
find_cobalt() {
  if [ -n "${COBALT:-}" ]; then
    [ -x "$COBALT" ] || die "COBALT=$COBALT is not an executable"
    return
  fi
  command -v cargo >/dev/null || die "cargo not found: install Rust or set COBALT=/path/to/cobalt"
  log "building cobalt (cargo build --release -p cobalt-cli)"
  (cd "$repo_root" && cargo build --release -q -p cobalt-cli) || die "cargo build failed"
  COBALT="${CARGO_TARGET_DIR:-$repo_root/target}/release/cobalt"
  [ -x "$COBALT" ] || die "no binary at $COBALT after the build"
}

# CPU pinning: pin_server / pin_client prefix commands with taskset when there are at
# least two CPUs and taskset exists; otherwise they run unpinned (said in the report).
setup_pinning() {
  pinning="server on CPU(s) $server_cpus, load generator on CPU(s) $client_cpus (taskset)"
  if ! command -v taskset >/dev/null; then
    pinning="unpinned (taskset not found)"
    server_cpus="" client_cpus=""
  elif [ "$(nproc)" -lt 2 ]; then
    pinning="unpinned (only one CPU)"
    server_cpus="" client_cpus=""
  fi
}
pin_client() { if [ -n "$client_cpus" ]; then taskset -c "$client_cpus" "$@"; else "$@"; fi; }

# check_port_free PROTO PORT [HOST]: fails with a clear message when something is bound
# to the port (udp or tcp) on HOST (default 127.0.0.1) or on every address. Sockets on
# other addresses (e.g. simulated devices on 127.x.y.z) do not collide with it.
check_port_free() {
  local proto=$1 port=$2 host=${3:-127.0.0.1} flag line
  if [ "$proto" = udp ]; then flag=-lunp; else flag=-ltnp; fi
  command -v ss >/dev/null || return 0
  line=$(ss -H "$flag" "sport = :$port" 2>/dev/null |
    awk -v h="$host" '{ a = $4; sub(/:[0-9]+$/, "", a); sub(/%.*/, "", a)
      if (a == h || a == "0.0.0.0" || a == "*" || a == "[::]" || a == "[::ffff:" h "]") { print; exit } }')
  if [ -n "$line" ]; then
    die "$proto port $port on this machine is already in use (a stray server?): $line
  stop it, or pick another port with --port"
  fi
}
# start_server NAME LOGFILE CMD...: starts CMD pinned to the server CPUs in the
# background; sets server_pid (the PID that --server-pid measures).
start_server() {
  local name=$1 logfile=$2
  shift 2
  log "starting $name: $*"
  # exec, so that $! is the server itself (what --server-pid measures and stop_server ends).
  {
    if [ -n "$server_cpus" ]; then exec taskset -c "$server_cpus" "$@"; else exec "$@"; fi
  } >"$logfile" 2>&1 &
  server_pid=$!
}

# stop_server [SECONDS]: stops the current server: SIGINT, then SIGTERM, then SIGKILL,
# SECONDS apart (default 3; a server under valgrind needs longer).
stop_server() {
  [ -n "${server_pid:-}" ] || return 0
  local sig i
  for sig in INT TERM KILL; do
    kill -"$sig" "$server_pid" 2>/dev/null || break
    for i in $(seq 1 $((${1:-3} * 10))); do
      kill -0 "$server_pid" 2>/dev/null || break 2
      sleep 0.1
    done
    : "$i"
  done
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# wait_ready NAME CHECK-CMD... : polls CHECK-CMD every 0.25 s for up to $ready_timeout
# seconds while the server lives. Returns 0 when ready, 1 (with skip_reason set) if not.
wait_ready() {
  local name=$1 deadline
  shift
  deadline=$((SECONDS + ready_timeout))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      skip_reason="exited during start-up"
      return 1
    fi
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.25
  done
  skip_reason="did not answer within ${ready_timeout}s"
  log "$name: $skip_reason"
  return 1
}

# throwaway_psk IDENTITY: a random pre-shared key for this run only, in the server's key
# file $work/psk.txt and in the client options psk=(--psk-identity .. --psk-key ..).
throwaway_psk() {
  psk_identity=$1
  psk_key=0x$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  printf '%s:%s\n' "$psk_identity" "$psk_key" >"$work/psk.txt"
  psk=(--psk-identity "$psk_identity" --psk-key "$psk_key")
}

# The two-build scripts (ab.sh, instructions.sh) serve coap and coap+tcp on $port, coaps
# on $dtls_port (keys of throwaway_psk) and coap+ws on $ws_port from one shard at $host.
# Every client comes from $host, so 1,000 DTLS handshakes and WebSocket upgrades may be
# in progress per address (default 32 each) for their sessions to be set up at once.
four_transports_serve_args() {
  serve_args=(serve --bind "$host" --port "$port" --shards 1 --tcp "$port" --ws-port "$ws_port"
    --dtls-port "$dtls_port" --dtls-psk-file "$work/psk.txt" --log-level error
    --set dtls.max_handshakes_per_ip=1000 --set connections.max_handshakes_per_ip=1000)
}

# uri_of SCHEME: $bench_path (default /benchmark) over one of the four transports of
# four_transports_serve_args.
uri_of() {
  local path=${bench_path:-/benchmark}
  case $1 in
    coap) echo "coap://$host:$port$path" ;;
    coaps) echo "coaps://$host:$dtls_port$path" ;;
    coap+tcp) echo "coap+tcp://$host:$port$path" ;;
    coap+ws) echo "coap+ws://$host:$ws_port$path" ;;
    *) die "unknown scheme $1 (coap, coaps, coap+tcp, coap+ws)" ;;
  esac
}

# The client options SCHEME needs: the PSK for coaps, none otherwise.
scheme_options() {
  scheme_opts=()
  if [ "$1" = coaps ]; then scheme_opts=("${psk[@]}"); fi
}

# Last line of a log file, flattened for a markdown table cell.
log_tail() {
  [ -s "$1" ] || return 0
  tail -n 1 "$1" | tr '|\n' '/ ' | cut -c1-160
}

# run_bench LABEL URI OUT.json [extra cobalt bench options]: load generator pinned
# to the client CPUs, measuring server_pid.
run_bench() {
  local label=$1 uri=$2 out=$3
  shift 3
  log "$label: cobalt bench $uri -c $clients -d $duration $*"
  pin_client "$COBALT" bench "$uri" -c "$clients" -d "$duration" \
    --server-pid "$server_pid" --json -q "$@" >"$out"
}

# manifest lines: LABEL<TAB>ok<TAB>JSON-PATH<TAB>DESCRIPTION or LABEL<TAB>skipped<TAB>REASON<TAB>DESCRIPTION
record_ok() { printf '%s\tok\t%s\t%s\n' "$1" "$2" "$3" >>"$manifest"; }
record_skip() {
  log "skipped $1: $2"
  printf '%s\tskipped\t%s\t%s\n' "$1" "$2" "$3" >>"$manifest"
}

machine_info() {
  local cpu
  cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
  printf '%s, %s CPUs, Linux %s' "${cpu:-unknown CPU}" "$(nproc)" "$(uname -r)"
}

# make_workdir NAME: a temporary directory $work with an empty $manifest, removed (and
# the server stopped) when the script exits; Ctrl-C and SIGTERM exit with 130.
make_workdir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/cobalt-$1.XXXXXX")
  manifest=$work/manifest.tsv
  : >"$manifest"
  server_pid=""
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}
cleanup() {
  stop_server
  rm -rf "$work"
}

# common_option ARGS...: handles an option that every script takes (--clients,
# --duration, --server-cpus, --client-cpus, --out, --ready-timeout, --help), setting
# `shifts` to the number of words it used; fails when $1 is not one of them.
common_option() {
  shifts=2
  case $1 in
    -c | --clients) clients=$2 ;;
    -d | --duration) duration=$2 ;;
    --server-cpus) server_cpus=$2 ;;
    --client-cpus) client_cpus=$2 ;;
    --out) out_dir=$2 ;;
    --ready-timeout) ready_timeout=$2 ;;
    -h | --help) usage; exit 0 ;;
    *) return 1 ;;
  esac
}

# The usage text: the script's header comment.
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# Defaults of the common options (the scripts set their own --clients and --duration).
server_cpus=1
client_cpus=0
out_dir=$bench_dir/results
ready_timeout=30

# aiocoap_python: prints the interpreter that has aiocoap: $AIOCOAP_PYTHON, else
# .venv-peers/bin/python of this checkout, or of the main checkout when this is a git
# worktree, then python3.
aiocoap_python() {
  local p main_checkout="" common
  # In a git worktree, the main checkout's .venv-peers serves too.
  if common=$(git -C "$repo_root" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
    main_checkout=$(dirname "$common")
  fi
  for p in "${AIOCOAP_PYTHON:-}" "$repo_root/.venv-peers/bin/python" \
    "${main_checkout:+$main_checkout/.venv-peers/bin/python}" python3; do
    [ -n "$p" ] || continue
    if "$p" -c 'import aiocoap' >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# prepare_run: checks for python3 (the report), finds or builds cobalt, sets the pinning.
prepare_run() {
  command -v python3 >/dev/null || die "python3 is needed to write the report"
  find_cobalt
  setup_pinning
}

# The servers' readiness: $uri answers (CON GET, 1 s).
ready_check() { "$COBALT" get "$uri" --timeout 1; }

# bench_one LABEL DESCRIPTION: waits for the server just started, benchmarks $uri on
# it (the manifest records the result or why not), stops it.
bench_one() {
  local label=$1 desc=$2 json
  json=$work/$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '_').json
  skip_reason=""
  if ! wait_ready "$label" ready_check; then
    record_skip "$label" "$skip_reason; log: $(log_tail "$work/server.log")" "$desc"
  elif run_bench "$label" "$uri" "$json"; then
    record_ok "$label" "$json" "$desc"
  else
    record_skip "$label" "cobalt bench failed (exit $?)" "$desc"
  fi
  stop_server
  check_port_free udp "$port"
}

# bench_aiocoap LABEL [WHAT]: the aiocoap server of bench/servers/aiocoap_benchmark.py
# started and measured as bench_one does (WHAT, if given, goes into its description
# before the Python version), or recorded as skipped when no Python has aiocoap.
bench_aiocoap() {
  local label=$1 what=${2:-} py desc
  if ! py=$(aiocoap_python); then
    record_skip "$label" "no python with aiocoap (run scripts/install-test-deps.sh or set AIOCOAP_PYTHON)" "aiocoap"
    return 0
  fi
  desc="aiocoap $("$py" -c 'import importlib.metadata as m; print(m.version("aiocoap"))' 2>/dev/null), ${what:+$what on }$("$py" --version 2>&1)"
  start_server "$label" "$work/server.log" "$py" "$bench_dir/servers/aiocoap_benchmark.py" 127.0.0.1 "$port"
  bench_one "$label" "$desc"
}
