#!/usr/bin/env bash
# Installs everything persistent_gemm needs into one Python environment (see common.sh for
# which) and builds the extension in place. Used by setup_and_demo.sh and setup_and_test.sh
# (the README's two commands); run on its own, it only installs.
#
# Environment:
#   PYTHON        the interpreter to install into (default: see common.sh)
#   TORCH_SPEC    what to pip-install for torch (default: torch; e.g. 'torch==2.14.1', or
#                 'torch --index-url https://download.pytorch.org/whl/cu128' for a given CUDA)
#   MAX_JOBS      parallel compile jobs (default: the number of cores)
#   TORCH_CUDA_ARCH_LIST, PGEMM_KERNELS, CUDA_HOME, PGEMM_CUTLASS_PATH: see docs/environment.md
set -euo pipefail
. "$(dirname "$0")/common.sh"
cd "$ROOT"

# Fail before downloading gigabytes, not after: the interpreter and the CUDA toolkit.
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "Python >= 3.10 is required, '$PY' is $("$PY" -c 'import sys; print(sys.version.split()[0])')"
"$PY" -m pip --version >/dev/null 2>&1 || die "'$PY -m pip' does not work; install pip for it"
nvcc=""
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  if [ -n "$c" ] && [ -x "$c/bin/nvcc" ]; then nvcc="$c/bin/nvcc"; break; fi
done
[ -n "$nvcc" ] || nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || die "no CUDA toolkit found (nvcc): install CUDA >= 12.8, or set CUDA_HOME to it"

echo "== install ($("$PY" -c 'import sys; print(sys.executable)'))"
# TORCH_SPEC may carry pip options (--index-url ...): split it into words on purpose.
read -r -a torch_spec <<< "${TORCH_SPEC:-torch}"
"$PY" -m pip install -q "${torch_spec[@]}"
"$PY" -m pip install -q --no-deps nvidia-cutlass==4.2.0.0   # CUTLASS headers only, no CUDA wheels
echo "   (pip may print an ERROR about nvidia-cutlass's dependencies: expected, only its headers are used)"
"$PY" -m pip install -q ninja pybind11 setuptools wheel pytest hypothesis matplotlib
# The optional `models` extra: transformers' MoE modules, which pg.nn.quantize_ swaps (tests/test_moe.py,
# the demo's MoE table; they skip without it). Pure Python with small wheels; CPU tests ~15 s.
"$PY" -m pip install -q "transformers>=5"

echo "== build"
# --no-build-isolation: the extension must compile against the torch installed above (an
# isolated build would fetch another torch); --no-deps: everything is installed already.
jobs=${MAX_JOBS:-$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
start=$(date +%s)
# pip -v streams the build (indented); the filter keeps setup.py's plan line and one line per compiled file
# (setup.py's "[persistent_gemm k/N done, elapsed(, ~ETA left)]" status, counted over the whole build, and
# the object it wrote); the whole log stays in build/install.log. The objects in build/ are reused by
# the next install (incremental). tests/test_setup.py runs this filter on setup.py's status lines.
mkdir -p "$ROOT/build"
log="$ROOT/build/install.log"
echo "   one line per compiled file below; the full log: $log"
set +e
MAX_JOBS=$jobs "$PY" -m pip install -v --no-build-isolation --no-deps -e . 2>&1 | tee "$log" | awk '
  /^ *persistent_gemm: compiling/ { sub(/^ +/, ""); print "   " $0; fflush() }
  /^ *\[persistent_gemm [0-9]+\/[0-9]+ done/ {
    status = $0; sub(/^ +/, "", status); status = substr(status, 1, index(status, "]"))
    out = ""; for (i = 5; i < NF; i++) if ($i == "-o") out = $(i + 1)
    n = split(out, part, "/"); printf "   %s %s\n", status, part[n]; fflush()
  }'
rc=${PIPESTATUS[0]}
set -e
end=$(date +%s)
if [ "$rc" -ne 0 ]; then
  tail -40 "$log" >&2
  die "the build failed (rc $rc) after $((end - start)) s; the full log is $log"
fi
echo "build took $((end - start)) s"
