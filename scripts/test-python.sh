#!/usr/bin/env bash
# Builds the Python package (cobalt-python) into the virtual environment .venv-python
# (made by scripts/install-test-deps.sh) and runs its pytest suite. Arguments go to
# pytest, e.g. `scripts/test-python.sh -k observe`. With COBALT_REQUIRE_PEERS=1 (as
# scripts/test.sh sets) a missing aiocoap or libcoap fails the interop tests instead
# of skipping them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv-python"
if [ ! -x "$venv/bin/maturin" ]; then
  echo "no maturin in $venv: run scripts/install-test-deps.sh first" >&2
  exit 1
fi
cd "$root/cobalt-python"
# An editable install: the compiled module lands next to the Python sources.
VIRTUAL_ENV="$venv" "$venv/bin/maturin" develop --quiet
"$venv/bin/python" -m pytest -q tests "$@"
