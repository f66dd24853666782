#!/usr/bin/env bash
# Issue 12's decode measurements on the H200 (after `gpu_session.sh build`): the decode GPU tests,
# bench_decode.py in CUDA-graph replay for every op, the narrow-weight rows with the split-K
# configs forced beside the dispatcher's pick, the e4m3 K-tile comparison, and memcheck over the
# decode families' tail shapes. Results under $OUT.
set -uo pipefail
OUT=${OUT:-benchmarks/results/run}
B="python3 benchmarks/bench_decode.py --reps 25"
S1=sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab; SK4=sm90a_bf16_64x16x128_c1x1_sw1_row_sk4_pp_swapab
E1=sm90a_e4m3_64x16x256_c1x1_sw1_row_pp_swapab; E4=sm90a_e4m3_64x16x256_c1x1_sw1_row_sk4_pp_swapab
E128=sm90a_e4m3_64x16x128_c1x1_sw1_row_pp_swapab  # JIT: the 128 B K-tile, for comparison
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py 2>&1 | tail -3
$B --out "$OUT/h200_decode" --force "$E128" 2>&1 | grep -v "^op=" | tail -42
$B --out "$OUT/h200_decode_narrow" --ops mm,fp8_tensor --tokens 1,16 --weights 1024x16384,2048x8192 \
   --force "$S1,$SK4,$E1,$E4" 2>&1 | grep -v "^op=" | tail -14
for fam in bf16_64x16x128_c1x1 fp16_64x16x128_c1x1 e4m3_64x16x256_c1x1; do bash benchmarks/gpu_session.sh sanitize --family $fam; done
