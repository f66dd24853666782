"""GPU tests of the MX ops ``mxfp8_mm`` (e4m3 x e4m3) and ``fp8_fp4_mm`` (e4m3 x packed e2m1)
on SM90: tail shapes, K % 32 != 0 (mxfp8), every out dtype, both scale layouts and the mixed
one, every built MX config forced, prepared weights, CUDA graphs, opcheck/compile with the
scale layouts, determinism, long K, e8m0 edge codes and the argument errors.

Every output is NaN-poisoned before the launch (conftest.poisoned) and checked against the
float64 product of the dequantized inputs within error_bound of the emulation's error
(mx_helpers.check_mx: exact fp32 dequantization + fp32 torch.mm, TF32 off). Scales are random
e8m0 codes over a wide range with both extremes (2^40 apart) in every row, so a dropped, shifted
or misapplied block is a large error. Config names come from the built tables, never typed here.
"""

import re

import pytest
import torch
from conftest import (
    ARCH,
    call_args,
    FP16_SAFE_SCALES,
    FP4X2,
    catalogue_config,
    config_out_dtypes,
    e2m1_operand,
    e8m0_scales,
    error_bound,
    family_of,
    fp8_operand,
    mx_blocks,
    op_fn,
    poisoned,
    reference,
    rel_err,
    rounding_err,
)
from mx_helpers import (
    LAYOUTS,
    forced_fits,
    gemv_tokens,
    MX_FAMILY,
    MX_FLOOR,
    MX_OPS,
    check_mx,
    emulation,
    mx_built,
    mx_call,
    mx_configs,
    mx_operands,
    quantized_operands,
    with_layout,
)

import persistent_gemm as pg
from persistent_gemm.catalogue import CATALOGUE

# Arch-neutral: every test goes through the dispatcher or forces this device's own built configs
# (mx_configs), so the same suite runs on an SM100 GPU against the tcgen05 kernels.
pytestmark = [pytest.mark.gpu]

CUDA = "cuda"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ids = lambda s: "x".join(map(str, s))  # noqa: E731
dtype_id = lambda d: str(d).replace("torch.", "")  # noqa: E731
OPS = [pytest.param(op, id=op, marks=pytest.mark.skipif(not mx_built(op), reason=f"no {MX_FAMILY[op]} kernel built"))
       for op in MX_OPS]
SIZES = [1, 7, 33, 129, 1000, 8191]
#: K per op: mxfp8 takes any K (tail blocks), fp8_fp4 whole 32-blocks only.
KS = {"mxfp8_mm": [1, 33, 100, 1000, 4096], "fp8_fp4_mm": [32, 96, 992, 4096]}
K_MID = {"mxfp8_mm": 1000, "fp8_fp4_mm": 992}  # off every K-tile multiple
K_SMALL = {"mxfp8_mm": 100, "fp8_fp4_mm": 96}


def run(op, args, out_dtype=BF16, layout="plain", config=None, check=True):
    """op(*args) with the scales in ``layout``, poisoned, checked against float64."""
    call_args, kw = with_layout(args, layout)
    m, n = args[0].shape[0], args[2].shape[1]
    out = poisoned(lambda: mx_call(op, call_args, out_dtype=out_dtype, config=config, **kw), m, n, out_dtype)
    if check:
        check_mx(op, out, args, out_dtype)
    return out


def _shapes(op):
    """M over SIZES, N over SIZES, K over KS[op], plus large and decode shapes."""
    k = K_MID[op]
    out = [(m, 1000, k) for m in SIZES] + [(129, n, k) for n in SIZES] + [(33, 129, kk) for kk in KS[op]]
    out += [(8191, 8191, 4096), (1, 8191, 4096), (8191, 7, 4096)]
    return list(dict.fromkeys(out))


SHAPES = [pytest.param(op, s, id=f"{op}-{ids(s)}", marks=p.marks) for p in OPS for op in p.values for s in _shapes(op)]


# -- shapes, out dtypes, layouts ------------------------------------------------------------------
@pytest.mark.parametrize("op, mnk", SHAPES)
def test_mx_shapes(op, mnk):
    run(op, mx_operands(op, *mnk, seed=sum(mnk)))


@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32], ids=dtype_id)
@pytest.mark.parametrize("which", ["tail", "decode", "wide"])
@pytest.mark.parametrize("op", OPS)
def test_mx_out_dtypes(op, which, out_dtype):
    m, n, k = {"tail": (129, 1000, K_MID[op]), "decode": (1, 257, K_SMALL[op]), "wide": (1000, 33, K_MID[op])}[which]
    scales = FP16_SAFE_SCALES if out_dtype == FP16 else (127, 20)  # fp16 overflows the default range
    run(op, mx_operands(op, m, n, k, seed=m + n, scales=scales), out_dtype)


