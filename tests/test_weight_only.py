"""Weight-only MX (issue 24): bf16/fp16 activations times an MXFP8 or MXFP4 weight, through
``pg.mm(x, prepared_weight)`` (``torch.ops.persistent_gemm.weight_only_mm``), the pg.nn
weight-only formats and the gpt-oss checkpoint helper. On the CPU: the op's definition against
float64 (within twice the error of rounding the float64 result once, plus a floor), its schema,
fake and compile, its refusals, and a hand-built checkpoint in the (blocks, scales) layout."""

import pytest
import torch
from conftest import e8m0_scales, error_bound, mx_blocks, randn, rel_err, rounding_err

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the built extension (the op's schema)")

FMTS = {"mxfp8": pg.quantize_mxfp8, "fp4": pg.quantize_mxfp4}


def _weight(fmt, n, k, seed, center=127, spread=20):
    """(prepared weight, its float64 values (N, K)): quantized randn rows, then wide-range codes."""
    wq, ws = FMTS[fmt](randn(n, k, torch.float32, seed))
    ws = e8m0_scales(n, mx_blocks(k), seed + 1, center=center, spread=spread)
    deq = pg.dequantize_mxfp8 if fmt == "mxfp8" else pg.dequantize_mxfp4
    return pg.prepare_weight(wq, ws, fmt=fmt), deq(wq, ws).double()


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 17, 64), (7, 129, 96), (33, 40, 1024)])
def test_matches_float64(fmt, dtype, m, n, k):
    center, spread = (119, 4) if dtype == torch.float16 else (127, 20)  # fp16's range
    pw, w = _weight(fmt, n, k, seed=m + n, center=center, spread=spread)
    x = randn(m, k, dtype, seed=k)
    ref = x.double() @ w.t()
    for out_dtype in (None, torch.float32):
        out = pg.mm(x, pw, out_dtype=out_dtype)
        assert out.dtype == (out_dtype or dtype) and out.shape == (m, n)
        err, bound = rel_err(out, ref), error_bound(rounding_err(ref, out.dtype), 1e-6)
        assert err <= bound, f"rel err {err:.3g} > {bound:.3g}"
    bias = randn(1, n, torch.float32, seed=3).reshape(n) * ref.abs().mean().item()
    out = pg.mm(x, pw, out_dtype=torch.float32, bias=bias.float())
    assert rel_err(out, ref + bias.double()) <= error_bound(rounding_err(ref + bias.double(), torch.float32), 1e-6)


def test_mxfp8_weight_with_a_partial_last_block():
    # K % 32 != 0 is an MXFP8 weight's right, as mxfp8_mm's.
    pw, w = _weight("mxfp8", 24, 100, seed=5)
    x = randn(9, 100, torch.bfloat16, seed=6)
    ref = x.double() @ w.t()
    assert rel_err(pg.mm(x, pw), ref) <= error_bound(rounding_err(ref, torch.bfloat16), 1e-6)


def test_schema_fake_and_compile():
    pw, _ = _weight("fp4", 48, 64, seed=7)
    x = randn(5, 64, torch.bfloat16, seed=8)
    op = torch.ops.persistent_gemm.weight_only_mm.default
    # test_schema compares the float8/float4 inputs with allclose, which torch cannot do for them.
    torch.library.opcheck(op, (x, pw.b, pw.scale_b), {},
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    f = torch.compile(lambda t: pg.mm(t, pw) * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x), pg.mm(x, pw) * 2)


def test_refusals_name_the_argument():
    pw, _ = _weight("mxfp8", 16, 64, seed=9)
    x = randn(4, 64, torch.bfloat16, seed=10)
    xq, _ = pg.quantize_mxfp8(x.float())
    with pytest.raises(TypeError, match=r"a must be torch.bfloat16 or torch.float16 .* e4m3 activations are mxfp8_mm"):
        pg.mm(xq, pw)
    with pytest.raises(TypeError, match=r"out_dtype must be a's dtype torch.bfloat16 or torch.float32"):
        pg.mm(x, pw, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="is a mxfp8 kernel; (this op takes|these operands need a) bf16xe4m3 kernel"):
        pg.mm(x, pw, config="sm90a_mxfp8_128x128x128_c2x1_sw8_row_coop")
    with pytest.raises(ValueError, match="takes no alpha / beta"):
        pg.mm(x, pw, alpha=2.0)
    with pytest.raises(ValueError, match=r"a is \(M, K\) = \[4, 32\]"):
        pg.mm(x[:, :32], pw)
    with pytest.raises(RuntimeError, match="weight_only_mm is not differentiable"):
        pg.mm(x.float().requires_grad_().bfloat16(), pw)


def test_a_gpt_oss_checkpoint_loads_as_the_quantizer_lays_it_out():
    # gpt-oss / OCP MX storage: blocks (N, K/32, 16) bytes, 32 e2m1 codes per scale block, the
    # low nibble first; scales (N, K/32) uint8 e8m0. Built by hand, code by code.
    g = torch.Generator().manual_seed(11)
    n, k = 8, 96
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, (n, k // 32), generator=g, dtype=torch.uint8)
    blocks = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(n, k // 32, 16)
    pw = pg.from_mxfp4_blocks(blocks, scales)
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
    want = lut[codes.long()] * torch.exp2(scales.double() - 127).repeat_interleave(32, dim=1)
    assert torch.equal(pw.dequantize().double(), want)
    x = randn(3, k, torch.bfloat16, seed=12)
    ref = x.double() @ want.t()
    assert rel_err(pg.mm(x, pw), ref) <= error_bound(rounding_err(ref, torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match=r"blocks \(E, N, K/32, 16\) take scales \(E, N, K/32\) with the same E = 1"):
        pg.from_mxfp4_blocks(blocks[None], scales)
    with pytest.raises(ValueError, match=r"scales must be \(N, K/32\) = \(8, 3\)"):
        pg.from_mxfp4_blocks(blocks, scales[:, :2])


@pytest.mark.parametrize("fmt", ["mxfp8_weight_only", "mxfp4_weight_only"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_nn_weight_only_formats_keep_the_models_dtype(fmt, dtype):
    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).to(dtype)
    x = torch.randn(2, 5, 64).to(dtype)
    with torch.no_grad():
        want = model(x)
        swapped = pg.nn.quantize_(model, fmt)
        out = swapped(x)
    assert isinstance(swapped[0], pg.nn.Linear) and swapped[0].qconfig.format == fmt
    assert out.dtype == dtype and out.shape == want.shape
    # The format's own error (4-bit / 8-bit weights), far above the kernel's; not a garbage answer.
    assert rel_err(out, want.double()) < (0.3 if fmt == "mxfp4_weight_only" else 0.1)  # measured 0.056 for mxfp8
