#!/usr/bin/env bash
# The tests on a fresh machine: install everything and build (install.sh), then run the test
# suite; GPU tests skip without a GPU. Extra arguments go to pytest:
#   scripts/setup_and_test.sh -x -k quant
set -euo pipefail
. "$(dirname "$0")/common.sh"
PYTHON=$PY "$ROOT/scripts/install.sh"
echo "== test"
cd "$ROOT"
exec "$PY" -m pytest tests -q --durations=15 "$@"
