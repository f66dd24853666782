"""CPU tests of the ops: reference numerics, schemas (opcheck), torch.compile, autograd, errors.

The CPU implementations are the references that define each op; here they are checked
against float64 products of the (independently) dequantized inputs.
"""

import pytest
import torch

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="extension not built")

E4M3 = torch.float8_e4m3fn
SHAPES = [(1, 1, 1), (7, 129, 33), (129, 7, 257), (33, 100, 64), (64, 48, 1000), (257, 31, 95)]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fp8_operands(m, n, k, seed):
    g = gen(seed)
    a = (torch.randn(m, k, generator=g) * 2).to(E4M3)
    b = (torch.randn(n, k, generator=g) * 2).to(E4M3).t()  # (K, N) column-major
    return a, b


# -- numerics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["rr", "rc", "cr", "cc"])
def test_mm_reference(dtype, shape, layout):
    m, n, k = shape
    g = gen(m * 7 + n * 3 + k)
    a = torch.randn(m, k, generator=g).to(dtype) if layout[0] == "r" else torch.randn(k, m, generator=g).to(dtype).t()
    b = torch.randn(k, n, generator=g).to(dtype) if layout[1] == "r" else torch.randn(n, k, generator=g).to(dtype).t()
    ref = a.double() @ b.double()
    out = pg.mm(a, b)
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out, ref) < 1e-2
    out32 = pg.mm(a, b, out_dtype=torch.float32)
    assert out32.dtype == torch.float32
    assert rel_err(out32, ref) < 1e-5  # fp32 accumulation, no final rounding to 16 bits


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm_reference(rowwise, shape):
    m, n, k = shape
    a, b = fp8_operands(m, n, k, seed=k)
    g = gen(1)
    if rowwise:
        sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
    else:
        sa, sb = torch.tensor(0.75), torch.tensor(1.5)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
        out = pg.scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
        assert out.dtype == out_dtype
        assert rel_err(out, ref) < (1e-5 if out_dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("shape", [(7, 129, 33), (33, 100, 64), (64, 48, 1000), (1, 5, 31)],
                         ids=lambda s: "x".join(map(str, s)))
def test_mxfp8_mm_reference(shape):
    m, n, k = shape
    g = gen(k)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m).unsqueeze(1)
    w = torch.randn(n, k, generator=g)
    a, sa = pg.quantize_mxfp8(x)
    wq, sw = pg.quantize_mxfp8(w)
    ref = pg.dequantize_mxfp8(a, sa).double() @ pg.dequantize_mxfp8(wq, sw).double().t()
    out = pg.mxfp8_mm(a, sa, wq.t(), sw, out_dtype=torch.float32)
    assert out.shape == (m, n)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(pg.mxfp8_mm(a, sa, wq.t(), sw), ref) < 1e-2


@pytest.mark.parametrize("shape", [(7, 129, 32), (33, 100, 64), (64, 48, 1024)], ids=lambda s: "x".join(map(str, s)))
def test_fp8_fp4_mm_reference(shape):
    m, n, k = shape
    g = gen(k + 1)
    a, sa = pg.quantize_mxfp8(torch.randn(m, k, generator=g))
    wq, sw = pg.quantize_mxfp4(torch.randn(n, k, generator=g))
    ref = pg.dequantize_mxfp8(a, sa).double() @ pg.dequantize_mxfp4(wq, sw).double().t()
    out = pg.fp8_fp4_mm(a, sa, wq.t(), sw, out_dtype=torch.float32)
    assert rel_err(out, ref) < 1e-5
    assert rel_err(pg.fp8_fp4_mm(a, sa, wq.t(), sw), ref) < 1e-2


def test_mx_scales_matter():
    """A wrong scale must change the answer: the references really apply them."""
    a, sa = pg.quantize_mxfp8(torch.randn(16, 64, generator=gen(3)))
    wq, sw = pg.quantize_mxfp4(torch.randn(8, 64, generator=gen(4)))
    base = pg.fp8_fp4_mm(a, sa, wq.t(), sw, out_dtype=torch.float32)
    bumped = (sw.view(torch.uint8) + 1).view(torch.float8_e8m0fnu)  # every b scale doubled
    assert torch.allclose(pg.fp8_fp4_mm(a, sa, wq.t(), bumped, out_dtype=torch.float32), 2 * base)


