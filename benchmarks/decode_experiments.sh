set -x
S1=sm90a_bf16_64x16x64_c1x1_sw1_row_pp_swapab; SK2=sm90a_bf16_64x16x64_c1x1_sw1_row_sk2_pp_swapab
K128=sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab; S8=sm90a_bf16_64x16x64_c1x1_sw1_row_pp_swapab_s8
SK4=sm90a_bf16_64x16x64_c1x1_sw1_row_sk4_pp_swapab; SK8=sm90a_bf16_64x16x64_c1x1_sw1_row_sk8_pp_swapab
E1=sm90a_e4m3_64x16x128_c1x1_sw1_row_pp_swapab; E2=sm90a_e4m3_64x16x128_c1x1_sw1_row_sk2_pp_swapab
python3 -m persistent_gemm precompile --jobs 4 $K128 $S8 $SK4 $SK8 2>&1 | tail -3
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py 2>&1 | tail -3
B="python3 benchmarks/bench_decode.py --reps 25"
$B --out $OUT/d_mm --ops mm --tokens 1,16 --force $S1,$SK2,$K128,$S8,$SK4 | grep -v "^op="
PGEMM_K_ROTATE=7 $B --out $OUT/d_mm_rot --ops mm --tokens 1,16 --force $S1,$SK2 | grep -v "^op="
$B --out $OUT/d_small --ops mm --tokens 1 --weights 1024x16384,2048x8192 --force $S1,$SK2,$SK4,$SK8 | grep -v "^op="
$B --out $OUT/d_fp8 --ops fp8_tensor,fp8_row --force $E1,$E2 | grep -v "forced"
bash benchmarks/gpu_session.sh sanitize --family e4m3
