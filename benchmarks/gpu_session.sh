#!/usr/bin/env bash
# One session on the H200 machine: build for sm_90a, run the GPU tests, run the benchmark.
# Run from the repository root with the CUTLASS wheel downloaded into .whl/ (docs/benchmarks.md,
# "Benchmarks"); results land under $OUT (default benchmarks/results/run).
#
#   bash benchmarks/gpu_session.sh build|test|grouped|grouped_owed|grouped_sanitize|grouped_ncu|moe_routing|sanitize|verify|stream_k|tiles|fitted|ncu_stalls|ncu_pair|closing|accuracy|bench|bench_mx|decode|quant [extra bench_mm.py / bench_mx.py arguments]
#
# A device call brings back only a few files from $OUT: run the steps with OUT=$OUT/r and end the
# call with `tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r`, or the logs past the first few are lost.
#
# bench_mx also times humming (the optional peer) when its wheel is in .whl/
# (pip download --no-deps -d .whl humming-kernels==0.1.19): installed without dependencies into
# /tmp/site, which only that step puts on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-benchmarks/results/run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The CUTLASS wheel is unpacked outside .whl/: a carried path is replaced on every device call, so
# headers unpacked into it would be gone by the next call (and the JIT with them).
CUTLASS_DIR=build/cutlass_wheel
export PGEMM_CUTLASS_PATH=${PGEMM_CUTLASS_PATH:-$PWD/$CUTLASS_DIR/cutlass_library/source}
if [ ! -f "$PGEMM_CUTLASS_PATH/include/cutlass/cutlass.h" ] && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e .whl/nvidia_cutlass-*.whl "$CUTLASS_DIR/" || exit 1
fi

# pytest_file PREFIX FILE [pytest args]: one test file in its own process (a kernel fault is a
# sticky CUDA error that fails every later test of its process), logged to $OUT/PREFIX<file>.log.
pytest_file() {
  local log="$OUT/$1$(basename "$2" .py).log"
  timeout 300 python3 -m pytest -q -p no:cacheprovider "$2" "${@:3}" > "$log" 2>&1
  echo "$2: $(tail -1 "$log")"; grep -E "^(FAILED|ERROR)" "$log" | head -8
}
# sanitize_three LABEL [sanitize_tails.py args]: memcheck, racecheck and synccheck over the tail
# shapes of the kernels the arguments select, logged to $OUT/sanitize_LABEL_<tool>.log.
sanitize_three() {
  local tool log
  for tool in memcheck racecheck synccheck; do
    log="$OUT/sanitize_$1_$tool.log"
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 1 python3 benchmarks/sanitize_tails.py "${@:2}" > "$log" 2>&1
    echo "$1 $tool rc=$? ($(tail -1 "$log"))"
  done
}
# sanitize_grouped LABEL MATCH LIMIT TOOL...: each compute-sanitizer TOOL over the grouped configs
# sanitize_grouped.py --match MATCH finds (--quick routings but for memcheck), at most LIMIT
# seconds each, logged to $OUT/sanitize_grouped_[LABEL_]TOOL.log.
sanitize_grouped() {
  local label=$1 match=$2 limit=$3 tool log
  for tool in "${@:4}"; do
    log="$OUT/sanitize_grouped_${label:+${label}_}$tool.log"
    timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 1 python3 benchmarks/sanitize_grouped.py \
      --match "$match" $([ $tool = memcheck ] || echo --quick) > "$log" 2>&1
    echo "grouped ${label:+$label }$tool rc=$? ($(tail -1 "$log"))"
  done
}

