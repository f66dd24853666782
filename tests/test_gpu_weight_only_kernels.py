"""The weight-only MX kernels on a GPU (issue 24): bf16 activations x an MXFP8 or MXFP4 prepared
weight, ``pg.mm(x, prepared_weight)``: the decode GEMV (M <= 64 tokens) and the bf16 route
(prefill). Every test first asks the dispatcher which kernel runs (not the reference), then
holds its NaN-poisoned output to float64 with the bound of the suite: within 2x the error of
torch's own bf16 GEMM on the same (exactly dequantized) weight, plus a small floor."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    E8M0,
    built_configs,
    e8m0_scales,
    error_bound,
    mx_blocks,
    poisoned,
    randn,
    rel_err,
    rounding_err,
)

import persistent_gemm as pg

pytestmark = [pytest.mark.gpu]

CUDA = "cuda"
#: fmt -> (dtype family of its kernels, quantizer, exact dequantizer)
FMTS = {
    "mxfp8": ("bf16xe4m3", pg.quantize_mxfp8, pg.dequantize_mxfp8),
    "fp4": ("bf16xe2m1", pg.quantize_mxfp4, pg.dequantize_mxfp4),
}


def _problem(fmt, m, n, k, seed=0, center=127, spread=20):
    """(x, prepared weight, the weight dequantized exactly as fp64, the fp64 product)."""
    _, quantize, dequantize = FMTS[fmt]
    wq, _ = quantize(randn(n, k, torch.float32, seed=seed + n, device=CUDA))
    ws = e8m0_scales(n, mx_blocks(k), seed=seed + k, device=CUDA, center=center, spread=spread)
    w = dequantize(wq, ws).double()
    x = randn(m, k, torch.bfloat16, seed=seed + m, device=CUDA)
    return x, pg.prepare_weight(wq, ws, fmt=fmt), w, x.double() @ w.t()


def _kernel_runs(fmt, m, n, k, out="bf16"):
    """The dispatcher's pick for this problem is a weight-only kernel, not the reference."""
    config = pg.explain(m, n, k, dtype=FMTS[fmt][0], out_dtype=out).config
    assert FMTS[fmt][0] in config and ("_gemv_" in config or "_bf16route" in config), config
    return config


def _gemv(fmt, m):
    """The decode GEMV of the smallest token tile holding m tokens."""
    t = next(t for t in (8, 16, 32, 64) if t >= m)
    return f"sm90a_{FMTS[fmt][0]}_128x{t}x{512 if fmt == 'fp4' else 256}_c1x1_sw1_row_gemv_swapab"


def _check_against_torch(fmt, m, n, k, seed=0, config=None):
    x, pw, w, ref = _problem(fmt, m, n, k, seed=seed)
    out = poisoned(lambda: pg.mm(x, pw, config=config), m, n, torch.bfloat16)
    # torch's peer: its bf16 GEMM on the weight in bf16 (exact: codes within 2^+-20 of 1).
    wb = w.to(torch.bfloat16)
    assert torch.equal(wb.double(), w), "the peer's weight must be exact in bf16"
    peer = rel_err(x @ wb.t(), ref)
    err, bound = rel_err(out, ref), error_bound(max(peer, rounding_err(ref, torch.bfloat16)))
    assert err <= bound, f"{fmt} {m}x{n}x{k}: rel err {err:.3g} > {bound:.3g} (torch {peer:.3g})"


@pytest.mark.parametrize("fmt", sorted(FMTS))
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 32, 33, 64])
@pytest.mark.parametrize("n,k", [(300, 992), (4096, 4096), (129, 2080)])
def test_gemv_matches_float64(fmt, m, n, k):
    _kernel_runs(fmt, m, n, k)
    _check_against_torch(fmt, m, n, k, config=_gemv(fmt, m))


@pytest.mark.parametrize("fmt", sorted(FMTS))
@pytest.mark.parametrize("m,n,k", [(65, 300, 992), (200, 4096, 4096), (1024, 1000, 2080), (2048, 2048, 2048)])
def test_bf16_route_matches_float64(fmt, m, n, k):
    assert "_bf16route" in _kernel_runs(fmt, m, n, k)
    _check_against_torch(fmt, m, n, k, seed=1)


