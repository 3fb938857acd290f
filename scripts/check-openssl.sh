#!/usr/bin/env bash
# Checks the README's promise that the default build needs no system OpenSSL
# (libssl-dev): the `cobalt` binary links no libssl/libcrypto, the default features of
# `cobalt` and `cobalt-cli` build OpenSSL from source (`vendored-openssl`), and — on a
# machine that has libssl-dev — OpenSSL's build succeeds with libssl-dev's headers,
# static libraries and pkg-config files hidden (in a mount namespace; needs root and
# unshare). On a machine without libssl-dev the workspace build that ran before this
# script is itself the proof, and the hidden rebuild is skipped.
# Run after `cargo test --workspace` (scripts/test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "check-openssl: $*" >&2
  exit 1
}

cargo build -q -p cobalt-cli
needed=$(readelf -d target/debug/cobalt | grep NEEDED || true)
if grep -Eq 'lib(ssl|crypto)\.so' <<<"$needed"; then
  fail "target/debug/cobalt links the system's OpenSSL:"$'\n'"$needed"
fi
for pkg in cobalt cobalt-bench cobalt-cli; do
  cargo tree -p "$pkg" -e features -i openssl-src 2>/dev/null \
    | grep -q "$pkg feature \"default\"" \
    || fail "the default features of $pkg do not build OpenSSL from source (vendored-openssl)"
done
echo "check-openssl: the default build links no system OpenSSL and builds its own" >&2

if ! dpkg -s libssl-dev >/dev/null 2>&1; then
  echo "check-openssl: libssl-dev is not installed, so the build above needed none" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
  echo "check-openssl: libssl-dev is installed; hiding it needs root and unshare: skipped" >&2
  exit 0
fi
# Check the library (building OpenSSL, with the default features) from scratch where libssl-dev's
# files are hidden: directories under empty tmpfs mounts, files under /dev/null. The
# .so links are left: they point at the runtime libraries other programs use.
started=$(date +%s)
unshare -m bash -euo pipefail -c '
  for f in $(dpkg -L libssl-dev); do
    case "$f" in
      */include/openssl|*/include/*/openssl) mount -t tmpfs none "$f" ;;
      *.a|*.pc) mount --bind /dev/null "$f" ;;
    esac
  done
  test ! -e /usr/include/openssl/ssl.h
  CARGO_TARGET_DIR=target/check-openssl cargo check -q -p cobalt --lib
' || fail "OpenSSL does not build without libssl-dev"
echo "check-openssl: built OpenSSL from source with libssl-dev hidden in $(( $(date +%s) - started )) s" >&2
