"""GPU tests of the fused epilogue: D = alpha * (scaled A @ B) + beta * bias[n], one rounding.

Every built config of this GPU's arch is forced with a bias (and alpha / beta where the op has
them) on an aligned shape (TMA-store variants) and a ragged one (predicated variants; swap-AB
kernels index the bias by their M), outputs NaN-poisoned, against float64. The peer is torch
emulating the op in fp32 on the same GPU (exact dequantization, fp32 matmul, the same epilogue
then one rounding): ours within error_bound of its error, plus the family's accumulation floor.
Split-K configs must stay bitwise reproducible with a bias (the reducer adds it once).
"""

import pytest
import torch
from conftest import (
    call_args,
    catalogue_config,
    ARCH,
    E4M3,
    FP8_FLOOR,
    built_configs,
    config_is_fast_accum,
    config_out_dtypes,
    error_bound,
    fp8_accum_floor,
    fp8_fp4_operands,
    fp8_pair,
    fp32_scales,
    mxfp8_operands,
    operand,
    poisoned,
    randn,
    reference,
    rel_err,
)
from mx_helpers import MX_FLOOR

import persistent_gemm as pg
from persistent_gemm.catalogue import parse_name

pytestmark = pytest.mark.gpu

CUDA = "cuda"
FAMILIES = ("bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1")
NAMES = [n for f in FAMILIES for n in built_configs(f, arch=ARCH)]
SHAPES = [(256, 512, 256), (37, 200, 96), (3, 520, 160)]
ids = lambda s: "x".join(map(str, s))  # noqa: E731
ALPHA, BETA = 0.75, -1.25


def _operands(fam: str, m: int, n: int, k: int, rowwise: bool):
    """(op, args, reference float64 product, fp32 emulation of the product)."""
    if fam in ("bf16", "fp16"):
        dtype = torch.bfloat16 if fam == "bf16" else torch.float16
        a, b = operand(m, k, dtype, seed=m, device=CUDA), operand(k, n, dtype, False, seed=n, device=CUDA)
        return "mm", (a, b), reference("mm", (a, b)), a.float() @ b.float()
    if fam == "e4m3":
        a, b = fp8_pair(m, n, k, seed=m + n, device=CUDA)
        sa, sb = fp32_scales(m, n, rowwise, seed=k, device=CUDA)
        args = (a, b, sa, sb)
        return "scaled_mm", args, reference("scaled_mm", args), (a.float() * sa) @ (b.float() * sb)
    op = "mxfp8_mm" if fam == "mxfp8" else "fp8_fp4_mm"
    args = (mxfp8_operands if fam == "mxfp8" else fp8_fp4_operands)(m, n, k, seed=m + k, device=CUDA)
    ref = reference(op, args)
    return op, args, ref, ref.float()


def _floor(fam: str, name: str, k: int) -> float:
    if fam in ("bf16", "fp16"):
        return 1e-5
    if fam == "e4m3":
        return fp8_accum_floor(k, config_is_fast_accum(name))
    return MX_FLOOR


def _run(op, args, out_dtype, name, bias, scalars):
    fn = getattr(pg, op)
    extra = {"use_fast_accum": config_is_fast_accum(name)} if op == "scaled_mm" else {}
    return fn(*call_args(op, args), out_dtype=out_dtype, config=name, bias=bias, **scalars, **extra)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("name", NAMES)
