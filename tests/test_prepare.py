"""prepare_weight and the per-operand scale layouts of the MX ops, on the CPU reference (the
CUDA kernels are held to the same results bitwise in test_gpu_mx.py)."""

import pytest
import torch
from conftest import e2m1_operand, e8m0_scales, fp8_operand, mx_blocks, rel_err, reference

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")


def _weights(fmt, n, k, seed=0):
    if fmt == "mxfp8":
        return fp8_operand(n, k, True, seed), e8m0_scales(n, mx_blocks(k), seed + 1)
    return e2m1_operand(n, k, seed), e8m0_scales(n, mx_blocks(k), seed + 1)


@pytest.mark.parametrize("fmt, op", [("mxfp8", "mxfp8_mm"), ("fp4", "fp8_fp4_mm")])
@pytest.mark.parametrize("n, k", [(7, 64), (129, 160), (300, 96)])
def test_prepared_weight_gives_the_unprepared_result(fmt, op, n, k):
    wq, ws = _weights(fmt, n, k)
    a, sa = fp8_operand(5, k, True, 9), e8m0_scales(5, mx_blocks(k), 10)
    pw = pg.prepare_weight(wq, ws, fmt=fmt)
    assert isinstance(pw, pg.PreparedWeight) and (pw.n, pw.k) == (n, k) and pw.scale_b_layout == "blocked"
    # The data stays MX bytes (a view of the weight when it is already aligned), scales blocked.
    assert pw.b.dtype == wq.dtype and pw.b.data_ptr() == wq.data_ptr()
    assert torch.equal(pg.from_blocked(pw.scale_b, n, mx_blocks(k)).view(torch.uint8), ws.view(torch.uint8))
    fn = getattr(pg, op)
    want = fn(a, wq.t(), sa, ws, out_dtype=torch.float32)
    assert torch.equal(fn(a, pw, sa, out_dtype=torch.float32), want)
    # Mixed layouts: blocked scale_b beside plain scale_a, and the reverse.
    assert torch.equal(fn(a, wq.t(), sa, pg.to_blocked(ws), scale_b_layout="blocked", out_dtype=torch.float32), want)
    assert torch.equal(fn(a, wq.t(), pg.to_blocked(sa), ws, scale_layout="blocked", scale_b_layout="plain",
                          out_dtype=torch.float32), want)
    ref = reference(op, (a, sa, wq.t(), ws))
    assert rel_err(want, ref) < 1e-5


def test_prepare_weight_copies_unaligned_rows_once():
    wq, ws = _weights("mxfp8", 33, 40)  # 40-byte rows: not 16-byte multiples
    pw = pg.prepare_weight(wq, ws, fmt="mxfp8")
    assert pw.b.t().stride(0) % 16 == 0 and torch.equal(pw.b.t().view(torch.uint8), wq.view(torch.uint8))


def test_prepare_weight_accepts_blocked_scales():
    wq, ws = _weights("fp4", 65, 128)
    pw = pg.prepare_weight(wq, pg.to_blocked(ws), fmt="fp4", scale_layout="blocked")
    assert torch.equal(pw.scale_b.view(torch.uint8), pg.to_blocked(ws).reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(fmt="int8"), ValueError, r"fmt must be one of \('mxfp8', 'fp4'\) \(or .*\), got 'int8'"),
    (dict(fmt="fp4"), TypeError, r"wq must be torch.float4_e2m1fn_x2 for fmt='fp4'"),
    (dict(fmt="mxfp8", scale_layout="tiled"), ValueError, r"scale_layout must be one of"),
])
def test_prepare_weight_errors_name_the_argument(kwargs, exc, match):
    wq, ws = _weights("mxfp8", 8, 64)
    with pytest.raises(exc, match=match):
        pg.prepare_weight(wq, ws, **kwargs)


