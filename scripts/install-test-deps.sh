#!/usr/bin/env bash
# Installs the real CoAP peers the interop tests talk to:
#   - libcoap's command-line tools (Debian package libcoap3-bin: coap-client-*, coap-server-*)
#   - iproute2 (Debian) for the link emulator's namespaces and TUN devices
#   - curl (Debian), the HTTP/1.1 and HTTP/2 client of the HTTP-to-CoAP proxy's interop
#   - aiocoap (PyPI) with its WebSocket extra (websockets) in a virtual environment at
#     .venv-peers/ (libcoap 4.3.1 as packaged by Debian has no WebSocket support, so
#     aiocoap is the only coap+ws peer) and its OSCORE extra (cryptography, cbor2,
#     filelock: the OSCORE interop peer)
#   - redis-server (Debian, 7.0) for the resource directory's shared store, and nftables
#     and curl (health probes) for the cluster in network namespaces (scripts/cluster.sh)
#   - maturin and pytest (PyPI) in a virtual environment at .venv-python/, to build and
#     test the Python package cobalt-python (scripts/test-python.sh)
#   - Californium (californium-core from Maven Central) as a server and client peer:
#     a JDK and Maven (Debian default-jdk-headless, maven), then tests/peers/californium
#     compiled once, its jars cached in .cache/maven/ (gitignored)
#   - cmake, ninja-build, clang and libclang-dev (Debian) to build the Mbed TLS DTLS
#     backend (the one with the DTLS Connection ID)
#   - Eclipse Leshan's LwM2M client (leshan-client-cf from Maven Central) as a device
#     for cobalt-lwm2m: tests/peers/leshan compiled the same way
#   - libcoap 4.3.4 (Q-Block, RFC 9177; bookworm's 4.3.1 has none) from Debian trixie's
#     binary packages, unpacked into .cache/libcoap-4.3.4/ with wrappers in its bin/
#     (install_libcoap_qblock below)
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
command -v curl >/dev/null 2>&1 || missing+=(curl)
ls /usr/bin/coap-client-* >/dev/null 2>&1 || missing+=(libcoap3-bin)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (Debian)" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The Mbed TLS DTLS backend (cobalt feature `mbedtls`, on by default): mbedtls-rs-sys
# builds Mbed TLS 3.6 from source with cmake and ninja, and generates its bindings
# with bindgen, which needs clang and libclang.
install_mbedtls_build_tools() {
  local need=()
  command -v cmake >/dev/null 2>&1 || need+=(cmake)
  command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
  command -v clang >/dev/null 2>&1 || need+=(clang)
  ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/*/libclang-*.so* >/dev/null 2>&1 || need+=(libclang-dev)
  if [ "${#need[@]}" -gt 0 ]; then
    echo "installing ${need[*]} (Debian) to build Mbed TLS" >&2
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}
install_mbedtls_build_tools

venv="$root/.venv-peers"
if [ ! -x "$venv/bin/aiocoap-client" ] ||
  ! "$venv/bin/python" -c 'import websockets, cbor2, cryptography, filelock' 2>/dev/null; then
  echo "installing aiocoap[ws,oscore] (PyPI) into $venv" >&2
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'aiocoap[ws,oscore]==0.4.17'
fi
# The Python package's build and test tools (cobalt-python: maturin builds the wheel,
# pytest runs cobalt-python/tests).
pyvenv="$root/.venv-python"
if [ ! -x "$pyvenv/bin/maturin" ] || ! "$pyvenv/bin/python" -c 'import pytest' 2>/dev/null; then
  echo "installing maturin and pytest (PyPI) into $pyvenv" >&2
  [ -x "$pyvenv/bin/pip" ] || python3 -m venv "$pyvenv"
  "$pyvenv/bin/pip" install -q --disable-pip-version-check 'maturin==1.16.0' 'pytest>=8'
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
# The Leshan client peer (cobalt-lwm2m/tests/leshan.rs), built the same way.
leshan="$root/tests/peers/leshan"
if [ ! -s "$leshan/target/classpath.txt" ] ||
  [ -n "$(find "$leshan/pom.xml" "$leshan/src" -newer "$leshan/target/classpath.txt" -print -quit)" ]; then
  echo "building the Leshan client peer (Maven Central: leshan-client-cf) in $leshan" >&2
  (cd "$leshan" && mvn -q -B -Dmaven.repo.local="$root/.cache/maven" compile \
    dependency:build-classpath -Dmdep.outputFile=target/classpath.txt)
fi
# libcoap 4.3.4 with Q-Block (RFC 9177) for the Q-Block interop tests: Debian trixie's
# .debs (pinned, sha256-checked) unpacked into .cache/libcoap-4.3.4/root, run with
# trixie's own loader and libc (so they run on bookworm), through wrappers in
# .cache/libcoap-4.3.4/bin/ (coap-client-notls, coap-server-openssl, ...) that
# cobalt-test-support's libcoap::qblock_tool finds.
install_libcoap_qblock() {
  local dir="$root/.cache/libcoap-4.3.4" base="http://deb.debian.org/debian/"
  local debs=(
    "pool/main/libc/libcoap3/libcoap3-bin_4.3.4-1.1+deb13u3_amd64.deb 3ab65318ed3ddc75f248a5001f307e6fccc2b3de8235eaecc062a1f53b05621b"
    "pool/main/libc/libcoap3/libcoap3t64_4.3.4-1.1+deb13u3_amd64.deb 65ccef36635d4d86434805007fa581ef87c1effebee931419ab509ad8d63b6bd"
    "pool/main/g/glibc/libc6_2.41-12+deb13u5_amd64.deb b59b0625cd1a791375d40dab23a4d5d3d0641e3d0a773501becdc3725b7f99cf"
    "pool/main/o/openssl/libssl3t64_3.5.9-1~deb13u1_amd64.deb ffefb9af363e0e4592251b2533eb06453c8e470f7772e40263c4b2129251a6d5"
    "pool/main/libz/libzstd/libzstd1_1.5.7+dfsg-1_amd64.deb 2f6a2aeacfc925eba8b00ac9139bc4bfccf8cacb09eb93de067074b26948eef9"
    "pool/main/z/zlib/zlib1g_1.3.dfsg+really1.3.1-1+deb13u1_amd64.deb 8c27c342230503b73dfde629642c3b352e87b554e06d60cf58772f236a305ceb"
  )
  # Installed when its wrapper runs (a moved checkout writes them again).
  "$dir/bin/coap-client-notls" 2>&1 | grep -q 'v4\.3\.4' && return 0
  [ "$(uname -m)" = x86_64 ] || { echo "libcoap 4.3.4: only amd64 packages are pinned; skipped" >&2; return 0; }
  echo "installing libcoap 4.3.4 (Debian trixie .debs) into $dir" >&2
  mkdir -p "$dir/debs" "$dir/bin"
  rm -rf "$dir/root"
  local entry path sum file
  for entry in "${debs[@]}"; do
    path="${entry% *}" sum="${entry#* }" file="$dir/debs/${path##*/}"
    if [ ! -s "$file" ] || ! echo "$sum  $file" | sha256sum -c --quiet - 2>/dev/null; then
      curl -fsSL -o "$file" "$base$path"
      echo "$sum  $file" | sha256sum -c --quiet - ||
        { echo "libcoap 4.3.4: $file does not have the pinned sha256" >&2; rm -f "$file"; return 1; }
    fi
    dpkg-deb -x "$file" "$dir/root"
  done
  local tool
  # No GnuTLS libraries are unpacked: the tools without TLS and on OpenSSL only.
  rm -f "$dir"/bin/coap-*
  for tool in "$dir"/root/usr/bin/coap-{client,server}-{notls,openssl}; do
    cat >"$dir/bin/${tool##*/}" <<WRAP
#!/bin/sh
# libcoap 4.3.4 from Debian trixie, run with trixie's loader and libraries.
exec "$dir/root/usr/lib64/ld-linux-x86-64.so.2" --library-path "$dir/root/usr/lib/x86_64-linux-gnu" "$tool" "\$@"
WRAP
    chmod +x "$dir/bin/${tool##*/}"
  done
}
install_libcoap_qblock
echo "peers ready: $(ls /usr/bin/coap-client-* | head -1), $("$venv/bin/aiocoap-client" --version 2>&1 | head -1), $(java -version 2>&1 | head -1) with $(tr ':' '\n' <"$cf/target/classpath.txt" | sed -n 's|.*/\(californium-core-[^/]*\)\.jar|\1|p')" >&2