@pytest.mark.parametrize("op", OPS)
def test_mx_default_out_dtype_is_bf16(op):
    args = mx_operands(op, 129, 264, K_MID[op], seed=3)
    out = mx_call(op, args)
    assert out.dtype == BF16
    torch.testing.assert_close(out, mx_call(op, args, out_dtype=BF16), rtol=0, atol=0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mnk", [(1, 129, "mid"), (129, 7, "small"), (300, 1000, 4096), (1000, 257, "mid")],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", OPS)
def test_mx_scale_layouts(op, mnk, layout):
    m, n, k = mnk
    k = {"mid": K_MID[op], "small": K_SMALL[op]}.get(k, k)
    args = mx_operands(op, m, n, k, seed=m * 3 + n)
    run(op, args, FP32, layout)


@pytest.mark.parametrize("op", OPS)
def test_mx_blocked_padding_is_not_data(op):
    # Blocked padding multiplies zero-filled data (or is not read): the same call with the
    # padding filled with code 0 (2^-127, torchao's to_blocked) instead of our 2^0 gives the
    # same bits. M, N and ceil(K/32) are all off the 128 x 4 tile.
    args = mx_operands(op, 33, 100, K_MID[op], seed=8)
    a, sa, b, sb = args
    kw = dict(out_dtype=FP32, scale_layout="blocked")
    base = mx_call(op, (a, pg.to_blocked(sa), b, pg.to_blocked(sb)), **kw)

    def zero_padded(s):
        codes = pg.to_blocked(s).view(torch.uint8)
        # to_blocked of an all-code-1 scale marks the data positions (1) apart from padding (127)
        data = pg.to_blocked(torch.ones_like(s.view(torch.uint8)).view(torch.float8_e8m0fnu)).view(torch.uint8) == 1
        return torch.where(data, codes, torch.zeros_like(codes)).view(torch.float8_e8m0fnu)

    out = mx_call(op, (a, zero_padded(sa), b, zero_padded(sb)), **kw)
    check_mx(op, out, args, FP32)
    torch.testing.assert_close(out, base, rtol=0, atol=0)


# -- scale ranges and e8m0 edge codes --------------------------------------------------------------
WIDE = {
    "both_wide": ((127, 50), None),  # 2^-50..2^50
    "a_low_b_high": ((77, 50), (177, 50)),  # a 2^-100..2^0, b 2^0..2^100
    "a_high_b_low": ((177, 50), (77, 50)),
    "both_low": ((87, 20), None),  # all scales 2^-60..2^-20: nothing near 2^0
}


