#!/usr/bin/env bash
# The main job on a fresh machine: install everything and build (install.sh), then run the
# demo: every op once, checked against float64 (on the GPU where kernels are built for it,
# else the CPU references).
set -euo pipefail
. "$(dirname "$0")/common.sh"
PYTHON=$PY "$ROOT/scripts/install.sh"
echo "== demo"
cd "$ROOT"
exec "$PY" -m persistent_gemm demo
