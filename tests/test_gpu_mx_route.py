"""GPU tests of the MX routes on SM90, each route config forced: the bf16 route (``route="bf16"``:
both block scales folded into bf16 operands, fp32 accumulation over the whole K, no per-32
promotion) and the FP8 x FP4 fold route (``route="fold"``: the weight's scale folded into its
e4m3 conversion per 16-row strip and block; strips outside the window convert plainly). The
scale ranges and e8m0 edge codes of test_gpu_mx, weights whose rows span many binades (the
per-row reference exponent; for the fold, the plain path), the fold window's edges and strips
mixing folded and plain, bitwise determinism, and the MX dequantization op the "dequantize,
then torch.mm" baseline uses.

Outputs are NaN-poisoned and checked against float64 within error_bound of the emulation's
error (mx_helpers.check_mx), the bound test_gpu_mx holds the promoting kernels to. Shapes,
tails, layouts and K-tile counts of every built config (route ones included) are
test_gpu_mx.test_mx_every_config*.
"""

import pytest
import torch
from conftest import (
    FP16_SAFE_SCALES,
    built_configs,
    e8m0_scales,
    error_bound,
    mx_blocks,
    poisoned,
    reference,
    rel_err,
)
from mx_helpers import MX_FAMILY, MX_FLOOR, MX_OPS, check_mx, emulation, mx_call, mx_operands

import persistent_gemm as pg

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

CUDA = "cuda"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ROUTE = [pytest.param(op, name, id=name) for op in MX_OPS for name in built_configs(MX_FAMILY[op], arch="sm90a")
         if name.endswith(("_bf16route", "_fold")) or "_bf16route_" in name or "_fold_" in name]
FOLD = [p for p in ROUTE if "_fold" in p.values[1]]
K = {"mxfp8_mm": 1000, "fp8_fp4_mm": 992}  # off every K-tile multiple


def run(op, args, name, out_dtype=FP32, check=True):
    m, n = args[0].shape[0], args[2].shape[1]
    out = poisoned(lambda: mx_call(op, args, out_dtype=out_dtype, config=name), m, n, out_dtype)
    if check:
        check_mx(op, out, args, out_dtype)
    return out


WIDE = {
    "both_wide": ((127, 50), None),
    "a_low_b_high": ((77, 50), (177, 50)),
    "a_high_b_low": ((177, 50), (77, 50)),
    "both_low": ((87, 20), None),
}


@pytest.mark.parametrize("out_dtype", [BF16, FP32], ids=str)
@pytest.mark.parametrize("case", list(WIDE))
@pytest.mark.parametrize("op, name", ROUTE)
def test_route_wide_exponent_ranges(op, name, case, out_dtype):
    a_scales, b_scales = WIDE[case]
    for m, n in ((300, 1000), (1, 257)):
        run(op, mx_operands(op, m, n, K[op], seed=m + n, scales=a_scales, b_scales=b_scales), name, out_dtype)


@pytest.mark.parametrize("op, name", ROUTE)
def test_route_fp16_out(op, name):
    run(op, mx_operands(op, 129, 300, K[op], seed=4, scales=FP16_SAFE_SCALES), name, FP16)


@pytest.mark.parametrize("op, name", ROUTE)
def test_route_rows_spanning_many_binades(op, name):
    # Each weight row and each token holds codes 120 binades apart (2^-60 .. 2^60): one factor of
    # 2^(code - 127) per operand would still fit bf16 here, but a fold against a fixed exponent
    # could not hold rows whose codes sit near both ends of e8m0; the per-row reference
    # exponent keeps every product exact. Both ends meet in every output.
    m, n, k = 129, 300, K[op]
    a, sa, b, sb = mx_operands(op, m, n, k, seed=21, scales=(127, 60), b_scales=(127, 60))
    run(op, (a, sa, b, sb), name, FP32)
    # References near the ends of e8m0: tokens 2^-120 .. 2^-100, weights 2^90 .. 2^110.
    sa = e8m0_scales(m, mx_blocks(k), seed=22, device=CUDA, center=17, spread=10)
    sb = e8m0_scales(n, mx_blocks(k), seed=23, device=CUDA, center=227, spread=10)
    run(op, (a, sa, b, sb), name, FP32)


