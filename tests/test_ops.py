"""CPU tests of the ops: reference numerics, schemas (opcheck), torch.compile, autograd, errors.

The CPU implementations are the references that define each op; here they are checked
against float64 products of the (independently) dequantized inputs, within error_bound of
the float64 result correctly rounded to the output dtype (conftest.py).
"""

import inspect

import pytest
import torch
from conftest import (
    call_args,
    FP16_SAFE_SCALES,
    OUT_DTYPES,
    STRIDED_MM_CASES,
    STRIDED_SCALED_MM_CASES,
    default_out_dtype,
    error_bound,
    fp8_fp4_operands,
    fp8_pair,
    fp32_scales,
    mxfp8_operands,
    nth_sample,
    op_fn,
    operand,
    randn,
    reference,
    rel_err,
    rounding_err,
    sample_cases,
    strided_mm_cases,
    strided_scaled_mm_cases,
)

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="extension not built")

BF = torch.bfloat16
SHAPES = [(1, 1, 1), (7, 129, 33), (129, 7, 257), (33, 100, 64), (64, 48, 1000), (257, 31, 95)]
ids = lambda s: "x".join(map(str, s))  # noqa: E731


def check(out, ref, out_dtype):
    """out has out_dtype and is within error_bound of ref rounded to out_dtype."""
    assert out.dtype == out_dtype and out.shape == ref.shape and torch.isfinite(out).all()
    err, bound = rel_err(out, ref), error_bound(rounding_err(ref, out_dtype))
    assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g}"


# -- numerics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("layout", ["rr", "rc", "cr", "cc"])
def test_mm_reference(dtype, shape, layout):
    m, n, k = shape
    a = operand(m, k, dtype, layout[0] == "r", seed=m * 7 + k)
    b = operand(k, n, dtype, layout[1] == "r", seed=n * 3 + k)
    ref = a.double() @ b.double()
    check(pg.mm(a, b), ref, dtype)
    for out_dtype in OUT_DTYPES:
        check(pg.mm(a, b, out_dtype=out_dtype), ref, out_dtype)


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=ids)
def test_scaled_mm_reference(rowwise, shape):
    m, n, k = shape
    a, b = fp8_pair(m, n, k, seed=k)
    sa, sb = fp32_scales(m, n, rowwise, seed=1)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    check(pg.scaled_mm(a, b, sa, sb), ref, torch.bfloat16)
    for out_dtype in OUT_DTYPES:
        check(pg.scaled_mm(a, b, sa, sb, out_dtype=out_dtype), ref, out_dtype)


@pytest.mark.parametrize("shape", [(7, 129, 33), (33, 100, 64), (64, 48, 1000), (1, 5, 31)], ids=ids)
def test_mxfp8_mm_reference(shape):
    m, n, k = shape
    x = randn(m, k, torch.float32, seed=k) * torch.logspace(-4, 2, m).unsqueeze(1)  # 6 decades; fp16 out fits
    a, sa = pg.quantize_mxfp8(x)
    wq, sw = pg.quantize_mxfp8(randn(n, k, torch.float32, seed=k + 1))
    ref = reference("mxfp8_mm", (a, sa, wq.t(), sw))
    check(pg.mxfp8_mm(a, wq.t(), sa, sw), ref, torch.bfloat16)
    for out_dtype in OUT_DTYPES:
        check(pg.mxfp8_mm(a, wq.t(), sa, sw, out_dtype=out_dtype), ref, out_dtype)


@pytest.mark.parametrize("shape", [(7, 129, 33), (33, 100, 64), (64, 48, 1000), (1, 5, 31)], ids=ids)
def test_mxfp8_mm_reference_wide_random_scales(shape):
    # Blocks of one row 2^40 apart: a reference that mixed up blocks or rows would be far off.
    for out_dtype in OUT_DTYPES:
        scales = FP16_SAFE_SCALES if out_dtype == torch.float16 else (127, 20)
        args = mxfp8_operands(*shape, seed=sum(shape), center=scales[0], spread=scales[1])
        check(pg.mxfp8_mm(*call_args("mxfp8_mm", args), out_dtype=out_dtype), reference("mxfp8_mm", args), out_dtype)


