"""GPU tests of the ops as torch sees them: the shared sample inputs (conftest.sample_inputs)
against float64, opcheck and torch.compile(fullgraph=True) on CUDA, mm's backward, empty
extents, streams and CUDA graphs.

Marked ``gpu``. Bounds as elsewhere: error_bound of torch's own error on the same inputs.
"""

import pytest
import torch
from conftest import (
    call_args,
    ARCH,
    built_configs,
    check_mm,
    check_scaled_mm,
    default_out_dtype,
    error_bound,
    fp8_pair,
    fp32_scales,
    nth_sample,
    op_fn,
    operand,
    poisoned,
    randn,
    rel_err,
    sample_cases,
)
from mx_helpers import check_mx

import persistent_gemm as pg

pytestmark = pytest.mark.gpu

CUDA = "cuda"
ids = lambda s: "x".join(map(str, s))  # noqa: E731
MX_FAMILY = {"mxfp8_mm": "mxfp8", "fp8_fp4_mm": "e4m3xe2m1"}


def mx_unbuilt(op):
    return op in MX_FAMILY and not built_configs(MX_FAMILY[op], arch=ARCH)


def check_sample(op, args, kwargs, out):
    out_dtype = kwargs.get("out_dtype") or default_out_dtype(op, args)
    if op == "mm":
        check_mm(out, *args, out_dtype)
    elif op == "scaled_mm":
        check_scaled_mm(out, *args, out_dtype, kwargs.get("use_fast_accum", False))
    else:  # the MX peer is the emulation (exact fp32 dequantization, fp32 torch.mm)
        check_mx(op, out, args, out_dtype)


# -- the shared samples ----------------------------------------------------------------------------
@pytest.mark.parametrize("op, index", sample_cases())
def test_samples_match_float64(op, index):
    args, kwargs = nth_sample(op, index, CUDA)
    if mx_unbuilt(op):
        pytest.skip(f"no {MX_FAMILY[op]} kernel built for this GPU")
    m, n = args[0].shape[0], args[2 if op in MX_FAMILY else 1].shape[1]
    out_dtype = kwargs.get("out_dtype") or default_out_dtype(op, args)
    out = poisoned(lambda: op_fn(op)(*call_args(op, args), **kwargs), m, n, out_dtype)
    check_sample(op, args, kwargs, out)


@pytest.mark.parametrize("op, index", sample_cases())
def test_opcheck_cuda(op, index):
    if mx_unbuilt(op):
        pytest.skip(f"no {MX_FAMILY[op]} kernel built for this GPU")
    args, kwargs = nth_sample(op, index, CUDA)
    if op == "mm":
        torch.library.opcheck(op_fn(op), tuple(t.requires_grad_() for t in args), kwargs)
    else:  # test_schema compares inputs with allclose, which has no fp8 kernel
        torch.library.opcheck(op_fn(op), call_args(op, args), kwargs,
                              test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("op, index", sample_cases())
def test_compile_fullgraph_cuda(op, index):
    if mx_unbuilt(op):
        pytest.skip(f"no {MX_FAMILY[op]} kernel built for this GPU")
    args, kwargs = nth_sample(op, index, CUDA)
    torch._dynamo.reset()
    f = torch.compile(lambda *xs: op_fn(op)(*xs, **kwargs) * 2, fullgraph=True)  # * 2: exact, fused by inductor
    check_sample(op, args, kwargs, f(*call_args(op, args)) / 2)


# -- mm backward -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mnk", [(300, 264, 520), (129, 7, 1000)], ids=ids)
@pytest.mark.parametrize("layout", ["rr", "rc", "cc"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mm_backward_matches_float64(dtype, layout, mnk):
    m, n, k = mnk
    a0 = operand(m, k, dtype, layout[0] == "r", seed=m, device=CUDA)
    b0 = operand(k, n, dtype, layout[1] == "r", seed=n, device=CUDA)
    w = randn(m, n, torch.float32, seed=k, device=CUDA)

    def grads(mm):
        a, b = a0.detach().requires_grad_(), b0.detach().requires_grad_()
        (mm(a, b).float() * w).sum().backward()
        return a.grad, b.grad

    ours, peer = grads(pg.mm), grads(torch.mm)
    # The same graph in float64; the upstream gradient reaches mm as w rounded to the input
    # dtype (the .float() cast's backward), for ours and torch's alike.
    a64, b64 = a0.double().requires_grad_(), b0.double().requires_grad_()
    (a64 @ b64 * w.to(dtype).double()).sum().backward()
    for got, theirs, ref in zip(ours, peer, (a64.grad, b64.grad)):
        assert got.dtype == dtype and got.shape == ref.shape and not got.isnan().any()
        err, bound = rel_err(got, ref), error_bound(rel_err(theirs, ref))
        assert err <= bound, f"grad rel err {err:.3g} > bound {bound:.3g}"


# -- empty extents ---------------------------------------------------------------------------------
ZERO = [(0, 64, 128), (64, 0, 128), (64, 48, 0), (0, 0, 0), (0, 48, 0)]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("mnk", ZERO, ids=ids)
def test_mm_zero_extents(mnk, out_dtype):
    # K = 0 is an empty sum: zeros of shape (M, N), as torch.mm gives.
    m, n, k = mnk
    a, b = randn(m, k, device=CUDA), randn(k, n, device=CUDA)
    out = poisoned(lambda: pg.mm(a, b, out_dtype=out_dtype), m, n, out_dtype)
    assert out.device.type == "cuda" and bool((out == 0).all())
    torch.testing.assert_close(out, torch.mm(a, b).to(out_dtype), rtol=0, atol=0)


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("mnk", ZERO, ids=ids)
def test_scaled_mm_zero_extents(mnk, rowwise):
    m, n, k = mnk
    a, b = fp8_pair(m, n, k, device=CUDA)
    sa, sb = fp32_scales(m, n, rowwise, device=CUDA)
    out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32), m, n, torch.float32)
    assert out.device.type == "cuda" and bool((out == 0).all())


# -- streams and graphs ------------------------------------------------------------------------------
def test_non_default_stream_and_graph_capture():
    a, b = randn(1000, 512, seed=7, device=CUDA), randn(512, 768, seed=8, device=CUDA)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = pg.mm(a, b)
    torch.cuda.current_stream().wait_stream(s)
    check_mm(out, a, b)
    g = torch.cuda.CUDAGraph()
    pg.mm(a, b)  # warm-up outside capture (smem attributes, lazy module loading)
    with torch.cuda.graph(g):
        captured = pg.mm(a, b)
    captured.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check_mm(captured, a, b)


def test_scaled_mm_graph_capture():
    a, b = fp8_pair(300, 264, 512, seed=9, device=CUDA)
    sa, sb = fp32_scales(300, 264, True, seed=10, device=CUDA)
    pg.scaled_mm(a, b, sa, sb)  # warm-up outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = pg.scaled_mm(a, b, sa, sb)
    captured.fill_(float("nan"))
    sa.mul_(2)  # a graph reads the scales at replay time, not at capture
    g.replay()
    torch.cuda.synchronize()
    check_scaled_mm(captured, a, b, sa, sb)
