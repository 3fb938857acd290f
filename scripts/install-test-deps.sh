#!/usr/bin/env bash
# Installs the real CoAP peers the interop tests talk to:
#   - libcoap's command-line tools (Debian package libcoap3-bin: coap-client-*, coap-server-*)
#   - aiocoap (PyPI) in a virtual environment at .venv-peers/
# and what building the DTLS transport needs: OpenSSL's headers (libssl-dev) and pkg-config.
# Safe to run repeatedly; skips what is already present.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sudo_cmd=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then sudo_cmd="sudo"; fi

if ! ls /usr/bin/coap-client-* >/dev/null 2>&1; then
  echo "installing libcoap3-bin (Debian)" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq libcoap3-bin >/dev/null
fi

if ! command -v pkg-config >/dev/null || ! pkg-config --exists openssl; then
  echo "installing libssl-dev and pkg-config (Debian)" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq libssl-dev pkg-config >/dev/null
fi

venv="$root/.venv-peers"
if [ ! -x "$venv/bin/aiocoap-client" ]; then
  echo "installing aiocoap (PyPI) into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'aiocoap==0.4.17'
fi
echo "peers ready: $(ls /usr/bin/coap-client-* | head -1), $("$venv/bin/aiocoap-client" --version 2>&1 | head -1)" >&2