# -- schemas, compile, autograd ----------------------------------------------------------------
def _samples():
    g = gen(11)
    a16 = torch.randn(24, 40, generator=g, dtype=torch.bfloat16)
    b16 = torch.randn(40, 17, generator=g, dtype=torch.bfloat16)
    a8, b8 = fp8_operands(24, 17, 64, seed=2)
    xq, xs = pg.quantize_mxfp8(torch.randn(24, 64, generator=g))
    wq8, ws8 = pg.quantize_mxfp8(torch.randn(17, 64, generator=g))
    wq4, ws4 = pg.quantize_mxfp4(torch.randn(17, 64, generator=g))
    return {
        "mm": (a16, b16, None, None),
        "scaled_mm": (a8, b8, torch.rand(24, 1) + 0.5, torch.rand(1, 17) + 0.5, torch.float32, None),
        "mxfp8_mm": (xq, xs, wq8.t(), ws8, None, None),
        "fp8_fp4_mm": (xq, xs, wq4.t(), ws4, torch.float16, None),
    }


@pytest.mark.parametrize("op", ["mm", "scaled_mm", "mxfp8_mm", "fp8_fp4_mm"])
def test_opcheck(op):
    args = _samples()[op]
    if op == "mm":
        args = (args[0].requires_grad_(), args[1].requires_grad_(), *args[2:])
    if op == "mm":
        torch.library.opcheck(torch.ops.persistent_gemm.mm, args)
        return
    # torch's test_schema compares inputs with allclose, which has no CPU kernel for fp8; run
    # the other checks, and check "no input is mutated" bitwise ourselves.
    before = [t.view(torch.uint8).clone() if t.element_size() == 1 else t.clone()
              for t in args if isinstance(t, torch.Tensor)]
    torch.library.opcheck(getattr(torch.ops.persistent_gemm, op), args,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    after = [t.view(torch.uint8) if t.element_size() == 1 else t for t in args if isinstance(t, torch.Tensor)]
    assert all(torch.equal(x, y) for x, y in zip(before, after))


def test_torch_compile_fullgraph():
    s = _samples()

    def f(x16, w16, a8, b8, sa, sb, xq, xs, wq8, ws8, wq4, ws4):
        y = torch.ops.persistent_gemm.mm(x16, w16).float()
        z = torch.ops.persistent_gemm.scaled_mm(a8, b8, sa, sb, torch.float32)
        u = torch.ops.persistent_gemm.mxfp8_mm(xq, xs, wq8, ws8, torch.float32)
        v = torch.ops.persistent_gemm.fp8_fp4_mm(xq, xs, wq4, ws4, torch.float32)
        return y.sum() + z.sum() + u.sum() + v.sum()

    args = (*s["mm"][:2], *s["scaled_mm"][:4], *s["mxfp8_mm"][:4], s["fp8_fp4_mm"][2], s["fp8_fp4_mm"][3])
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), f(*args))


def test_mm_autograd_matches_torch_mm():
    g = gen(5)
    a = torch.randn(19, 40, generator=g, dtype=torch.float32).to(torch.bfloat16).requires_grad_()
    b = torch.randn(40, 23, generator=g, dtype=torch.float32).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(19, 23, generator=g).to(torch.bfloat16)
    pg.mm(a, b).backward(grad)
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    torch.mm(a, b).backward(grad)
    assert ga.dtype == a.dtype and gb.dtype == b.dtype
    assert rel_err(ga, a.grad.double()) < 1e-2 and rel_err(gb, b.grad.double()) < 1e-2
    ref_ga = grad.double() @ b.detach().double().t()
    assert rel_err(ga, ref_ga) < 1e-2


def test_mm_autograd_is_a_cpp_kernel_and_tracks_only_what_needs_grad():
    # The Autograd kernel is C++ (csrc/ops.cpp), so no Python runs on an eager call.
    assert torch._C._dispatch_has_kernel_for_dispatch_key("persistent_gemm::mm", "Autograd")
    g = gen(6)
    a = torch.randn(9, 40, generator=g).to(torch.bfloat16)
    b = torch.randn(40, 5, generator=g).to(torch.bfloat16).requires_grad_()
    assert pg.mm(a, b.detach()).grad_fn is None
    with torch.no_grad():
        assert pg.mm(a, b).grad_fn is None
    out = pg.mm(a, b)
    assert out.grad_fn is not None
    grad = torch.randn(9, 5, generator=g).to(torch.bfloat16)
    out.backward(grad)
    assert a.grad is None
    assert rel_err(b.grad, a.double().t() @ grad.double()) < 1e-2


# -- errors --------------------------------------------------------------------------------------
BF = torch.bfloat16


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((torch.randn(4, 8, dtype=BF), torch.randn(8, dtype=BF)), ValueError, "b must be a 2-D tensor"),
        ((torch.randn(2, 4, 8, dtype=BF), torch.randn(8, 3, dtype=BF)), ValueError, "a must be a 2-D tensor"),
        ((torch.randn(4, 8), torch.randn(8, 3)), TypeError, "a must be torch.bfloat16 or torch.float16"),
        ((torch.randn(4, 8, dtype=BF), torch.randn(8, 3, dtype=torch.half)), TypeError, "b must have a's dtype"),
        ((torch.randn(4, 8, dtype=BF), torch.randn(7, 3, dtype=BF)), ValueError, "K extents differ"),
        ((torch.randn(4, 16, dtype=BF)[:, ::2], torch.randn(8, 3, dtype=BF)), ValueError, "a needs a unit stride"),
        ((torch.randn(4, 8, dtype=BF), torch.randn(8, 6, dtype=BF)[:, ::2]), ValueError, "b needs a unit stride"),
    ],
    ids=["b-rank", "a-rank", "a-dtype", "b-dtype", "k-mismatch", "a-strides", "b-strides"],
)
def test_mm_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        pg.mm(*args)