@pytest.mark.parametrize("out_dtype", [BF16, FP32], ids=dtype_id)
@pytest.mark.parametrize("case", list(WIDE))
@pytest.mark.parametrize("mnk", [(129, 1000, "mid"), (1, 257, 4096)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", OPS)
def test_mx_wide_exponent_ranges(op, mnk, case, out_dtype):
    m, n, k = mnk
    k = K_MID[op] if k == "mid" else k
    a_scales, b_scales = WIDE[case]
    run(op, mx_operands(op, m, n, k, seed=m + k, scales=a_scales, b_scales=b_scales), out_dtype)


@pytest.mark.parametrize("op", OPS)
def test_mx_quantized_rows_of_different_magnitude(op):
    # Realistic operands: the quantizers on randn rows spanning 8 decades.
    m, n, k = 257, 300, 4096
    a, sa, b, sb = quantized_operands(op, m, n, k, seed=11)
    rows = torch.logspace(-4, 4, m, device=CUDA).unsqueeze(1)
    x = pg.dequantize_mxfp8(a, sa) * rows
    a, sa = pg.quantize_mxfp8(x)
    for out_dtype in (BF16, FP32):
        run(op, (a, sa, b, sb), out_dtype)


@pytest.mark.parametrize("op", OPS)
def test_e8m0_code_0_is_2_pow_minus_127(op):
    # Code 0 is 2^-127, an fp32 subnormal (a `code << 23` decoder or a flush-to-zero multiply
    # makes it 0). Every a scale is code 0 and b's are 2^90..2^110, so every product is
    # 2^-37..2^-17 and an all-zero or wrongly scaled output is a large error.
    m, n, k = 65, 129, K_MID[op]
    a, _, b, _ = mx_operands(op, m, n, k, seed=5)
    sa = torch.zeros(m, mx_blocks(k), dtype=torch.uint8, device=CUDA).view(torch.float8_e8m0fnu)
    sb = e8m0_scales(n, mx_blocks(k), seed=6, device=CUDA, center=227, spread=10)
    args = (a, sa, b, sb)
    for layout in ("plain", "blocked"):
        out = run(op, args, FP32, layout, check=False)
        assert not out.isnan().any()
        ref = reference(op, args)
        # The peer is the correctly rounded result (cuBLAS may flush the subnormal fp32 operands
        # of the emulation).
        err, bound = rel_err(out, ref), error_bound(rounding_err(ref, FP32), MX_FLOOR)
        assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g}"


@pytest.mark.parametrize("op", OPS)
def test_e8m0_code_255_is_nan(op):
    # Code 255 is NaN (OCP MX v1.0): its block, hence its output row (a) or column (b), is NaN
    # as in the CPU reference; everything else is finite and correct.
    m, n, k = 129, 100, K_MID[op]
    a, sa, b, sb = mx_operands(op, m, n, k, seed=7)
    sa.view(torch.uint8)[3, 1] = 255
    sb.view(torch.uint8)[5, 0] = 255
    args = (a, sa, b, sb)
    for layout in ("plain", "blocked", "mixed"):
        out = run(op, args, FP32, layout, check=False)
        nan = torch.zeros(m, n, dtype=torch.bool, device=CUDA)
        nan[3, :] = True
        nan[:, 5] = True
        assert out[nan].isnan().all(), "a NaN scale (code 255) did not make its block NaN"
        assert not out[~nan].isnan().any(), "NaN outside the NaN-scaled row and column"
        ref, peer = reference(op, args), emulation(op, args, FP32)
        keep = ~nan
        err, bound = rel_err(out[keep], ref[keep]), error_bound(rel_err(peer[keep], ref[keep]), MX_FLOOR)
        assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g} off the NaN row and column"


# -- every built config, forced ---------------------------------------------------------------------
CONFIGS = [n for op in MX_OPS for n in mx_configs(op)]
OP_OF = {fam: op for op, fam in MX_FAMILY.items()}


def _config_shapes(name, op):
    """Tail shapes of a config: M and N one tile and a bit past whole clusters, both ways round
    (a ``_swapab`` config runs the weight as the MMA's A operand, so its N is the tile's M side),
    plus M = 1. A decode GEMV config: M up to its tokens, whole 1x32 blocks, N past two strips."""
    if gemv_tokens(name):
        t = gemv_tokens(name)
        return [(1, 2 * 128 + 33, 992), (t, 129, 96), (max(1, t - 1), 1000, 4096)]
    try:
        cfg = catalogue_config(name)
        (tm, tn), (cm, cn) = cfg.cta_tile[:2], cfg.schedule.cluster
    except (StopIteration, AttributeError):
        (tm, tn), (cm, cn) = (128, 128), (1, 1)
    t0, t1 = cm * tm * 2 + 33, cn * tn * 2 + 7
    return [(1, t0 + t1, K_MID[op]), (t0, t1, K_SMALL[op]), (t1, t0, K_MID[op])]


@pytest.mark.parametrize("name", CONFIGS)
def test_mx_every_config(name):
    op = OP_OF[family_of(name)]
    dtypes = config_out_dtypes(name)
    assert dtypes, f"{name} is built but writes no out dtype"
    for i, (m, n, k) in enumerate(_config_shapes(name, op)):
        for out_dtype in dtypes:
            scales = FP16_SAFE_SCALES if out_dtype == FP16 else (127, 20)
            args = mx_operands(op, m, n, k, seed=i * 7 + m, scales=scales)
            plain = run(op, args, out_dtype, "plain", config=name)
            # The layout is only how the scales are stored: same kernel, same bits.
            for layout in ("blocked", "mixed", "mixed_rev"):
                out = run(op, args, out_dtype, layout, config=name, check=False)
                assert not out.isnan().any()
                torch.testing.assert_close(out, plain, rtol=0, atol=0, msg=f"{layout} differs from plain")
    if FP32 not in dtypes:  # shape-tuned configs: a clear refusal, as for mm
        args = mx_operands(op, 64, 64, K_MID[op])
        with pytest.raises(ValueError, match="has no variant writing"):
            mx_call(op, args, out_dtype=FP32, config=name)