def test_forced_configs_fuse_bias_alpha_beta(name, shape):
    fam = parse_name(name).dtype
    m, n, k = shape
    cfg = catalogue_config(name)
    if cfg.kernel == "gemv":  # a decode GEMV takes at most tile_n tokens (its rule refuses more)
        m = min(m, cfg.tile[1])
    for out_dtype in [d for d in (torch.bfloat16, torch.float32) if d in config_out_dtypes(name)]:
        for rowwise in ((False, True) if fam == "e4m3" else (False,)):
            op, args, ref, emul = _operands(fam, m, n, k, rowwise)
            scalars = {"alpha": ALPHA, "beta": BETA} if op in ("mm", "scaled_mm") else {}
            alpha, beta = scalars.get("alpha", 1.0), scalars.get("beta", 1.0)
            bias = (randn(1, n, torch.float32, seed=k, device=CUDA).reshape(n) * ref.abs().mean().item()).to(out_dtype)
            out = poisoned(lambda: _run(op, args, out_dtype, name, bias, scalars), m, n, out_dtype)
            assert not out.isnan().any(), "NaN in the output: a tile was never written"
            want = alpha * ref + beta * bias.double()
            peer = (alpha * emul + beta * bias.float()).to(out_dtype)
            err, bound = rel_err(out, want), error_bound(rel_err(peer, want), _floor(fam, name, k))
            assert err <= bound, f"{op} {out_dtype} rowwise={rowwise}: rel err {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("name", [n for n in NAMES if parse_name(n).schedule.split_k > 1])
def test_split_k_with_bias_is_bitwise_reproducible(name):
    fam = parse_name(name).dtype
    op, args, ref, _ = _operands(fam, 2, 1000, 4096 + 96, rowwise=True)
    bias = randn(1, 1000, torch.float32, seed=3, device=CUDA).reshape(1000).to(torch.bfloat16)
    scalars = {"alpha": ALPHA, "beta": BETA} if op in ("mm", "scaled_mm") else {}
    dtype = torch.bfloat16
    first = _run(op, args, dtype, name, bias, scalars)
    for _ in range(3):
        assert torch.equal(_run(op, args, dtype, name, bias, scalars), first)


def test_default_dispatch_with_bias_matches_unfused():
    """The dispatcher's own choice (no config) with a bias: equal, to one rounding, to adding the
    bias to the fp32 result by hand, for a decode and a large shape."""
    for m, n, k in ((1, 4096, 4096), (1024, 2048, 512)):
        a = operand(m, k, torch.bfloat16, seed=1, device=CUDA)
        w = operand(n, k, torch.bfloat16, seed=2, device=CUDA)
        bias = randn(1, n, torch.bfloat16, seed=3, device=CUDA).reshape(n)
        fused = pg.mm(a, w.t(), bias=bias)
        acc = pg.mm(a, w.t(), out_dtype=torch.float32)  # may run another kernel: other sum order
        by_hand = (acc + bias.float()).bfloat16()
        # Each rounds an fp32 sum once; the sums differ by fp32 reassociation only, so the results
        # are one bf16 ulp apart at most, measured on the terms' size (acc + bias may cancel).
        diff = (fused.float() - by_hand.float()).abs()
        assert (diff <= (acc.abs() + bias.float().abs()) * 2**-7 + 1e-6).all()


def test_addmm_on_gpu_matches_torch():
    a = operand(300, 256, torch.bfloat16, seed=5, device=CUDA)
    b = operand(256, 384, torch.bfloat16, False, seed=6, device=CUDA)
    for inp in (randn(1, 384, torch.bfloat16, 7, CUDA).reshape(384), randn(300, 384, torch.bfloat16, 8, CUDA)):
        out = pg.addmm(inp, a, b, beta=0.5, alpha=2.0)
        want = 0.5 * inp.double() + 2.0 * (a.double() @ b.double())
        peer = torch.addmm(inp, a, b, beta=0.5, alpha=2.0)
        assert rel_err(out, want) <= error_bound(rel_err(peer, want), 1e-5)


def test_scaled_mm_bias_matches_torch_scaled_mm_bias():
    """torch._scaled_mm takes a bias too (bf16 out): same inputs, same bound rule."""
    m, n, k = 64, 512, 1024
    a, b = fp8_pair(m, n, k, seed=9, device=CUDA)
    sa, sb = fp32_scales(m, n, False, seed=10, device=CUDA)
    bias = randn(1, n, torch.bfloat16, 11, CUDA).reshape(n)
    ours = pg.scaled_mm(a, b, sa, sb, bias=bias)
    theirs = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    want = reference("scaled_mm", (a, b, sa, sb)) + bias.double()
    assert rel_err(ours, want) <= error_bound(rel_err(theirs, want), 5 * FP8_FLOOR)
    assert a.dtype == E4M3