def test_mm_bad_out_dtype_and_config():
    a, b = torch.randn(4, 8, dtype=BF), torch.randn(8, 3, dtype=BF)
    with pytest.raises(TypeError, match="out_dtype must be"):
        pg.mm(a, b, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="(?s)unknown config 'nope'.*sm90a_bf16"):
        pg.mm(a, b, config="nope")
    fp8_name = next(c.name for c in pg.CATALOGUE if c.dtype == "e4m3")
    with pytest.raises(ValueError, match="is a e4m3 kernel"):
        pg.mm(a, b, config=fp8_name)
    bf16_name = next(c.name for c in pg.CATALOGUE if c.dtype == "bf16")
    assert pg.mm(a, b, config=bf16_name).shape == (4, 3)  # a known name is accepted on CPU


def test_scaled_mm_errors():
    a, b = fp8_operands(8, 6, 32, seed=0)
    one = torch.tensor(1.0)
    with pytest.raises(ValueError, match="b must be column-major"):
        pg.scaled_mm(a, b.contiguous(), one, one)
    with pytest.raises(ValueError, match="a must be row-major"):
        pg.scaled_mm(a.t().contiguous().t(), b, one, one)
    with pytest.raises(TypeError, match="scale_a must be Float"):
        pg.scaled_mm(a, b, one.double(), one)
    with pytest.raises(ValueError, match=r"scale_a must be a scalar \(tensorwise\) or \(M, 1\)"):
        pg.scaled_mm(a, b, torch.ones(8), torch.ones(1, 6))
    with pytest.raises(ValueError, match=r"scale_b must be a scalar \(tensorwise\) or \(1, N\)"):
        pg.scaled_mm(a, b, torch.ones(8, 1), torch.ones(6, 1))
    with pytest.raises(TypeError, match="a must be Float8_e4m3fn"):
        pg.scaled_mm(a.to(BF), b, one, one)


def test_mx_errors():
    xq, xs = pg.quantize_mxfp8(torch.randn(8, 64))
    wq, ws = pg.quantize_mxfp8(torch.randn(6, 64))
    with pytest.raises(ValueError, match=r"a_scale must have shape \(M, ceil\(K/32\)\) = \(8, 2\)"):
        pg.mxfp8_mm(xq, xs[:, :1], wq.t(), ws)
    with pytest.raises(TypeError, match="b_scale must be torch.float8_e8m0fnu"):
        pg.mxfp8_mm(xq, xs, wq.t(), ws.to(torch.float32))
    with pytest.raises(ValueError, match="b must be column-major"):
        pg.mxfp8_mm(xq, xs, wq.t().contiguous(), ws)
    w4, s4 = pg.quantize_mxfp4(torch.randn(6, 64))
    with pytest.raises(ValueError, match=r"b holds two e2m1 values per byte, so it must be \(K/2, N\)"):
        pg.fp8_fp4_mm(xq[:, :32], xs[:, :1], w4.t(), s4)
    x48, s48 = pg.quantize_mxfp8(torch.randn(8, 48))
    w48, ws48 = pg.quantize_mxfp4(torch.randn(6, 48))
    with pytest.raises(ValueError, match="K = 48 must be a multiple of 32"):
        pg.fp8_fp4_mm(x48, s48, w48.t(), ws48)
    with pytest.raises(TypeError, match="b must be Float4_e2m1fn_x2"):
        pg.fp8_fp4_mm(xq, xs, wq.t(), ws)


def test_mixed_devices_rejected():
    a = torch.randn(4, 8, dtype=BF)
    b = torch.randn(8, 3, dtype=BF, device="meta")
    with pytest.raises(ValueError, match="b is on meta but a is on cpu"):
        torch.ops.persistent_gemm.mm.default.redispatch(torch._C.DispatchKeySet("CPU"), a, b, None, None)


def test_empty_extents():
    a, b = torch.randn(0, 8, dtype=BF), torch.randn(8, 3, dtype=BF)
    assert pg.mm(a, b).shape == (0, 3)
    z = pg.mm(torch.randn(4, 0, dtype=BF), torch.randn(0, 3, dtype=BF))
    assert z.shape == (4, 3) and bool((z == 0).all())