@pytest.mark.parametrize("shape", [(7, 129, 32), (33, 100, 64), (64, 48, 1024)], ids=ids)
def test_fp8_fp4_mm_reference(shape):
    m, n, k = shape
    a, sa = pg.quantize_mxfp8(randn(m, k, torch.float32, seed=k + 1))
    wq, sw = pg.quantize_mxfp4(randn(n, k, torch.float32, seed=k + 2))
    ref = reference("fp8_fp4_mm", (a, sa, wq.t(), sw))
    check(pg.fp8_fp4_mm(a, wq.t(), sa, sw), ref, torch.bfloat16)
    for out_dtype in OUT_DTYPES:
        check(pg.fp8_fp4_mm(a, wq.t(), sa, sw, out_dtype=out_dtype), ref, out_dtype)
    args = fp8_fp4_operands(m, n, k, seed=k)  # random codes under wide-range random scales
    check(pg.fp8_fp4_mm(*call_args("fp8_fp4_mm", args), out_dtype=torch.float32), reference("fp8_fp4_mm", args), torch.float32)


@pytest.mark.parametrize("op, index", sample_cases())
def test_samples_match_float64(op, index):
    args, kwargs = nth_sample(op, index)
    out = op_fn(op)(*call_args(op, args), **kwargs)
    check(out, reference(op, args), kwargs.get("out_dtype") or default_out_dtype(op, args))


def test_bounds_can_fail():
    """The tolerance is tight enough to catch a real mistake: fp32 output that went through
    bf16, a result missing one K block, a scale applied twice."""
    a, b = operand(64, 1000, BF, seed=1), operand(1000, 48, BF, seed=2)
    ref = a.double() @ b.double()
    through_bf16 = (a.float() @ b.float()).to(BF).float()
    assert rel_err(through_bf16, ref) > error_bound(rounding_err(ref, torch.float32))
    short = (a[:, :-32].float() @ b[:-32].float()).to(BF)
    assert rel_err(short, ref) > error_bound(rounding_err(ref, BF))
    a8, b8 = fp8_pair(33, 40, 64, seed=3)
    sa, sb = fp32_scales(33, 40, True, seed=4)
    ref8 = (a8.double() * sa.double()) @ (b8.double() * sb.double())
    assert rel_err((ref8 * sa.double()).to(BF), ref8) > error_bound(rounding_err(ref8, BF))


def test_mx_scales_matter():
    """A wrong scale must change the answer: the references really apply them."""
    a, sa = pg.quantize_mxfp8(randn(16, 64, torch.float32, seed=3))
    wq, sw = pg.quantize_mxfp4(randn(8, 64, torch.float32, seed=4))
    base = pg.fp8_fp4_mm(a, wq.t(), sa, sw, out_dtype=torch.float32)
    bumped = (sw.view(torch.uint8) + 1).view(torch.float8_e8m0fnu)  # every b scale doubled
    assert torch.allclose(pg.fp8_fp4_mm(a, wq.t(), sa, bumped, out_dtype=torch.float32), 2 * base)


# -- strided and broadcast operands ---------------------------------------------------------------
@pytest.mark.parametrize("case", STRIDED_MM_CASES)
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_mm_strided_and_broadcast_operands(case, out_dtype):
    # Any strides are accepted (like torch.mm); non-TMA-readable operands are copied on CUDA.
    a, b = strided_mm_cases()[case]
    out = pg.mm(a, b, out_dtype=out_dtype)
    check(out, a.double() @ b.double(), out_dtype or a.dtype)
    assert out.is_contiguous()


@pytest.mark.parametrize("case", STRIDED_SCALED_MM_CASES)
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_scaled_mm_strided_and_broadcast_operands(case, rowwise):
    a, b = strided_scaled_mm_cases()[case]
    sa, sb = fp32_scales(a.shape[0], b.shape[1], rowwise, seed=6)
    out = pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    check(out, (a.double() * sa.double()) @ (b.double() * sb.double()), torch.float32)


# -- schemas, compile, autograd ----------------------------------------------------------------
def _bytes(t):
    return t.view(torch.uint8).clone() if t.element_size() == 1 else t.clone()


@pytest.mark.parametrize("op, index", sample_cases())
def test_opcheck(op, index):
    args, kwargs = nth_sample(op, index)
    if op == "mm":
        args = tuple(t.requires_grad_() for t in args)
        torch.library.opcheck(op_fn(op), call_args(op, args), kwargs)
        return
    # torch's test_schema compares inputs with allclose, which has no CPU kernel for fp8; run
    # the other checks, and check "no input is mutated" bitwise ourselves.
    before = [_bytes(t) for t in args]
    torch.library.opcheck(op_fn(op), call_args(op, args), kwargs,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(torch.equal(x, _bytes(y)) for x, y in zip(before, args))


def test_torch_compile_fullgraph():
    samples = {op: nth_sample(op, i) for op, i in (("mm", 1), ("scaled_mm", 5), ("mxfp8_mm", 1), ("fp8_fp4_mm", 1))}

    def f(*flat):
        total = 0
        for op, (args, kwargs) in samples.items():
            n = len(args)
            out = getattr(torch.ops.persistent_gemm, op)(*flat[:n], **kwargs)
            flat = flat[n:]
            total = total + out.float().sum()
        return total

    flat = [t for op, (args, _) in samples.items() for t in call_args(op, args)]
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*flat), f(*flat))


