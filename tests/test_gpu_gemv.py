"""GPU tests of the MX decode GEMV (kernel style "gemv", kernel/sm90_mx_gemv.hpp) behind
mxfp8_mm and fp8_fp4_mm: the dispatcher's choice at decode M, every M in the issue's list
against float64 (odd N, K from 32 to 28672, both scale layouts, prepared and plain weights), wide
and extreme e8m0 codes, NaN, every output dtype, CUDA graphs, torch.compile, bitwise
reproducibility (runs, token tiles) and the cross-CTA reduction on strips shared by many CTAs.

Outputs are NaN-poisoned before each launch and checked by mx_helpers.check_mx (within
error_bound of the fp32 emulation's error against float64)."""

import pytest
import torch
from conftest import FP16_SAFE_SCALES, e8m0_scales, mx_blocks, poisoned, reference, rel_err, error_bound, rounding_err
from mx_helpers import MX_FAMILY, MX_FLOOR, MX_OPS, check_mx, gemv_tokens, mx_call, mx_configs, mx_operands, with_layout

import persistent_gemm as pg

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

CUDA = "cuda"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def gemv_configs(op):
    return [n for n in mx_configs(op) if gemv_tokens(n)]


OPS = [pytest.param(op, id=op, marks=pytest.mark.skipif(not gemv_configs(op), reason="no MX decode GEMV built"))
       for op in MX_OPS]
MS = [1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 64]
FMT = {"mxfp8_mm": "mxfp8", "fp8_fp4_mm": "fp4"}


def smallest_gemv(op, m):
    return min((n for n in gemv_configs(op) if gemv_tokens(n) >= m), key=gemv_tokens)


def run(op, args, out_dtype=BF16, layout="plain", config=None, prepared=False, check=True):
    call, kw = with_layout(args, layout)
    if prepared:
        call = (call[0], call[1], pg.prepare_weight(args[2].t(), args[3], fmt=FMT[op]))
        kw.pop("scale_b_layout", None)
    m, n = args[0].shape[0], args[2].shape[1]
    out = poisoned(lambda: mx_call(op, call, out_dtype=out_dtype, config=config, **kw), m, n, out_dtype)
    if check:
        check_mx(op, out, args, out_dtype)
    return out


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", MS)
def test_dispatcher_picks_the_gemv_at_decode(op, m):
    dtype = MX_FAMILY[op]
    e = pg.explain(m, 8192, 8192, dtype=dtype)
    if m <= 16:
        assert "_gemv_" in e.config, str(e)
        assert "decode GEMV" in str(e)
    with pytest.raises(ValueError, match="not a multiple of 32|exceeds"):
        mx_call(op, mx_operands(op, 65, 64, 64), config=smallest_gemv(op, 64))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", MS)
def test_every_decode_m_against_float64(op, m):
    # Odd N over two strips and a tail; K with a partial last 256-byte unit.
    for i, (n, k) in enumerate([(257, 96), (1000, 4096 + 32 * 3)]):
        args = mx_operands(op, m, n, k, seed=m * 3 + i)
        for layout in ("plain", "blocked"):
            run(op, args, BF16, layout, config=smallest_gemv(op, m))
        run(op, args, FP32, "plain", config=smallest_gemv(op, m), prepared=True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("k", [32, 64, 480, 8192, 28672])
def test_k_range_and_shared_strips(op, k):
    # N = 8191: 64 strips; the K units spread strips over CTAs, so reducers add 1..n partners.
    for m in (1, 16):
        args = mx_operands(op, m, 8191 if k <= 8192 else 1000, k, seed=k + m)
        run(op, args, BF16, "plain", config=smallest_gemv(op, m), prepared=True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32], ids=str)
def test_every_out_dtype(op, out_dtype):
    scales = FP16_SAFE_SCALES if out_dtype == FP16 else (127, 20)
    args = mx_operands(op, 9, 1000, 992, seed=4, scales=scales)
    out = run(op, args, out_dtype, config=smallest_gemv(op, 9))
    assert out.dtype == out_dtype


@pytest.mark.parametrize("op", OPS)
def test_wide_exponents(op):
    # Weights near 2^+100, activations near 2^-100 (products near 1), and 2^40 between a row's
    # blocks (the scales' default spread puts both extremes in every row).
    m, n, k = 16, 1000, 4096
    args = mx_operands(op, m, n, k, seed=8, scales=(27, 5), b_scales=(227, 5))
    run(op, args, FP32, config=smallest_gemv(op, m))
    run(op, mx_operands(op, m, n, k, seed=9), FP32, config=smallest_gemv(op, m))