@pytest.mark.parametrize("k_tiles", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("name", CONFIGS)
def test_mx_every_config_k_tile_counts(name, k_tiles):
    """Odd and even K-tile counts (128 K each): the decode kernels promote two K-tiles per step
    and the prefill ones block by block, so the loop's tails differ by parity."""
    op = OP_OF[family_of(name)]
    k = 128 * k_tiles - (32 if k_tiles > 1 else 0)  # a partial last K-tile where there are several
    for m, n in ((1, 300), (min(37, gemv_tokens(name) or 37), 130)):
        args = mx_operands(op, m, n, k, seed=k_tiles * 11 + m)
        out = run(op, args, BF16, "plain", config=name)
        assert out.shape == (m, n)


# -- prepared weights ---------------------------------------------------------------------------------
def _prepare(op, b, sb):
    return pg.prepare_weight(b.t(), sb, fmt="mxfp8" if op == "mxfp8_mm" else "fp4")


@pytest.mark.parametrize("a_layout", ["plain", "blocked"])
@pytest.mark.parametrize("mnk", [(1, 1000, "mid"), (129, 257, 4096), (1000, 33, "small")],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", OPS)
def test_mx_prepared_weight(op, mnk, a_layout):
    m, n, k = mnk
    k = {"mid": K_MID[op], "small": K_SMALL[op]}.get(k, k)
    args = mx_operands(op, m, n, k, seed=m + n + 1)
    a, sa, b, sb = args
    pw = _prepare(op, b, sb)
    assert isinstance(pw, pg.PreparedWeight)
    a_s = pg.to_blocked(sa) if a_layout == "blocked" else sa
    out = poisoned(lambda: mx_call(op, (a, a_s, pw), out_dtype=FP32, scale_layout=a_layout), m, n, FP32)
    check_mx(op, out, args, FP32)
    # Preparing changes where the weight scales come from, not the math: with the same config,
    # bitwise the unprepared call (b's scales plain, and blocked).
    for name in mx_configs(op):
        if FP32 not in config_out_dtypes(name) or not forced_fits(name, m, k):
            continue
        got = mx_call(op, (a, a_s, pw), out_dtype=FP32, scale_layout=a_layout, config=name)
        for b_layout, b_s in (("plain", sb), ("blocked", pg.to_blocked(sb))):
            want = mx_call(op, (a, a_s, b, b_s), out_dtype=FP32, scale_layout=a_layout, scale_b_layout=b_layout,
                           config=name)
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"{name}, scale_b {b_layout}")


@pytest.mark.parametrize("op", OPS)
def test_mx_prepared_weight_reused_across_calls(op):
    n, k = 300, K_MID[op]
    _, _, b, sb = mx_operands(op, 1, n, k, seed=2)
    pw = _prepare(op, b, sb)
    for m in (1, 7, 129):
        a, sa, _, _ = mx_operands(op, m, n, k, seed=20 + m)
        out = poisoned(lambda: mx_call(op, (a, sa, pw)), m, n, BF16)
        check_mx(op, out, (a, sa, b, sb), BF16)


# -- CUDA graphs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["plain", "blocked", "mixed", "prepared"])
@pytest.mark.parametrize("mnk", [(300, 264, 512), (1, 4096, 1024)], ids=ids)
@pytest.mark.parametrize("op", OPS)
def test_mx_graph_capture(op, mnk, layout):
    m, n, k = mnk
    args = mx_operands(op, m, n, k, seed=9)
    if layout == "prepared":
        a, sa, b, sb = args
        call_args, kw = (a, sa, _prepare(op, b, sb)), {}
    else:
        call_args, kw = with_layout(args, layout)

    def f():
        return mx_call(op, call_args, out_dtype=FP32, **kw)

    eager = f()  # also the warm-up outside capture (smem attributes, lazy module loading)
    check_mx(op, eager, args, FP32)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = f()
    captured.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)
    # The graph reads the scales at replay time: doubling every a scale (code + 1) doubles the
    # output exactly.
    call_args[1].view(torch.uint8).add_(1)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager * 2, rtol=0, atol=0)


# -- opcheck and torch.compile with the scale layouts ----------------------------------------------
# (the plain-layout samples of conftest.sample_inputs run in test_gpu_ops.py)
_OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("layout", ["blocked", "mixed"])
@pytest.mark.parametrize("op", OPS)
def test_mx_opcheck_layouts(op, layout):
    args = mx_operands(op, 33, 100, K_SMALL[op], seed=12)
    (a, sa, b, sb), kw = with_layout(args, layout)
    # Schema order: a, b, scale_a, scale_b, out_dtype, scale_layout, config, scale_b_layout.
    full = (a, b, sa, sb, FP32, kw["scale_layout"], None, kw.get("scale_b_layout"))
    torch.library.opcheck(op_fn(op), full, {}, test_utils=_OPCHECK_UTILS)