case "${1:-}" in
  build)
    start=$(date +%s)
    TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-16} \
      python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
    rc=$?
    echo "build rc=$rc in $(( $(date +%s) - start )) s"
    [ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit $rc; }
    ;;
  grouped)
    # Issue 45 on a build of the grouped kernels (PGEMM_KERNELS=_grouped_ ... build), in the order
    # that matters if the call runs out: the grouped GPU tests, moe.csv (gpt-oss-20b up and down;
    # more with extra bench_moe.py arguments), the kernels' token tiles probe, memcheck over the
    # prefill tiles, the MoE module's GPU tests. SANITIZE=1 adds memcheck, racecheck and synccheck
    # over every grouped kernel.
    shift
    pytest_file grouped_ tests/test_gpu_grouped.py
    timeout ${BENCH_TIMEOUT:-220} python3 benchmarks/bench_moe.py --shapes gpt-oss-20b-up,gpt-oss-20b-down \
      --tokens 1,16,128,1024,4096 --eager-tokens 16,1024,4096 --check --out "$OUT/moe.csv" "$@" 2>&1 | tee "$OUT/bench_moe.log" | tail -30
    timeout 100 python3 benchmarks/grouped_tiles.py --tokens 1,16,128,1024,4096 | tee "$OUT/grouped_tiles.txt"
    sanitize_grouped tiles _coop_ 90 memcheck
    pytest_file grouped_ tests/test_moe.py -k TestCuda
    [ -z "${SANITIZE:-}" ] || sanitize_grouped "" "" 300 memcheck racecheck synccheck
    ;;
  grouped_sanitize)
    # The grouped kernels MATCH finds (a sanitize_grouped.py --match regex; default all) under
    # TOOLS (default: racecheck synccheck), SAN_TIMEOUT seconds each, logs labelled LABEL.
    sanitize_grouped "${LABEL:-all}" "${MATCH:-}" "${SAN_TIMEOUT:-300}" ${TOOLS:-racecheck synccheck}
    ;;
  grouped_owed)
    # What issue 45 still owes a GPU (docs/design/grouped_moe.md, next step 1), most needed first,
    # on a build of the grouped kernels, OUT tarred after each part: racecheck and synccheck of the
    # refactored grouped GEMVs (the 8-token one of each family), the gpt-oss-20b layer rows (needs
    # transformers' wheels in .whl/tf: the design note says how), moe.csv's 1024 / 4096 rows in
    # every format, gpt-oss-120b, DeepSeek-like, test_moe's GPU class.
    [ -d .whl/tf ] && python3 -m pip install -q --no-deps -t /tmp/tfsite .whl/tf/*.whl > "$OUT/tf_install.log" 2>&1
    sanitize_grouped gemv8 _128x8x "${SAN_TIMEOUT:-75}" racecheck synccheck
    tar czf "$OUT.part.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
    owed_bench() {  # name timeout bench_moe.py arguments
      PYTHONPATH=/tmp/tfsite timeout "$2" python3 benchmarks/bench_moe.py --check --eager-tokens 16,1024,4096 \
        --out "$OUT/moe_$1.csv" "${@:3}" > "$OUT/bench_moe_$1.log" 2>&1
      echo "bench_moe $1 rc=$?"; tail -3 "$OUT/bench_moe_$1.log"
      tar czf "$OUT.part.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
    }
    owed_bench layer 100 --shapes gpt-oss-20b-layer --tokens 1,16,128
    owed_bench 20b_big 110 --shapes gpt-oss-20b-up,gpt-oss-20b-down --tokens 1024,4096
    owed_bench 120b 130 --shapes gpt-oss-120b-up,gpt-oss-120b-down --tokens 1,16,128,1024,4096
    owed_bench deepseek 200 --shapes deepseek-like-up,deepseek-like-down --tokens 1,16,128,1024,4096
    PYTHONPATH=/tmp/tfsite pytest_file grouped_ tests/test_moe.py -k TestCuda
    ;;
  moe_routing)
    # The MoE routing kernels (moe_dispatch / moe_activation / moe_combine): their GPU tests, the
    # three sanitizers (logs sanitize_moe_routing_<tool>.log), the MoE module's GPU tests, then the
    # gpt-oss-20b layer rows that run on them (transformers' wheels from .whl/tf; SKIP_LAYER=1 skips them).
    pytest_file moe_ tests/test_gpu_moe_routing.py
    for tool in memcheck racecheck synccheck; do
      log="$OUT/sanitize_moe_routing_$tool.log"
      timeout ${SAN_TIMEOUT:-80} compute-sanitizer --tool $tool --error-exitcode 1 python3 benchmarks/sanitize_moe_routing.py > "$log" 2>&1
      echo "moe_routing $tool rc=$? ($(tail -1 "$log"))"
    done
    [ -d .whl/tf ] && [ ! -d /tmp/tfsite ] && python3 -m pip install -q --no-deps -t /tmp/tfsite .whl/tf/*.whl > "$OUT/tf_install.log" 2>&1
    PYTHONPATH=/tmp/tfsite pytest_file moe_ tests/test_moe.py -k TestCuda
    [ -n "${SKIP_LAYER:-}" ] && exit 0  # (the layer rows taken already)
    PYTHONPATH=/tmp/tfsite timeout 100 python3 benchmarks/bench_moe.py --check --eager-tokens 16 --shapes gpt-oss-20b-layer \
      --tokens 1,16,128 --out "$OUT/moe_layer.csv" > "$OUT/bench_moe_layer.log" 2>&1
    echo "bench_moe layer rc=$?"; tail -12 "$OUT/bench_moe_layer.log"
    ;;
  grouped_ncu)
    # Where an MoE contender's time goes (profile_moe.py): one launch of each LABELS entry under
    # ncu --set full at TOKENS (default 16) of SHAPE (default gpt-oss-20b-up), the report and its
    # details page as text under $OUT.
    for label in ${LABELS:-ours:mxfp4_weight_only tk:mxfp4_weight_only}; do
      rep="$OUT/ncu_moe_${label/:/_}_${TOKENS:-16}"
      timeout ${NCU_TIMEOUT:-200} ncu --kernel-name regex:'sm90_mx_gemv|matmul_ogs|sm90_gemm_persistent' \
        --launch-skip 3 --launch-count 1 --set full --import-source yes -f -o "$rep" \
        python3 benchmarks/profile_moe.py --shape "${SHAPE:-gpt-oss-20b-up}" --tokens "${TOKENS:-16}" \
        --label "$label" > "$rep.log" 2>&1
      echo "$label rc=$? $(tail -1 "$rep.log")"
      ncu --import "$rep.ncu-rep" --page details > "$rep.txt" 2>&1
      grep -E "^  [a-z_]|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Grid Size|Dynamic Shared" "$rep.txt" | head -14
      ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
      python3 benchmarks/ncu_stall_lines.py "$rep.sass.csv" 20 > "$rep.stalls.txt" 2>&1
    done
    ;;
  test)
    python3 -m pytest tests -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
    ;;
  sanitize)
    # memcheck over tail shapes of every built kernel (out-of-bounds TMA boxes, predicated stores).
    shift
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_tails.py "$@" \
      > "$OUT/sanitize.log" 2>&1
    rc=$?
    tail -3 "$OUT/sanitize.log"
    echo "sanitize rc=$rc"
    ;;
  accuracy)
    python3 benchmarks/accuracy_scaled_mm.py --out "$OUT/h200_scaled_mm_accuracy" 2>&1 | tail -14
    ;;
  bench)
    shift
    python3 benchmarks/bench_mm.py --out "$OUT/h200" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^sweep" | tail -60
    ;;
  quant)
    shift
    python3 benchmarks/bench_quant.py --out "$OUT/h200_quant" "$@" 2>&1 | tee "$OUT/quant.log" | tail -20
    ;;
  decode)
    shift
    python3 benchmarks/bench_decode.py --out "$OUT/h200_decode" "$@" 2>&1 | tee "$OUT/decode.log" | tail -40
    ;;
  bench_mx)
    shift
    site=""
    hum=$(ls .whl/humming_kernels-*.whl 2>/dev/null | head -1)
    if [ -n "$hum" ]; then
      if [ -d /tmp/site/humming ] || python3 -m pip install -q --no-deps --target /tmp/site "$hum" > "$OUT/humming_install.log" 2>&1; then
        site=/tmp/site
      else
        echo "humming install failed (see $OUT/humming_install.log): bench_mx runs without it"
      fi
    fi
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/bench_mx.py --out "$OUT/h200_mx.csv" "$@" 2>&1 \
      | tee "$OUT/bench_mx.log" | tail -80
    ;;
  verify)
    # One batched call for what a session without a GPU built (the stop after issue 22's route):
    # after `build` with PGEMM_KERNELS='e4m3xe2m1_128x128x128|mxfp8_128x128x128|bf16route|gemv|bf16_128x256',
    # the GPU tests of the fold route, the MX ops' new argument order, weight-only MX and the
    # self-check's two passes, then memcheck on the fold kernel. Logs under $OUT.
    # One pytest process per file: a kernel fault is a sticky CUDA error that fails every later
    # test of its process (the first run of the fold kernel took 521 tests down with it).
    for f in tests/test_gpu_weight_only_kernels.py tests/test_gpu_weight_only.py tests/test_gpu_mx_route.py \
             tests/test_gpu_mx.py tests/test_gpu_gemv.py tests/test_gpu_ops.py tests/test_self_check.py; do
      python3 -m pytest -q -p no:cacheprovider "$f" > "$OUT/verify_$(basename "$f" .py).log" 2>&1
      echo "$f: $(tail -1 "$OUT/verify_$(basename "$f" .py).log")"
    done
    for fam in fold bf16xe2m1 bf16xe4m3; do
      compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/sanitize_tails.py --family $fam \
        > "$OUT/sanitize_${fam}_memcheck.log" 2>&1
      echo "$fam memcheck rc=$? ($(tail -1 "$OUT/sanitize_${fam}_memcheck.log"))"
    done
    ;;
  stream_k)
    # Issue 27's kernels after `build` (PGEMM_KERNELS='sm90a_(bf16|e4m3)_' suffices): their GPU
    # tests and split-K's (the shared fixup), then memcheck, racecheck and synccheck over their
    # tail shapes. One pytest process per file (a fault is sticky). Logs under $OUT.
    for f in tests/test_gpu_stream_k.py tests/test_gpu_decode.py; do pytest_file "" "$f"; done
    sanitize_three streamk --family streamk
    ;;
  tiles)
    # Catalogue tiles new since the last GPU run, after `build`: their forced GPU tests (pytest -k
    # "$K", one process per file: a fault is sticky), then memcheck, racecheck and synccheck over
    # their tail shapes (sanitize_tails.py --match "$MATCH"). Logs under $OUT.
    for f in tests/test_gpu.py tests/test_gpu_scaled_mm.py tests/test_gpu_ops.py; do
      pytest_file tiles_ "$f" -k "${K:?K=pytest -k expression}"
    done
    sanitize_three tiles --match "${MATCH:?MATCH=config regex}"
    ;;
  fitted)
    # Issue 27's fitted tiles: the not-built configs of tests/data/issue27_fitted_configs.txt (or EXTRAS=file)
    # JIT-compiled and swept beside every built config and the peer on the ragged rows, kernel time.
    shift
    python3 benchmarks/bench_mm.py --out "$OUT/h200_fitted" --kernel-time --sweep \
      --configs "$(cat ${EXTRAS:-tests/data/issue27_fitted_configs.txt})" \
      --shapes "${SHAPES:-257x4096x4096,1000x3000x5000,2048x2048x2048,128x28672x8192}" "$@" 2>&1 \
      | tee "$OUT/fitted.log" | grep -vE "^(sweep|  )" | tail -12; grep -E "^sweep" "$OUT/fitted.log" | sed 's/  */ /g; s/^sweep //' 
    ;;
  ncu_pair)
    # Issue 27's reuse question: one launch each of a data-parallel config and its stream-K twin
    # on one shape under ncu (DRAM bytes, L2 hit rate, throughput), after `build`. Override with
    # SHAPE=, DP=, SK= (config names; a config that is not built is JIT-compiled first);
    # NCU_SECTIONS adds sections (e.g. "--section WarpStateStats").
    shape=${SHAPE:-257x4096x4096}
    for cfg in "${DP:-sm90a_bf16_128x128x64_c1x2_sw8_row_pp}" "${SK:-sm90a_bf16_128x128x64_c1x2_sw8_row_streamk_pp}"; do
      timeout 240 ncu --kernel-name regex:sm90_gemm_persistent --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis ${NCU_SECTIONS:-} \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
        python3 benchmarks/profile_config.py --shape "$shape" --config "$cfg" > "$OUT/ncu_${cfg}_${shape}.txt" 2>&1
      echo "$cfg rc=$?"
      grep -E "DRAM Throughput|Memory Throughput|L2 Hit Rate|Duration|dram__bytes|lts__t_sector" "$OUT/ncu_${cfg}_${shape}.txt" | head -10
    done
    ;;
  ncu_stalls)
    # Where a config's warps wait: one launch under ncu with warp-state and source-level stall
    # sampling, then the SASS lines with the most stall samples (ncu's source page as CSV) and
    # the warp-state summary, after `build`. SHAPE=, CONFIGS="a b" (not built: JIT-compiled first).
    shape=${SHAPE:-1000x3000x5000}
    for cfg in ${CONFIGS:?CONFIGS=config names}; do
      rep="$OUT/stalls_${cfg}_${shape}"
      timeout 240 ncu --kernel-name regex:sm90_gemm_persistent --launch-skip 3 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --section SpeedOfLight --import-source no -f -o "$rep" \
        python3 benchmarks/profile_config.py --shape "$shape" --config "$cfg" > "$rep.log" 2>&1
      echo "$cfg rc=$?"
      ncu --import "$rep.ncu-rep" --print-summary none --section WarpStateStats --section SpeedOfLight > "$rep.txt" 2>&1
      grep -E "Duration|Warp Cycles Per Issued|Stall|Issued Warp" "$rep.txt" | head -12
      ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
      python3 benchmarks/ncu_stall_lines.py "$rep.sass.csv" 25
    done
    ;;
  closing)
    # A stop's closing run after `build`: every built kernel through the self-check, the demo with
    # its real model in bf16 and fp16, the per-Linear host cost and where it goes, then the GPU
    # tests (the JIT's compile tests aside: they take minutes and the JIT did not change) in one
    # pytest process, whose log names any fault, for at most TEST_TIMEOUT seconds.
    PGEMM_SELF_CHECK=all timeout "${SELFCHECK_TIMEOUT:-120}" python3 -m persistent_gemm selfcheck --no-cache \
      > "$OUT/selfcheck.txt" 2>&1
    echo "selfcheck rc=$?"; grep -A1 "^FAIL" "$OUT/selfcheck.txt" | head -12; tail -1 "$OUT/selfcheck.txt"
    w=$(ls .whl/microformer_mgm-*.whl 2>/dev/null | head -1)
    timeout 120 python3 -m persistent_gemm demo ${w:+--model-weights "$w"} > "$OUT/demo.txt" 2>&1
    echo "demo rc=$?"; grep -E "^  (bf16|fp16) |ok: " "$OUT/demo.txt"
    timeout 60 python3 benchmarks/bench_linear.py --breakdown > "$OUT/breakdown.txt" 2>&1; tail -22 "$OUT/breakdown.txt"
    timeout 60 python3 benchmarks/profile_linear_host.py ${w:+--model-weights "$w"} --rows 8 > "$OUT/profile.txt" 2>&1
    echo "profile rc=$?"
    tests=$(ls tests/test_gpu*.py tests/test_self_check.py | grep -v test_gpu_jit)
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider $tests > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests rc=$?: $(tail -1 "$OUT/gpu_tests.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
    ;;
  *)
    sed -n 6p "$0" | sed "s|^#   bash benchmarks/gpu_session.sh|usage: $0|" >&2  # the header's list of steps
    exit 2
    ;;
esac