@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_bf16_route_forced_at_decode_and_unaligned_activations(fmt):
    """The route forced at M = 3, and activations whose rows are not 16-byte aligned (the
    pre-pass reads them with plain loads, element by element)."""
    family = FMTS[fmt][0]
    cfg = f"sm90a_{family}_64x128x64_c1x1_sw8_row_pp_swapab_bf16route"
    x, pw, w, ref = _problem(fmt, 3, 384, 1056, seed=3)
    out = poisoned(lambda: pg.mm(x, pw, config=cfg), 3, 384, torch.bfloat16)
    assert rel_err(out, ref) <= error_bound(rounding_err(ref, torch.bfloat16))
    wide = randn(7, 1056 + 1, torch.bfloat16, seed=4, device=CUDA)
    xo = wide[:, 1:]  # rows 2 * 1057 bytes apart, base 2 bytes off
    ref_o = xo.double() @ w.t()
    out = poisoned(lambda: pg.mm(xo, pw, config=cfg), 7, 384, torch.bfloat16)
    assert rel_err(out, ref_o) <= error_bound(rounding_err(ref_o, torch.bfloat16))


@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_gemv_wide_scales_fp32_out_and_bias(fmt):
    """e8m0 codes 4 .. 236 (2^-123 .. 2^109) in one row, fp32 out (nothing rounds but the sums), a bias."""
    m, n, k = 5, 257, 1024
    x, pw, w, ref = _problem(fmt, m, n, k, seed=7, center=4 + 116, spread=116)
    bias = randn(1, n, torch.float32, seed=3, device=CUDA)[0]
    ref = ref + bias.double()
    assert torch.isfinite(ref.float()).all()
    out = poisoned(lambda: pg.mm(x, pw, out_dtype=torch.float32, bias=bias, config=_gemv(fmt, m)), m, n,
                   torch.float32)
    err = rel_err(out, ref)
    assert err <= 1e-6, f"rel err {err:.3g}: fp32 sums of exact products should be ~1e-7"