def test_prepare_weight_checks_the_scale_shape():
    wq, ws = _weights("mxfp8", 8, 64)
    with pytest.raises(ValueError, match=r"ws must be \(N, ceil\(K/32\)\) = \(8, 2\)"):
        pg.prepare_weight(wq, ws[:4], fmt="mxfp8")
    with pytest.raises(ValueError, match=r"ws in the blocked layout must hold 512"):
        pg.prepare_weight(wq, ws, fmt="mxfp8", scale_layout="blocked")


def test_prepared_weight_misuse_is_a_clear_error():
    wq, ws = _weights("mxfp8", 8, 64)
    a, sa = fp8_operand(2, 64, True, 1), e8m0_scales(2, 2, 2)
    pw = pg.prepare_weight(wq, ws, fmt="mxfp8")
    with pytest.raises(ValueError, match="carries its own scales"):
        pg.mxfp8_mm(a, pw, sa, ws)
    with pytest.raises(ValueError, match=r"PreparedWeight for fmt='mxfp8'; this op needs fmt='fp4'"):
        pg.fp8_fp4_mm(a, pw, sa)
    with pytest.raises(ValueError, match="scale_b is required"):
        pg.mxfp8_mm(a, wq.t(), sa)


def test_b_scale_layout_is_validated_by_name():
    wq, ws = _weights("mxfp8", 8, 64)
    a, sa = fp8_operand(2, 64, True, 1), e8m0_scales(2, 2, 2)
    with pytest.raises(ValueError, match="scale_b_layout must be 'plain' or 'blocked', got 'tiled'"):
        pg.mxfp8_mm(a, wq.t(), sa, ws, scale_b_layout="tiled")
    with pytest.raises(ValueError, match=r"scale_b in the blocked layout must hold .*scale_b_layout='plain'"):
        pg.mxfp8_mm(a, wq.t(), sa, ws, scale_b_layout="blocked")


def test_mx_ops_trace_with_a_prepared_weight():
    wq, ws = _weights("fp4", 40, 64)
    a, sa = fp8_operand(3, 64, True, 1), e8m0_scales(3, 2, 2)
    pw = pg.prepare_weight(wq, ws, fmt="fp4")
    compiled = torch.compile(lambda x, s: pg.fp8_fp4_mm(x, pw, s), fullgraph=True, backend="eager")
    assert torch.equal(compiled(a, sa), pg.fp8_fp4_mm(a, pw, sa))


def test_prepare_weight_refuses_fp4_k_no_op_takes():
    """quantize_mxfp4 keeps the format's partial last block (OCP MX allows one); fp8_fp4_mm takes
    K % 32 == 0 only, so preparing such a weight for it is refused there, naming the fix."""
    wq, ws = pg.quantize_mxfp4(torch.randn(6, 48))
    with pytest.raises(ValueError, match=r"fmt='fp4' needs K % 32 == 0 \(fp8_fp4_mm's rule\), got K = 48"):
        pg.prepare_weight(wq, ws, fmt="fp4")
    wq8, ws8 = pg.quantize_mxfp8(torch.randn(6, 48))
    assert pg.prepare_weight(wq8, ws8, fmt="mxfp8").k == 48  # mxfp8_mm takes partial blocks


@pytest.mark.parametrize("fmt", ["mxfp8", "fp4"])
@pytest.mark.parametrize("n, k", [(1, 32), (257, 32), (129, 28672), (3, 4096 + 32)])
def test_prepared_layout_is_a_pure_permutation(fmt, n, k):
    # The bytes every MX kernel (prefill and the decode GEMV) streams hold exactly the weight.
    w = torch.randn(n, k) * torch.logspace(-3, 3, k)
    wq, ws = (pg.quantize_mxfp8 if fmt == "mxfp8" else pg.quantize_mxfp4)(w)
    want = (pg.dequantize_mxfp8 if fmt == "mxfp8" else pg.dequantize_mxfp4)(wq, ws)
    got = pg.prepare_weight(wq, ws, fmt=fmt).dequantize()
    assert got.shape == (n, k)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
