#!/usr/bin/env bash
# One-command CoAP vs HTTP comparison with the same load generator (cobalt bench).
#
# Starts, one at a time on loopback, each pinned to its own CPU(s):
#   cobalt serve --shards 1 (CoAP over UDP, /benchmark),
#   cobalt bench-http-responder (a minimal tokio HTTP/1.1 responder, no HTTP library),
#   nginx (bench/servers/nginx.conf: one process, `return 200 "hello world"`; installed
#   with apt-get when missing and the script runs as root),
# and drives each HTTP server twice: with keep-alive (one connection per client) and
# with --no-keepalive (a new TCP connection per request). All answer GET /benchmark
# with "hello world". Writes bench/results/http-compare-<date>.md and .svg.
#
# Usage: bench/http-compare.sh [--clients 10,100,1000] [--duration 5] [--coap-port 5683]
#          [--http-port 8080] [--server-cpus 1] [--client-cpus 0]
#          [--servers cobalt,http-responder,nginx] [--out bench/results] [--ready-timeout 30]
# Environment: COBALT=/path/to/cobalt skips the cargo build.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

clients=10,100,1000
duration=5
coap_port=5683
http_port=8080
servers=cobalt,http-responder,nginx

while [ $# -gt 0 ]; do
  if common_option "$@"; then shift "$shifts"; continue; fi
  case $1 in
    --coap-port) coap_port=$2; shift 2 ;;
    --http-port) http_port=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

prepare_run
check_port_free udp "$coap_port"
check_port_free tcp "$http_port"

make_workdir http-compare

coap_uri="coap://127.0.0.1:$coap_port/benchmark"
http_uri="http://127.0.0.1:$http_port/benchmark"
coap_check() { "$COBALT" get "$coap_uri" --timeout 1; }
# One HTTP/1.0 GET over bash's /dev/tcp, bounded to 2 s; succeeds on "hello world".
# shellcheck disable=SC2016 # $1 expands in the inner bash
http_check() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
    printf "GET /benchmark HTTP/1.0\r\nHost: localhost\r\n\r\n" >&3 &&
    grep -q "hello world" <&3' http_check "$http_port"
}

# bench_one LABEL DESCRIPTION URI CHECK [cobalt bench options]: waits for the started
# server, benchmarks it, stops it.
bench_one() {
  local label=$1 desc=$2 uri=$3 check=$4 json
  shift 4
  json=$work/$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '_').json
  skip_reason=""
  if ! wait_ready "$label" "$check"; then
    record_skip "$label" "$skip_reason; log: $(log_tail "$work/server.log")" "$desc"
  elif run_bench "$label" "$uri" "$json" "$@"; then
    record_ok "$label" "$json" "$desc"
  else
    record_skip "$label" "cobalt bench failed" "$desc"
  fi
  stop_server
}

# Makes sure nginx exists: installs Debian's package when missing and we are root.
ensure_nginx() {
  command -v nginx >/dev/null && return 0
  [ -x /usr/sbin/nginx ] && PATH=$PATH:/usr/sbin && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    nginx_missing="nginx not installed (install it: apt-get install -y nginx)"
    return 1
  fi
  log "installing nginx (apt-get install -y nginx)"
  if ! apt-get install -y -q nginx >"$work/apt.log" 2>&1; then
    apt-get update -q >>"$work/apt.log" 2>&1 || true
    apt-get install -y -q nginx >>"$work/apt.log" 2>&1 || {
      nginx_missing="apt-get install nginx failed: $(tail -n 1 "$work/apt.log")"
      return 1
    }
  fi
  command -v nginx >/dev/null || PATH=$PATH:/usr/sbin
}

# Each mode: "LABEL|cobalt bench option" (the option may be empty).
modes=("keep-alive|" "no keep-alive|--no-keepalive")
mode_options() {
  extra=()
  if [ -n "${1#*|}" ]; then extra=("${1#*|}"); fi
}

IFS=, read -r -a server_list <<<"$servers"
for s in "${server_list[@]}"; do
  server_pid=""
  case $s in
    cobalt)
      label="cobalt serve (CoAP/UDP)"
      start_server "$label" "$work/server.log" "$COBALT" serve --bind 127.0.0.1 \
        --port "$coap_port" --shards 1 --log-level error
      bench_one "$label" "cobalt serve --shards 1 ($("$COBALT" --version)), CON requests" \
        "$coap_uri" coap_check
      check_port_free udp "$coap_port"
      ;;
    http-responder)
      for mode in "${modes[@]}"; do
        label="bench-http-responder (${mode%%|*})"
        start_server "$label" "$work/server.log" "$COBALT" bench-http-responder \
          --bind "127.0.0.1:$http_port"
        mode_options "$mode"
        bench_one "$label" "cobalt bench-http-responder: tokio current-thread, hand-written HTTP/1.1" \
          "$http_uri" http_check "${extra[@]}"
        check_port_free tcp "$http_port"
      done
      ;;
    nginx)
      nginx_missing=""
      if ! ensure_nginx; then
        record_skip "nginx" "$nginx_missing" "nginx"
        continue
      fi
      nginx_version=$(nginx -v 2>&1 | sed 's/^nginx version: //' || true)
      for mode in "${modes[@]}"; do
        label="nginx (${mode%%|*})"
        prefix=$work/nginx-prefix
        rm -rf "$prefix"
        mkdir -p "$prefix"
        sed "s/127\.0\.0\.1:8080/127.0.0.1:$http_port/" "$bench_dir/servers/nginx.conf" \
          >"$prefix/nginx.conf"
        start_server "$label" "$work/server.log" nginx -p "$prefix/" -c "$prefix/nginx.conf" -e stderr
        mode_options "$mode"
        bench_one "$label" "$nginx_version, bench/servers/nginx.conf (1 process, return 200)" \
          "$http_uri" http_check "${extra[@]}"
        check_port_free tcp "$http_port"
      done
      ;;
    *) record_skip "$s" "unknown server name (known: cobalt, http-responder, nginx)" "$s" ;;
  esac
done

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%d-%H%M)
python3 "$bench_dir/report.py" \
  --title "CoAP vs HTTP with CoAPBench" \
  --manifest "$manifest" \
  --md "$out_dir/http-compare-$stamp.md" --svg "$out_dir/http-compare-$stamp.svg" \
  --command "bench/http-compare.sh --clients $clients --duration $duration" \
  --setup "loopback 127.0.0.1, GET /benchmark (11-byte \"hello world\"), closed loop; CoAP: UDP port $coap_port, CON; HTTP/1.1: TCP port $http_port, keep-alive = one connection per client, no keep-alive = a new connection per request (Connection: close); $pinning" \
  --machine "$(machine_info)"
log "wrote $out_dir/http-compare-$stamp.md and .svg"
