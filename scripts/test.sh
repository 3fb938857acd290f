#!/usr/bin/env bash
# The project's test command (README): installs the real CoAP peers the interop tests
# need (libcoap's CLI from Debian, aiocoap from PyPI), then checks formatting, lints
# and runs every test. Missing peers fail the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
export COBALT_REQUIRE_PEERS=1
cargo fmt --all -- --check
# Imports point one way: no new cycle between the modules of a crate.
python3 scripts/check-module-cycles.py
cargo clippy --workspace --all-targets -- -D warnings
# The API documentation (the guide is the `cobalt` crate's documentation) builds
# without warnings: no broken links, none to private items. The libraries and the
# `cobalt` binary separately, as both are named `cobalt`.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --lib -q
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p cobalt-cli -q
# The link emulator's tests need root and network namespaces: required where the
# machine allows them, reported as skipped (with why) where it does not.
if [ "$(id -u)" = 0 ] && ip netns add cobalt-ci-probe 2>/dev/null; then
  ip netns del cobalt-ci-probe
  export COBALT_REQUIRE_NETNS=1
else
  echo "note: no network namespaces here; the link emulator's tests will be skipped" >&2
fi
cargo test --workspace
# The Python package: built into .venv-python by maturin, its pytest suite run against
# Cobalt's own server (started from Python), aiocoap and libcoap.
bash scripts/test-python.sh
# Plain CoAP without OpenSSL (the `openssl` feature off): lints, and the refusal of
# coaps:// that names the feature.
cargo clippy -p cobalt -p cobalt-bench -p cobalt-cli --no-default-features --all-targets -- -D warnings
cargo test -p cobalt --no-default-features --test client_errors
cargo test -p cobalt-cli --no-default-features --test exit_codes
# The feature set the Python package builds `cobalt` with (OpenSSL, no Mbed TLS).
cargo clippy -p cobalt --no-default-features --features vendored-openssl --all-targets -- -D warnings
# The default build needs no system OpenSSL (libssl-dev).
bash scripts/check-openssl.sh
