"""CPU tests of the ops' epilogue: bias, alpha, beta and ``addmm``.

D = alpha * (scaled A @ B) + beta * bias[n], in fp32, rounded once. The references (the ops'
CPU kernels) define it; these tests hold them to a float64 computation written here, check the
argument errors, the schemas with a bias (opcheck, torch.compile) and mm's gradient w.r.t. the
bias. The GPU kernels are held to the same float64 sums in test_gpu_epilogue.py.
"""

from __future__ import annotations

import pytest
import torch

import persistent_gemm as pg
from conftest import (call_args, error_bound, fp8_pair, fp32_scales, nth_sample, op_fn, randn, reference, rel_err,
                      rounding_err, default_out_dtype)

if not pg.extension_available():
    pytest.skip("the compiled extension is not built", allow_module_level=True)

OPS = ("mm", "scaled_mm", "mxfp8_mm", "fp8_fp4_mm")
# (op, sample index) pairs covering every out dtype and both scale kinds.
CASES = [("mm", 0), ("mm", 1), ("mm", 2), ("scaled_mm", 1), ("scaled_mm", 6), ("mxfp8_mm", 1),
         ("mxfp8_mm", 2), ("fp8_fp4_mm", 1)]
# alpha / beta only exist on mm and scaled_mm (addmm's terms).
SCALARS = {"mm": (0.75, -1.5), "scaled_mm": (2.0, 0.5)}


def bias_for(op: str, args, kwargs, seed: int = 7) -> torch.Tensor:
    """A nonzero bias of the op's output dtype, of magnitude comparable to the product's."""
    n = args[2 if op in ("mxfp8_mm", "fp8_fp4_mm") else 1].shape[1]
    out = kwargs.get("out_dtype") or default_out_dtype(op, args)
    ref = reference(op, args)
    return (randn(1, n, torch.float32, seed) * ref.abs().mean().item()).reshape(n).to(out)


def expected(op: str, args, bias, alpha=1.0, beta=1.0) -> torch.Tensor:
    return alpha * reference(op, args) + beta * bias.double()


@pytest.mark.parametrize("op, index", CASES, ids=[f"{o}-{i}" for o, i in CASES])
def test_bias_reference_matches_float64(op, index):
    args, kwargs = nth_sample(op, index)
    bias = bias_for(op, args, kwargs)
    alpha, beta = SCALARS.get(op, (1.0, 1.0))
    extra = {"alpha": alpha, "beta": beta} if op in SCALARS else {}
    out = op_fn(op)(*call_args(op, args), **kwargs, bias=bias, **extra)
    ref = expected(op, args, bias, alpha, beta)
    assert out.dtype == bias.dtype and out.shape == ref.shape
    # One rounding of the fp32 sum: within 2x the float64 result's own rounding error.
    err, bound = rel_err(out, ref), error_bound(rounding_err(ref, out.dtype), 1e-5)
    assert err <= bound, f"rel err {err:.3g} > {bound:.3g}"
    # ... and the bias really went in: without it the answer is far off.
    assert rel_err(op_fn(op)(*call_args(op, args), **kwargs), ref) > 10 * bound


def test_beta_zero_ignores_the_bias_even_nan():
    """addmm's rule: beta == 0 means the input is not read, so NaN there does not propagate."""
    (a, b), kw = nth_sample("mm", 0)
    bias = torch.full((b.shape[1],), float("nan"), dtype=a.dtype)
    out = pg.mm(a, b, bias=bias, beta=0.0, alpha=2.0)
    assert torch.equal(out, pg.mm(a, b, alpha=2.0))
    assert not out.isnan().any()


