"""MX helpers of the GPU suites (test_gpu_mx.py, test_gpu_ops.py): which MX kernels the build
holds, operands under either scale layout, the emulation peer and the MX error check.

The peer of an MX op is its emulation: both operands dequantized to fp32 exactly (the Python
dequantizers), ``torch.mm`` in fp32 with TF32 off, rounded once to the output dtype -- the op's
stated semantics computed by cuBLAS. Ours must be within ``error_bound`` of its error against
the float64 reference, the floor being what FP8 tensor-core sums may add (``MX_FLOOR``).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from conftest import (
    call_args,
    ARCH,
    built_configs,
    e8m0_scales,
    error_bound,
    fp8_accum_floor,
    fp8_fp4_operands,
    mx_blocks,
    mxfp8_operands,
    reference,
    rel_err,
)

import persistent_gemm as pg

MX_OPS = ("mxfp8_mm", "fp8_fp4_mm")
MX_FAMILY = {"mxfp8_mm": "mxfp8", "fp8_fp4_mm": "e4m3xe2m1"}
#: Accumulation error an SM90 MX kernel may add beyond the output rounding: FP8 wgmma sums of
#: each 32-deep block carry ~2^-13 relative error before the fp32 promotion (flat in K).
MX_FLOOR = fp8_accum_floor(0, fast_accum=False)
#: name -> (scale_layout, scale_b_layout) of the call; "mixed": a plain, b blocked.
LAYOUTS = {"plain": ("plain", None), "blocked": ("blocked", None), "mixed": ("plain", "blocked"),
           "mixed_rev": ("blocked", "plain")}


def mx_configs(op: str) -> list[str]:
    """Built configs of this device's arch serving ``op`` (``[]`` without the extension)."""
    return built_configs(MX_FAMILY[op], arch=ARCH)


def gemv_tokens(name: str) -> int:
    """Tokens of an MX decode GEMV config (its tile_n), 0 for any other config."""
    from persistent_gemm.catalogue import KernelConfig

    cfg = KernelConfig.from_name(name)
    return cfg.tile[1] if cfg.kernel == "gemv" else 0


def forced_fits(name: str, m: int, k: int) -> bool:
    """Whether a forced ``name`` can serve M x K: the decode GEMVs take M <= their tokens and
    whole 1x32 blocks (K % 32 == 0); every other MX config any shape."""
    t = gemv_tokens(name)
    return not t or (m <= t and k % 32 == 0)


def mx_built(op: str) -> bool:
    return bool(mx_configs(op))


def mx_operands(op: str, m: int, n: int, k: int, seed: int = 0, device="cuda", scales=(127, 20),
                b_scales: Optional[tuple] = None):
    """(a, scale_a, b, scale_b) of ``op`` with plain scales: random data, wide-range random e8m0
    codes ``scales = (center, spread)`` (both extremes in every row); ``b_scales`` gives b its own
    range."""
    factory = mxfp8_operands if op == "mxfp8_mm" else fp8_fp4_operands
    a, sa, b, sb = factory(m, n, k, seed, device, *scales)
    if b_scales is not None:
        sb = e8m0_scales(n, mx_blocks(k), seed + 3, device, *b_scales)
    return a, sa, b, sb


def quantized_operands(op: str, m: int, n: int, k: int, seed: int = 0, device="cuda"):
    """(a, scale_a, b, scale_b) from the quantizers on randn data (a realistic spread)."""
    x = torch.randn(m, k, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    w = torch.randn(n, k, generator=torch.Generator(device=device).manual_seed(seed + 1), device=device)
    xq, xs = pg.quantize_mxfp8(x)
    wq, ws = (pg.quantize_mxfp8 if op == "mxfp8_mm" else pg.quantize_mxfp4)(w)
    return xq, xs, wq.t(), ws


def with_layout(args, layout: str):
    """The call's (a, scale_a, b, scale_b) and layout kwargs for plain-scaled ``args``."""
    a, sa, b, sb = args
    sl, bsl = LAYOUTS[layout]
    a_s = pg.to_blocked(sa) if sl == "blocked" else sa
    b_s = pg.to_blocked(sb) if (bsl or sl) == "blocked" else sb
    kw = {"scale_layout": sl}
    if bsl is not None:
        kw["scale_b_layout"] = bsl
    return (a, a_s, b, b_s), kw


def mx_call(op: str, args, **kwargs) -> torch.Tensor:
    return getattr(pg, op)(*call_args(op, args), **kwargs)


@contextlib.contextmanager
def fp32_matmul_exact():
    """TF32 off for torch.mm in fp32 (restored after)."""
    tf32, prec = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.set_float32_matmul_precision(prec)


def emulation(op: str, args, out_dtype: torch.dtype) -> torch.Tensor:
    """The peer: exact fp32 dequantization of both operands, fp32 torch.mm (no TF32), one
    rounding to ``out_dtype``. ``args`` carry plain scales."""
    a, sa, b, sb = args
    da = pg.dequantize_mxfp8(a, sa)
    db = (pg.dequantize_mxfp8 if op == "mxfp8_mm" else pg.dequantize_mxfp4)(b.t(), sb)  # (N, K)
    with fp32_matmul_exact():
        return torch.mm(da, db.t()).to(out_dtype)


def check_mx(op: str, out: torch.Tensor, args, out_dtype: torch.dtype, floor: float = MX_FLOOR,
             ref: Optional[torch.Tensor] = None) -> float:
    """``out`` is ``op(*args)`` in ``out_dtype``, has no NaN (poisoned tiles) and is within
    error_bound of the emulation's error against float64. Returns our error."""
    m, n = args[0].shape[0], args[2].shape[1]
    assert out.shape == (m, n) and out.dtype == out_dtype, (out.shape, out.dtype)
    assert not out.isnan().any(), "NaN in the output: a tile was never written"
    ref = reference(op, args) if ref is None else ref
    peer = emulation(op, args, out_dtype)
    assert torch.isfinite(peer).all(), f"the emulation overflows {out_dtype}: pick smaller inputs"
    err, peer_err = rel_err(out, ref), rel_err(peer, ref)
    bound = error_bound(peer_err, floor)
    assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g} (emulation {peer_err:.3g})"
    return err