@pytest.mark.parametrize("layout", ["rr", "rc", "cc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mm_autograd_matches_float64(dtype, layout):
    m, n, k = 19, 23, 40
    a = operand(m, k, dtype, layout[0] == "r", seed=5).requires_grad_()
    b = operand(k, n, dtype, layout[1] == "r", seed=6).requires_grad_()
    w = randn(m, n, torch.float32, seed=7)
    (pg.mm(a, b).float() * w).sum().backward()
    # The same graph in float64. The upstream gradient reaches mm as w rounded to the input
    # dtype (the .float() cast's backward), exactly as it does for the op under test.
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    (a64 @ b64 * w.to(dtype).double()).sum().backward()
    for got, ref in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert got.dtype == dtype and got.shape == ref.shape
        check(got, ref, dtype)


def test_mm_autograd_is_a_cpp_kernel_and_tracks_only_what_needs_grad():
    # The Autograd kernel is C++ (csrc/ops.cpp), so no Python runs on an eager call.
    assert torch._C._dispatch_has_kernel_for_dispatch_key("persistent_gemm::mm", "Autograd")
    a = randn(9, 40, BF, seed=6)
    b = randn(40, 5, BF, seed=7).requires_grad_()
    assert pg.mm(a, b.detach()).grad_fn is None
    with torch.no_grad():
        assert pg.mm(a, b).grad_fn is None
    out = pg.mm(a, b)
    assert out.grad_fn is not None
    grad = randn(9, 5, BF, seed=8)
    out.backward(grad)
    assert a.grad is None
    check(b.grad, a.double().t() @ grad.double(), BF)


# -- use_fast_accum ----------------------------------------------------------------------------
def test_scaled_mm_use_fast_accum_defaults_like_torch():
    # Same name, type and default as torch._scaled_mm's argument.
    torch_default = next(x.default_value for x in torch.ops.aten._scaled_mm.default._schema.arguments
                         if x.name == "use_fast_accum")
    ours = next(x for x in op_fn("scaled_mm")._schema.arguments if x.name == "use_fast_accum")
    assert str(ours.type) == "bool" and ours.default_value is torch_default is False
    assert inspect.signature(pg.scaled_mm).parameters["use_fast_accum"].default is False



# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((torch.randn(4, 8, dtype=BF), torch.randn(8, dtype=BF)), ValueError, "b must be a 2-D tensor"),
        ((torch.randn(2, 4, 8, dtype=BF), torch.randn(8, 3, dtype=BF)), ValueError, "a must be a 2-D tensor"),
        ((torch.randn(4, 8), torch.randn(8, 3)), TypeError, "a must be torch.bfloat16 or torch.float16"),
        ((torch.randn(4, 8, dtype=BF), torch.randn(8, 3, dtype=torch.half)), TypeError, "b must have a's dtype"),
        ((torch.randn(4, 8, dtype=BF), torch.randn(7, 3, dtype=BF)), ValueError, "K extents differ"),
    ],
    ids=["b-rank", "a-rank", "a-dtype", "b-dtype", "k-mismatch"],
)
def test_mm_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        pg.mm(*args)


def test_mm_bad_out_dtype_and_config():
    a, b = torch.randn(4, 8, dtype=BF), torch.randn(8, 3, dtype=BF)
    with pytest.raises(TypeError, match="out_dtype must be"):
        pg.mm(a, b, out_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"(?s)unknown config 'nope'.*the catalogue has \d+ configs"):
        pg.mm(a, b, config="nope")
    fp8_name = next(c.name for c in pg.CATALOGUE if c.dtype == "e4m3")
    with pytest.raises(ValueError, match="is a e4m3 kernel"):
        pg.mm(a, b, config=fp8_name)
    bf16_name = next(c.name for c in pg.CATALOGUE if c.dtype == "bf16")
    assert pg.mm(a, b, config=bf16_name).shape == (4, 3)  # a known name is accepted on CPU


