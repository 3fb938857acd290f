#!/usr/bin/env bash
# Installs the real CoAP peers the interop tests talk to:
#   - libcoap's command-line tools (Debian package libcoap3-bin: coap-client-*, coap-server-*)
#   - iproute2 (Debian) for the link emulator's namespaces and TUN devices
#   - aiocoap (PyPI) with its WebSocket extra (websockets) in a virtual environment at
#     .venv-peers/ (libcoap 4.3.1 as packaged by Debian has no WebSocket support, so
#     aiocoap is the only coap+ws peer) and its OSCORE extra (cryptography, cbor2,
#     filelock: the OSCORE interop peer)
#   - Californium (californium-core from Maven Central) as a server and client peer:
#     a JDK and Maven (Debian default-jdk-headless, maven), then tests/peers/californium
#     compiled once, its jars cached in .cache/maven/ (gitignored)
# Safe to run repeatedly; skips what is already present.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sudo_cmd=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo_cmd="sudo"; fi

# libcoap's tools, make and a C compiler for OpenSSL and jemalloc (built from source
# for the `cobalt` binary; no libssl-dev: scripts/check-openssl.sh checks that the
# default build needs no system OpenSSL), and iproute2 (`ip netns`, `ip link`) for the
# link emulator cobalt-linkem and its study.
missing=()
command -v make >/dev/null 2>&1 || missing+=(make)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
ls /usr/bin/coap-client-* >/dev/null 2>&1 || missing+=(libcoap3-bin)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (Debian)" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

venv="$root/.venv-peers"
if [ ! -x "$venv/bin/aiocoap-client" ] ||
  ! "$venv/bin/python" -c 'import websockets, cbor2, cryptography, filelock' 2>/dev/null; then
  echo "installing aiocoap[ws,oscore] (PyPI) into $venv" >&2
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'aiocoap[ws,oscore]==0.4.17'
fi
# The Californium peer: compiled when missing or older than its sources. The class
# path (jars in .cache/maven) is written to target/classpath.txt for the tests.
cf="$root/tests/peers/californium"
if [ ! -s "$cf/target/classpath.txt" ] ||
  [ -n "$(find "$cf/pom.xml" "$cf/src" -newer "$cf/target/classpath.txt" -print -quit)" ]; then
  echo "building the Californium peer (Maven Central: californium-core) in $cf" >&2
  (cd "$cf" && mvn -q -B -Dmaven.repo.local="$root/.cache/maven" compile \
    dependency:build-classpath -Dmdep.outputFile=target/classpath.txt)
fi
echo "peers ready: $(ls /usr/bin/coap-client-* | head -1), $("$venv/bin/aiocoap-client" --version 2>&1 | head -1), $(java -version 2>&1 | head -1) with $(tr ':' '\n' <"$cf/target/classpath.txt" | sed -n 's|.*/\(californium-core-[^/]*\)\.jar|\1|p')" >&2