@pytest.mark.parametrize("layout", ["blocked", "mixed"])
@pytest.mark.parametrize("op", OPS)
def test_mx_compile_fullgraph_layouts(op, layout):
    args = mx_operands(op, 129, 96, K_MID[op], seed=13)
    call_args_, kw = with_layout(args, layout)
    torch._dynamo.reset()
    wrapper = getattr(pg, op)
    f = torch.compile(lambda *xs: wrapper(*xs, out_dtype=FP32, **kw) * 2, fullgraph=True)  # * 2: exact
    out = f(*call_args(op, call_args_)) / 2
    check_mx(op, out, args, FP32)
    torch.testing.assert_close(out, mx_call(op, call_args_, out_dtype=FP32, **kw), rtol=0, atol=0)


# -- determinism and long K -----------------------------------------------------------------------
@pytest.mark.parametrize("mnk", [(1, 8191, 4096), (16, 4096, 8192), (1000, 1000, 4096), (4096, 4096, 4096)], ids=ids)
@pytest.mark.parametrize("op", OPS)
def test_mx_deterministic(op, mnk):
    args = mx_operands(op, *mnk, seed=14)
    first = mx_call(op, args, out_dtype=FP32)
    for _ in range(2):
        torch.testing.assert_close(mx_call(op, args, out_dtype=FP32), first, rtol=0, atol=0)


@pytest.mark.parametrize("data", ["wide_scales", "quantized"])
@pytest.mark.parametrize("mnk", [(1024, 1024, 28672), (1, 4096, 28672)], ids=ids)
@pytest.mark.parametrize("op", OPS)
def test_mx_long_k_accuracy(op, mnk, data):
    # Deep K is where accumulation precision shows; fp32 out, so no output rounding hides it.
    # Per-block promotion keeps the error flat in K: the same bound as at K = 1000.
    args = mx_operands(op, *mnk, seed=15) if data == "wide_scales" else quantized_operands(op, *mnk, seed=15)
    run(op, args, FP32)


# -- empty extents --------------------------------------------------------------------------------
@pytest.mark.parametrize("mnk", [(0, 64, 128), (64, 0, 128), (64, 48, 0), (0, 0, 0)], ids=ids)
@pytest.mark.parametrize("op", OPS)
def test_mx_zero_extents(op, mnk):
    # K = 0 is an empty sum: zeros, as the CPU reference and mm give.
    m, n, k = mnk
    a, sa, b, sb = mx_operands(op, m, n, k)
    out = poisoned(lambda: mx_call(op, (a, sa, b, sb), out_dtype=FP32), m, n, FP32)
    assert out.device == a.device and bool((out == 0).all())


