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
cargo test --workspace
# Plain CoAP without OpenSSL (the `openssl` feature off): lints, and the refusal of
# coaps:// that names the feature.
cargo clippy -p cobalt -p cobalt-cli --no-default-features --all-targets -- -D warnings
cargo test -p cobalt --no-default-features --test client_errors
cargo test -p cobalt-cli --no-default-features --test exit_codes
# The default build needs no system OpenSSL (libssl-dev).
bash scripts/check-openssl.sh