def test_scaled_mm_errors():
    a, b = fp8_pair(8, 6, 32, seed=0)
    one = torch.tensor(1.0)
    with pytest.raises(ValueError, match="b must be column-major"):
        pg.scaled_mm(a, b.contiguous(), one, one)
    with pytest.raises(ValueError, match="a must be row-major"):
        pg.scaled_mm(a.t().contiguous().t(), b, one, one)
    with pytest.raises(TypeError, match="scale_a must be torch.float32, got torch.float64"):
        pg.scaled_mm(a, b, one.double(), one)
    with pytest.raises(ValueError, match=r"scale_a and scale_b must both be tensorwise .* or both rowwise.*"
                                         r"got scale_a \[\] \(tensorwise\) and scale_b \[1, 6\] \(rowwise\)"):
        pg.scaled_mm(a, b, one, torch.ones(1, 6))
    with pytest.raises(ValueError, match=r"scale_a must be a scalar \(tensorwise\) or \(M, 1\)"):
        pg.scaled_mm(a, b, torch.ones(8), torch.ones(1, 6))
    with pytest.raises(ValueError, match=r"scale_b must be a scalar \(tensorwise\) or \(1, N\)"):
        pg.scaled_mm(a, b, torch.ones(8, 1), torch.ones(6, 1))
    with pytest.raises(TypeError, match="a must be torch.float8_e4m3fn, got torch"):
        pg.scaled_mm(a.to(BF), b, one, one)


def test_mx_errors():
    xq, xs = pg.quantize_mxfp8(torch.randn(8, 64))
    wq, ws = pg.quantize_mxfp8(torch.randn(6, 64))
    with pytest.raises(ValueError, match=r"scale_a must have shape \(M, ceil\(K/32\)\) = \(8, 2\)"):
        pg.mxfp8_mm(xq, wq.t(), xs[:, :1], ws)
    with pytest.raises(TypeError, match="scale_b must be torch.float8_e8m0fnu"):
        pg.mxfp8_mm(xq, wq.t(), xs, ws.to(torch.float32))
    with pytest.raises(ValueError, match="b must be column-major"):
        pg.mxfp8_mm(xq, wq.t().contiguous(), xs, ws)
    w4, s4 = pg.quantize_mxfp4(torch.randn(6, 64))
    with pytest.raises(ValueError, match=r"b holds two e2m1 values per byte, so it must be \(K/2, N\)"):
        pg.fp8_fp4_mm(xq[:, :32], w4.t(), xs[:, :1], s4)
    x48, s48 = pg.quantize_mxfp8(torch.randn(8, 48))
    w48, ws48 = pg.quantize_mxfp4(torch.randn(6, 48))
    with pytest.raises(ValueError, match=r"looks like the \(N, K/2\) packed weight itself; pass its transpose "
                                         r"\(K/2, N\) = \(32, 6\): wq.t\(\)"):
        pg.fp8_fp4_mm(xq, w4, xs, s4)  # the forgotten .t()
    with pytest.raises(ValueError, match="K = 48 must be a multiple of 32"):
        pg.fp8_fp4_mm(x48, w48.t(), s48, ws48)
    with pytest.raises(TypeError, match="b must be torch.float4_e2m1fn_x2, got torch"):
        pg.fp8_fp4_mm(xq, wq.t(), xs, ws)


def test_mixed_devices_rejected():
    a = torch.randn(4, 8, dtype=BF)
    b = torch.randn(8, 3, dtype=BF, device="meta")
    with pytest.raises(ValueError, match="b is on meta but a is on cpu"):
        torch.ops.persistent_gemm.mm.default.redispatch(torch._C.DispatchKeySet("CPU"), a, b, None, None)


@pytest.mark.parametrize("mnk", [(0, 3, 8), (4, 0, 8), (4, 3, 0), (0, 0, 0)], ids=ids)
def test_empty_extents(mnk):
    m, n, k = mnk
    z = pg.mm(torch.randn(m, k, dtype=BF), torch.randn(k, n, dtype=BF))
    assert z.shape == (m, n) and z.dtype == BF and bool((z == 0).all())
    a, b = fp8_pair(m, n, k, seed=0)
    for sa, sb in ((torch.tensor(2.0), torch.tensor(3.0)), (torch.ones(m, 1), torch.ones(1, n))):
        z = pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
        assert z.shape == (m, n) and z.dtype == torch.float32 and bool((z == 0).all())


def test_vmap_of_mm_is_one_gemm_per_weight_and_warns_nothing():
    import warnings

    a = randn(3 * 4, 32, BF, seed=1).reshape(3, 4, 32)
    w = randn(32, 8, BF, seed=2)
    ws = randn(3 * 32, 8, BF, seed=3).reshape(3, 32, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "falls back to a slow loop" is a UserWarning
        shared = torch.vmap(pg.mm, in_dims=(0, None))(a, w)
        batched = torch.vmap(pg.mm, in_dims=(0, 0))(a, ws)
        moved = torch.vmap(pg.mm, in_dims=(1, None))(a.transpose(0, 1).contiguous(), w)
    for i in range(3):
        assert torch.equal(shared[i], pg.mm(a[i], w))
        assert torch.equal(batched[i], pg.mm(a[i], ws[i]))
        assert torch.equal(moved[i], pg.mm(a[i], w))