@pytest.mark.parametrize("input_shape", ["row", "row2d", "full", "column", "scalar"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_addmm_matches_torch_addmm(input_shape, dtype):
    m, n, k = 33, 40, 72
    a, b = randn(m, k, dtype, 1), randn(k, n, dtype, 2)
    shape = {"row": (n,), "row2d": (1, n), "full": (m, n), "column": (m, 1), "scalar": ()}[input_shape]
    inp = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = pg.addmm(inp, a, b, beta=0.5, alpha=-2.0)
    ref = 0.5 * inp.double() + (-2.0) * (a.double() @ b.double())
    peer = torch.addmm(inp.float(), a.float(), b.float(), beta=0.5, alpha=-2.0).to(dtype)
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out, ref) <= error_bound(rel_err(peer, ref), 1e-5)


def test_bias_errors():
    (a, b), _ = nth_sample("mm", 0)
    n = b.shape[1]
    with pytest.raises(ValueError, match=r"bias must be a 1-D tensor of N = %d" % n):
        pg.mm(a, b, bias=torch.zeros(1, n, dtype=a.dtype))
    with pytest.raises(ValueError, match=r"bias must be a 1-D tensor of N = %d.*shape \[%d\]" % (n, n + 1)):
        pg.mm(a, b, bias=torch.zeros(n + 1, dtype=a.dtype))
    with pytest.raises(TypeError, match=r"bias must have the output's dtype torch.float32, got torch.bfloat16"):
        pg.mm(a, b, out_dtype=torch.float32, bias=torch.zeros(n, dtype=torch.bfloat16))
    (xa, xb, sa, sb), _ = nth_sample("scaled_mm", 0)
    with pytest.raises(TypeError, match=r"scaled_mm: bias must have the output's dtype torch.bfloat16"):
        pg.scaled_mm(xa, xb, sa, sb, bias=torch.zeros(xb.shape[1]))
    (qa, qs, qb, qbs), _ = nth_sample("mxfp8_mm", 0)
    with pytest.raises(ValueError, match=r"mxfp8_mm: bias must be a 1-D tensor"):
        pg.mxfp8_mm(qa, qb, qs, qbs, bias=torch.zeros(3, dtype=torch.bfloat16))


def test_fake_kernels_check_the_bias():
    """The fakes say the same at trace time (torch._check raises RuntimeError under FakeTensor)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(16, 24, dtype=torch.bfloat16)
        assert pg.mm(a, b, bias=torch.empty(24, dtype=torch.bfloat16)).shape == (8, 24)
        with pytest.raises(Exception, match="bias must be a 1-D tensor of N = 24"):
            torch.ops.persistent_gemm.mm.default(a, b, None, None, torch.empty(23, dtype=torch.bfloat16))
        with pytest.raises(Exception, match="bias must have the output's dtype"):
            torch.ops.persistent_gemm.mm.default(a, b, torch.float32, None, torch.empty(24, dtype=torch.bfloat16))


@pytest.mark.parametrize("op", OPS)
def test_opcheck_with_bias(op):
    index = {"mm": 1, "scaled_mm": 5, "mxfp8_mm": 1, "fp8_fp4_mm": 1}[op]
    args, kwargs = nth_sample(op, index)
    kwargs = dict(kwargs, bias=bias_for(op, args, kwargs))
    if op in SCALARS:
        kwargs.update(alpha=1.25, beta=-0.5)
    if op == "mm":
        args = tuple(t.requires_grad_() for t in args)
        kwargs["bias"].requires_grad_()
        torch.library.opcheck(op_fn(op), call_args(op, args), kwargs)
        return
    torch.library.opcheck(op_fn(op), call_args(op, args), kwargs,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_mm_gradients_with_bias_alpha_beta():
    m, n, k = 12, 20, 36
    a = randn(m, k, torch.float32, 4).double().requires_grad_()
    b = randn(k, n, torch.float32, 5).double().requires_grad_()
    bias = randn(1, n, torch.float32, 6).reshape(n).double().requires_grad_()
    g = randn(m, n, torch.float32, 7).double()
    (2.5 * (a @ b) - 0.5 * bias).backward(g)
    want = (a.grad.clone(), b.grad.clone(), bias.grad.clone())

    def grads(mm):  # fp32 leaves through bf16 operands, fp32 out: the backward GEMMs run in bf16
        leaves = [t.detach().float().requires_grad_() for t in (a, b, bias)]
        mm(leaves[0].bfloat16(), leaves[1].bfloat16(), leaves[2]).backward(g.float())
        return [t.grad for t in leaves]

    got = grads(lambda x, w, c: pg.mm(x, w, out_dtype=torch.float32, bias=c, alpha=2.5, beta=-0.5))
    # The peer: torch's autograd of the same expression, which rounds dC and dA, dB to bf16 as ours
    # does; the bias gradient is an fp32 sum in both (the floor covers its summation order).
    peer = grads(lambda x, w, c: 2.5 * torch.mm(x, w).float() - 0.5 * c)
    for name, ours, theirs, exp in zip(("a", "b", "bias"), got, peer, want):
        assert ours is not None, name
        err, bound = rel_err(ours, exp), error_bound(rel_err(theirs, exp))
        assert err <= bound, f"d{name}: rel err {err:.3g} > bound {bound:.3g}"


def test_quantized_ops_refuse_a_bias_that_requires_grad():
    (xa, xb, sa, sb), _ = nth_sample("scaled_mm", 0)
    bias = torch.zeros(xb.shape[1], dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"scaled_mm is not differentiable.*'bias' requires grad"):
        pg.scaled_mm(xa, xb, sa, sb, bias=bias)
    with torch.no_grad():
        pg.scaled_mm(xa, xb, sa, sb, bias=bias)


def test_compile_fullgraph_with_bias():
    (a, b), _ = nth_sample("mm", 0)
    (xa, xb, sa, sb), _ = nth_sample("scaled_mm", 5)
    bias = torch.ones(b.shape[1], dtype=a.dtype)
    sbias = torch.ones(xb.shape[1], dtype=torch.bfloat16)

    def f(a, b, bias, xa, xb, sa, sb, sbias):
        y = pg.addmm(bias, a, b, beta=0.5, alpha=2.0).float().sum()
        return y + pg.scaled_mm(xa, xb, sa, sb, bias=sbias).float().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    args = (a, b, bias, xa, xb, sa, sb, sbias)
    torch.testing.assert_close(compiled(*args), f(*args))


def test_empty_k_gives_beta_bias():
    a, b = torch.empty(3, 0, dtype=torch.bfloat16), torch.empty(0, 5, dtype=torch.bfloat16)
    bias = torch.arange(5, dtype=torch.bfloat16)
    out = pg.mm(a, b, bias=bias, beta=2.0, alpha=3.0)
    assert torch.equal(out, (2 * bias).expand(3, 5))


def test_nn_linear_bias_goes_through_the_op(monkeypatch):
    """The swapped Linear hands its bias to the op (fused) rather than adding it after."""
    lin = torch.nn.Linear(64, 48).to(torch.bfloat16)
    m = pg.nn.Linear.from_linear(lin, "bf16")
    seen = {}
    real = torch.ops.persistent_gemm.mm.default

    class Spy:
        def __call__(self, *args):
            seen["bias"] = args[4] if len(args) > 4 else None
            return real(*args)

    monkeypatch.setattr(torch.ops.persistent_gemm.mm, "default", Spy())
    x = randn(5, 64, torch.bfloat16, 9)
    y = m(x)
    assert seen["bias"] is not None and torch.equal(seen["bias"], lin.bias.detach())
    ref = x.double() @ lin.weight.detach().double().t() + lin.bias.detach().double()
    assert rel_err(y, ref) <= error_bound(rounding_err(ref, torch.bfloat16), 1e-5)


def test_scaled_mm_bias_reference_rowwise_fp32():
    """fp32 output: the bias is fp32 and the sum is kept to fp32 precision."""
    m, n, k = 17, 24, 64
    a, b = fp8_pair(m, n, k, seed=11)
    sa, sb = fp32_scales(m, n, True, seed=12)
    bias = randn(1, n, torch.float32, 13).reshape(n)
    out = pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, bias=bias, alpha=0.25, beta=4.0)
    ref = 0.25 * reference("scaled_mm", (a, b, sa, sb)) + 4.0 * bias.double()
    assert rel_err(out, ref) < 1e-6


def test_vmap_with_a_batched_bias():
    """vmap over activations with one bias is one GEMM; a per-example bias runs one per example."""
    a = randn(3 * 4, 32, torch.bfloat16, seed=1).reshape(3, 4, 32)
    w = randn(32, 8, torch.bfloat16, seed=2)
    biases = randn(3, 8, torch.bfloat16, seed=3)
    shared = torch.vmap(lambda x: pg.mm(x, w, bias=biases[0], alpha=2.0))(a)
    per = torch.vmap(lambda x, b: pg.mm(x, w, bias=b, beta=0.5))(a, biases)
    for i in range(3):
        assert torch.equal(shared[i], pg.mm(a[i], w, bias=biases[0], alpha=2.0))
        assert torch.equal(per[i], pg.mm(a[i], w, bias=biases[i], beta=0.5))