# -- argument errors on CUDA ------------------------------------------------------------------------
def raises(exc, names, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` whose message matches every regex in ``names``."""
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    for name in [names] if isinstance(names, str) else names:
        assert re.search(name, str(info.value)), (name, str(info.value))
    return info.value


def correct_or_value_error(op, arg, args, call_args):
    """A layout the kernels do not read as it is: either copied (a correct result) or refused
    with a ValueError naming ``arg``."""
    m, n = args[0].shape[0], args[2].shape[1]
    try:
        out = poisoned(lambda: mx_call(op, call_args, out_dtype=FP32), m, n, FP32)
    except ValueError as e:
        assert re.search(rf"\b{arg}\b", str(e)), str(e)
        return
    check_mx(op, out, args, FP32)


@pytest.mark.parametrize("op", OPS)
def test_mx_operand_strides_cuda(op):
    args = mx_operands(op, 40, 24, 128, seed=16)
    a, sa, b, sb = args
    correct_or_value_error(op, "b", args, (a, sa, b.contiguous(), sb))  # b row-major (K, N)
    correct_or_value_error(op, "a", args, (a.t().contiguous().t(), sa, b, sb))  # a column-major


@pytest.mark.parametrize("op", OPS)
def test_mx_errors_cuda(op):
    m, n, k = 8, 6, 64
    a, sa, b, sb = mx_operands(op, m, n, k, seed=17)
    f = lambda a, sa, b, sb, **kw: getattr(pg, op)(a, b, sa, sb, **kw)  # noqa: E731 (the tests' operand order)
    raises(ValueError, ["scale_a", r"\(8, 2\)"], f, a, sa[:, :1], b, sb)
    raises(ValueError, ["scale_b", r"\(6, 2\)"], f, a, sa, b, sb[:5])
    raises(ValueError, ["scale_b", "blocked"], f, a, sa, b, sb, scale_b_layout="blocked")  # plain scale, said blocked
    raises(ValueError, ["scale_a", "blocked"], f, a, sa, b, pg.to_blocked(sb), scale_layout="blocked")
    raises(ValueError, "scale_a", f, a, pg.to_blocked(sa), b, sb)  # blocked scale, said plain
    raises(ValueError, ["scale_b", "blocked"], f, a, pg.to_blocked(sa), b, pg.to_blocked(sb)[:-4],
           scale_layout="blocked")
    raises(ValueError, ["scale_layout", "rowwise"], f, a, sa, b, sb, scale_layout="rowwise")
    raises(ValueError, ["scale_b_layout", "tiled"], f, a, sa, b, sb, scale_b_layout="tiled")
    raises(TypeError, ["scale_b", "e8m0"], f, a, sa, b, sb.view(torch.uint8))
    raises(TypeError, ["scale_a", "e8m0"], f, a, sa.view(torch.uint8).float(), b, sb)
    raises(ValueError, ["scale_a", "cpu"], f, a, sa.cpu(), b, sb)
    raises(ValueError, ["scale_b", "cpu"], f, a, sa, b, sb.cpu())
    raises(TypeError, "out_dtype", f, a, sa, b, sb, out_dtype=torch.float64)
    raises(ValueError, "K", f, a[:, :32], sa[:, :1], b, sb[:, :1])  # K extents differ


def test_mx_operand_dtype_errors_cuda():
    if not (mx_built("mxfp8_mm") or mx_built("fp8_fp4_mm")):
        pytest.skip("no MX kernel built")
    a, sa, b8, sb = mx_operands("mxfp8_mm", 8, 6, 64, seed=18)
    _, _, b4, _ = mx_operands("fp8_fp4_mm", 8, 6, 64, seed=18)
    raises(TypeError, r"\bb\b", pg.mxfp8_mm, a, b4, sa, sb)
    raises(TypeError, r"\bb\b", pg.fp8_fp4_mm, a, b8, sa, sb)
    raises(TypeError, r"\ba\b", pg.mxfp8_mm, a.to(BF16), b8, sa, sb)


def test_fp8_fp4_k_not_multiple_of_32_cuda():
    if not mx_built("fp8_fp4_mm"):
        pytest.skip("no e4m3xe2m1 kernel built")
    m, n, k = 8, 6, 48
    a = fp8_operand(m, k, device=CUDA)
    sa = e8m0_scales(m, mx_blocks(k), device=CUDA)
    b = e2m1_operand(n, k, device=CUDA).t()
    assert b.dtype == FP4X2 and b.shape == (k // 2, n)
    sb = e8m0_scales(n, mx_blocks(k), device=CUDA)
    raises(ValueError, [r"\bK = 48\b", "multiple of 32"], pg.fp8_fp4_mm, a, b, sa, sb)


def _catalogue_names(family):
    return [c.name for c in CATALOGUE if family_of(c.name) == family and c.name.startswith(f"{ARCH}_")]


@pytest.mark.parametrize("op", OPS)
def test_mx_forced_config_of_another_family(op):
    args = mx_operands(op, 64, 64, 128, seed=19)
    others = [f for f in ("bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1") if f != MX_FAMILY[op]]
    tried = 0
    for fam in others:
        names = _catalogue_names(fam)
        if not names:
            continue
        tried += 1
        raises(ValueError, ["config", re.escape(names[0]), fam], mx_call, op, args, config=names[0])
    assert tried, "the catalogue has no config of another family"
    raises(ValueError, ["unknown config", "the catalogue has"], mx_call, op, args,
           config=f"{ARCH}_{MX_FAMILY[op]}_1x1x1")


def test_prepare_weight_errors_cuda():
    if not mx_built("mxfp8_mm"):
        pytest.skip("no mxfp8 kernel built")
    _, _, b, sb = mx_operands("mxfp8_mm", 1, 6, 64, seed=20)
    raises(ValueError, ["fmt", "int8"], pg.prepare_weight, b.t(), sb, fmt="int8")
    raises(ValueError, r"\bws\b|scale", pg.prepare_weight, b.t(), sb[:5], fmt="mxfp8")