@pytest.mark.parametrize("op, name", ROUTE)
def test_route_code_0_and_255(op, name):
    m, n, k = 65, 129, K[op]
    a, _, b, _ = mx_operands(op, m, n, k, seed=5)
    sa = torch.zeros(m, mx_blocks(k), dtype=torch.uint8, device=CUDA).view(torch.float8_e8m0fnu)
    sb = e8m0_scales(n, mx_blocks(k), seed=6, device=CUDA, center=227, spread=10)
    out = run(op, (a, sa, b, sb), name, check=False)
    ref = reference(op, (a, sa, b, sb))
    err, bound = rel_err(out, ref), error_bound(rel_err(emulation(op, (a, sa, b, sb), FP32), ref), MX_FLOOR)
    assert err <= bound, f"code 0 (2^-127): rel err {err:.3g} > bound {bound:.3g}"
    # Code 255 is NaN: its token's row and its weight row's column of D, nothing else.
    a, sa, b, sb = mx_operands(op, 129, 100, k, seed=7)
    sa.view(torch.uint8)[3, 1] = 255
    sb.view(torch.uint8)[5, 0] = 255
    out = run(op, (a, sa, b, sb), name, check=False)
    nan = torch.zeros(129, 100, dtype=torch.bool, device=CUDA)
    nan[3, :] = True
    nan[:, 5] = True
    assert out[nan].isnan().all() and not out[~nan].isnan().any()


@pytest.mark.parametrize("op, name", ROUTE)
def test_route_is_deterministic_and_batch_invariant(op, name):
    # The route has no split-K: a token's output bits depend on its own row only.
    args = mx_operands(op, 300, 1000, K[op], seed=9)
    first = run(op, args, name, BF16)
    torch.testing.assert_close(run(op, args, name, BF16, check=False), first, rtol=0, atol=0)
    a, sa, b, sb = args
    alone = run(op, (a[:7], sa[:7], b, sb), name, BF16, check=False)
    torch.testing.assert_close(alone, first[:7], rtol=0, atol=0)


@pytest.mark.parametrize("out_dtype", [BF16, FP32], ids=str)
@pytest.mark.parametrize("center", [7, 127, 240])
@pytest.mark.parametrize("op, name", FOLD)
def test_fold_window_edges_and_mixed_strips(op, name, center, out_dtype):
    # Weight codes within 7 of `center`: every strip spans <= 14, so every (strip, block) folds,
    # and blocks 0 and -1 hold both ends of the window in every strip (shifts -8 and +6: e4m3
    # subnormals at the bottom, 384 at the top). center = 7 puts code 0 (2^-127) in the window, 240 code 247.
    from persistent_gemm.fold import kernel_folds

    m, n, k = 300, 257, K[op]
    # The activations' codes mirror the weight's about 127, so the products stay in fp32's range
    # (2^-20..2^20 against the weight's 2^120 overflows any exact kernel), and each operand's
    # dequantized values in bf16's (the emulation's): activation codes <= 243, weight codes <= 247.
    a, sa, b, sb = mx_operands(op, m, n, k, seed=center, scales=(min(254 - center, 236), 7), b_scales=(center, 7))
    assert kernel_folds(sb[:256]).all()
    run(op, (a, sa, b, sb), name, out_dtype)
    # Odd strips widened to a span of 15 in every block: they take the plain path, the even ones
    # fold, side by side in each tile and wgmma.
    codes = sb.view(torch.uint8).clone()
    lo, hi = (center - 7, center + 8) if center < 240 else (center - 8, center + 7)
    for s in range(1, n // 16, 2):
        codes[16 * s], codes[16 * s + 1] = lo, hi
    sb2 = codes.view(torch.float8_e8m0fnu)
    folds = kernel_folds(sb2)
    assert folds[:16:2].all() and not folds[1:16:2].any()
    run(op, (a, sa, b, sb2), name, out_dtype)


@pytest.mark.parametrize("fmt", ["mxfp8", "fp4"])
def test_dequantize_mx_matches_the_definition(fmt):
    # The baseline's CUDA dequantization equals quant.py's, rounded to bf16 once, bit for bit.
    rows, k = 257, 1000 if fmt == "mxfp8" else 992
    x = torch.randn(rows, k, device=CUDA) * torch.logspace(-3, 3, rows, device=CUDA)[:, None]
    data, scale = pg.quantize_mxfp8(x) if fmt == "mxfp8" else pg.quantize_mxfp4(x)
    scale.view(torch.uint8)[4, 2] = 255
    got = torch.ops.persistent_gemm.dequantize_mx(data, scale)
    want = torch.ops.persistent_gemm.dequantize_mx(data.cpu(), scale.cpu())
    assert got.dtype == BF16 and got.shape == (rows, k)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
    # test_schema compares the float8 inputs before and after, which torch cannot do for float8;
    # the compiled-vs-eager comparison treats NaN as a difference, so no code 255 there.
    scale.view(torch.uint8)[4, 2] = 127
    torch.library.opcheck(torch.ops.persistent_gemm.dequantize_mx, (data, scale),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