@pytest.mark.parametrize("op", OPS)
def test_e8m0_codes_0_and_255(op):
    m, n, k = 7, 300, 1024
    a, _, b, _ = mx_operands(op, m, n, k, seed=5)
    sa = torch.zeros(m, mx_blocks(k), dtype=torch.uint8, device=CUDA).view(torch.float8_e8m0fnu)
    sb = e8m0_scales(n, mx_blocks(k), seed=6, device=CUDA, center=227, spread=10)
    args = (a, sa, b, sb)
    out = run(op, args, FP32, config=smallest_gemv(op, m), check=False)
    ref = reference(op, args)
    assert rel_err(out, ref) <= error_bound(rounding_err(ref, FP32), MX_FLOOR)
    # Code 255 is NaN: its token's column and its weight row are NaN, nothing else.
    a, sa, b, sb = mx_operands(op, m, n, k, seed=7)
    sa.view(torch.uint8)[3, 2] = 255
    sb.view(torch.uint8)[200, 5] = 255
    out = run(op, (a, sa, b, sb), FP32, config=smallest_gemv(op, m), check=False)
    nan = torch.zeros(m, n, dtype=torch.bool, device=CUDA)
    nan[3, :] = True
    nan[:, 200] = True
    assert out[nan].isnan().all() and not out[~nan].isnan().any()


@pytest.mark.parametrize("op", OPS)
def test_bitwise_reproducible_across_runs_and_token_tiles(op):
    m, n, k = 1, 8192, 8192
    a, sa, b, sb = mx_operands(op, m, n, k, seed=10)
    pw = pg.prepare_weight(b.t(), sb, fmt=FMT[op])
    first = mx_call(op, (a, sa, pw), out_dtype=FP32, config=smallest_gemv(op, 1))
    for _ in range(20):
        torch.testing.assert_close(mx_call(op, (a, sa, pw), out_dtype=FP32, config=smallest_gemv(op, 1)), first,
                                   rtol=0, atol=0)
    # A token's column never depends on the others: every token tile gives the same bits.
    for name in gemv_configs(op):
        torch.testing.assert_close(mx_call(op, (a, sa, pw), out_dtype=FP32, config=name), first, rtol=0, atol=0,
                                   msg=name)


@pytest.mark.parametrize("op", OPS)
def test_graph_capture_and_replay(op):
    m, n, k = 4, 4096, 4096
    args = mx_operands(op, m, n, k, seed=12)
    pw = pg.prepare_weight(args[2].t(), args[3], fmt=FMT[op])
    x, xs = args[0].clone(), args[1].clone()
    mx_call(op, (x, xs, pw))  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = mx_call(op, (x, xs, pw))
    for seed in (13, 14):
        new = mx_operands(op, m, n, k, seed=seed)
        x.copy_(new[0])
        xs.copy_(new[1])
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_mx(op, out, (new[0], new[1], args[2], args[3]), BF16)


@pytest.mark.parametrize("op", OPS)
def test_compile_fullgraph(op):
    args = mx_operands(op, 3, 1000, 1024, seed=15)
    pw = pg.prepare_weight(args[2].t(), args[3], fmt=FMT[op])
    fn = torch.compile(lambda x, xs: getattr(pg, op)(x, pw, xs), fullgraph=True)
    check_mx(op, fn(args[0], args[1]), args, BF16)


@pytest.mark.parametrize("op", OPS)
def test_strided_activation_scales_are_read_in_place(op):
    # Plain activation scales as a column slice of a wider buffer (row stride > blocks).
    m, n, k = 5, 300, 1024
    a, sa, b, sb = mx_operands(op, m, n, k, seed=16)
    wide = torch.full((m, mx_blocks(k) + 9), 127, dtype=torch.uint8, device=CUDA)
    wide[:, 3:3 + mx_blocks(k)] = sa.view(torch.uint8)
    view = wide[:, 3:3 + mx_blocks(k)].view(torch.float8_e8m0fnu)
    out = poisoned(lambda: mx_call(op, (a, view, b, sb), config=smallest_gemv(op, m)), m, n, BF16)
    check_mx(op, out, (a, sa, b, sb), BF16)