@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_gemv_every_code(fmt):
    """Every weight code (e4m3: all 254 finite bytes but zero; e2m1: all 15 nonzero nibbles,
    0.5 -- a bf16 subnormal after bit placement -- included) at every K position of a block."""
    n, k = 128, 512
    if fmt == "mxfp8":
        codes = torch.arange(1, 255, dtype=torch.int64)
        codes = codes[(codes & 0x7F) != 0x7F]  # NaN bytes
        vals = codes.repeat(n * k // codes.numel() + 1)[: n * k].reshape(n, k)
        wq = vals.to(torch.uint8).view(torch.float8_e4m3fn).to(CUDA)
    else:
        nib = torch.tensor([c for c in range(16) if c not in (0, 8)], dtype=torch.int64)
        vals = nib.repeat(n * k // nib.numel() + 1)[: n * k].reshape(n, k)
        packed = (vals[:, 0::2] | (vals[:, 1::2] << 4)).to(torch.uint8)
        wq = packed.view(torch.float4_e2m1fn_x2).to(CUDA)
    ws = e8m0_scales(n, mx_blocks(k), seed=11, device=CUDA)
    _, _, dequantize = FMTS[fmt]
    w = dequantize(wq, ws).double()
    for m in (1, 8, 40):
        x = randn(m, k, torch.bfloat16, seed=m, device=CUDA)
        pw = pg.prepare_weight(wq, ws, fmt=fmt)
        out = poisoned(lambda: pg.mm(x, pw, out_dtype=torch.float32, config=_gemv(fmt, m)), m, n, torch.float32)
        err = rel_err(out, x.double() @ w.t())
        assert err <= 1e-6, f"m={m}: rel err {err:.3g}"


@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_gemv_nan_scale_poisons_its_row_only(fmt):
    m, n, k = 4, 384, 512
    _, quantize, _ = FMTS[fmt]
    wq, _ = quantize(randn(n, k, torch.float32, seed=9, device=CUDA))
    scales = e8m0_scales(n, mx_blocks(k), seed=9, device=CUDA).view(torch.uint8).clone()
    scales[200, 3] = 255  # NaN: output column 200, every token
    pw = pg.prepare_weight(wq, scales.view(E8M0), fmt=fmt)
    x = randn(m, k, torch.bfloat16, seed=4, device=CUDA)
    out = pg.mm(x, pw, config=_gemv(fmt, m)).float()
    assert torch.isnan(out[:, 200]).all()
    keep = torch.ones(n, dtype=torch.bool, device=CUDA)
    keep[200] = False
    assert torch.isfinite(out[:, keep]).all()


@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_gemv_is_deterministic_and_graph_capturable(fmt):
    m, n, k = 8, 8192, 4096  # many strips shared by CTAs: the fixed-order reduction runs
    x, pw, _, _ = _problem(fmt, m, n, k, seed=2)
    first = pg.mm(x, pw, config=_gemv(fmt, m))
    for _ in range(3):
        assert torch.equal(pg.mm(x, pw, config=_gemv(fmt, m)), first)
    g = torch.cuda.CUDAGraph()
    static_out = None
    with torch.cuda.graph(g):
        static_out = pg.mm(x, pw, config=_gemv(fmt, m))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, first)


def test_fp16_runs_the_reference():
    """No kernel takes fp16 activations (bf16 cannot hold them exactly): the reference runs."""
    xh, pwh, wh, _ = _problem("fp4", 8, 256, 512, center=119, spread=4)  # fp16's range
    xh = xh.to(torch.float16)
    ref_h = xh.double() @ wh.t()
    out = pg.mm(xh, pwh)
    assert out.dtype == torch.float16
    assert rel_err(out, ref_h) <= error_bound(rounding_err(ref_h, torch.float16))


def test_forced_config_names_its_limit():
    x, pw, _, _ = _problem("mxfp8", 20, 256, 512)
    with pytest.raises(ValueError, match="exceeds its 16 tokens"):
        pg.mm(x, pw, config="sm90a_bf16xe4m3_128x16x256_c1x1_sw1_row_gemv_swapab")


# Each weight-only bf16-route tile is one CUTLASS kernel type with the MX op's route tile of the
# same weight format (the activations differ only in the pre-pass), built in another
# translation unit with its own __global__ entry. A once-per-type shared-memory opt-in let
# whichever of the two launched second fail with "invalid argument" (a full GPU run met it:
# test_gpu_mx_route ran first). Every pair runs in both orders, each order in a fresh process;
# each kernel's result must not depend on the order.
MX_TWIN = {"mxfp8": ("mxfp8_mm", "mxfp8"), "fp4": ("fp8_fp4_mm", "e4m3xe2m1")}
_ORDER_CHILD = r"""
import sys, torch
import persistent_gemm as pg
tests, fmt, mx_op, order, out_path, *pairs = sys.argv[1:]
sys.path.insert(0, tests)
from conftest import randn
from mx_helpers import mx_call, mx_operands

quantize = pg.quantize_mxfp8 if fmt == "mxfp8" else pg.quantize_mxfp4
wq, ws = quantize(randn(384, 1024, torch.float32, seed=1, device="cuda"))
pw = pg.prepare_weight(wq, ws, fmt=fmt)
x = randn(200, 1024, torch.bfloat16, seed=2, device="cuda")
mx_args = mx_operands(mx_op, 200, 384, 1024, seed=3)
outs = {}
for pair in pairs:
    wo_cfg, mx_cfg = pair.split(",")
    calls = {wo_cfg: lambda: pg.mm(x, pw, config=wo_cfg),
             mx_cfg: lambda: mx_call(mx_op, mx_args, out_dtype=torch.bfloat16, config=mx_cfg)}
    for name in (calls if order == "weight_only_first" else reversed(list(calls))):
        outs[name] = calls[name]().cpu()
torch.cuda.synchronize()
torch.save(outs, out_path)
"""


@pytest.mark.parametrize("fmt", sorted(FMTS))
def test_bf16_route_twins_launch_in_either_order(fmt, tmp_path):
    family = FMTS[fmt][0]
    mx_op, mx_family = MX_TWIN[fmt]
    mx_built = set(built_configs(mx_family, arch="sm90a"))
    pairs = [(wo, mx) for wo in built_configs(family, arch="sm90a") if wo.endswith("_bf16route")
             for mx in [wo.replace(f"_{family}_", f"_{mx_family}_", 1)] if mx in mx_built]
    if not pairs:
        pytest.skip(f"no {family} bf16-route config is built together with its {mx_family} twin")
    results = {}
    for order in ("weight_only_first", "mx_first"):
        path = tmp_path / f"{order}.pt"
        argv = [sys.executable, "-c", _ORDER_CHILD, str(Path(__file__).parent), fmt, mx_op, order, str(path),
                *(f"{wo},{mx}" for wo, mx in pairs)]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{order}: {run.stderr[-3000:]}"
        results[order] = torch.load(path)
    for name, first in results["weight_only_first"].items():
        assert torch.isfinite(first.float()).all(), name
        assert torch.equal(first, results["mx_first"][name]), f"{name}: its result depends on which twin ran first"
