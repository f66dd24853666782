"""Error measures against float64 and the peer-tied bounds (torch on the same inputs)."""

from __future__ import annotations

import math

from typing import Optional

import torch



# -- error measures -------------------------------------------------------------------------------
def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``out`` against the float64 ``ref``."""
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


#: Default floor of :func:`error_bound`: fp32 accumulations summing in different orders differ
#: by ~1e-7 at our K; a result that went through bf16 is off by ~1e-3.
FLOOR = 1e-6
#: Floor for FP8 with promoted accumulation: the tensor core's FP8 partial sums carry ~2^-13
#: relative error before each promotion (~1.3e-4 measured on an H200, ours and torch's).
FP8_FLOOR = 1e-4


def error_bound(peer_err: float, floor: float = FLOOR) -> float:
    """The FlashAttention-3 tolerance: ours must be within 2x the peer's error against the
    same float64 reference, plus ``floor`` for where the peer happens to be exact."""
    return 2.0 * peer_err + floor


def rounding_err(ref: torch.Tensor, out_dtype: torch.dtype) -> float:
    """The error of the float64 ``ref`` correctly rounded to ``out_dtype``: the least any
    implementation returning ``out_dtype`` can have. The CPU suite's peer."""
    rounded = ref.to(out_dtype)
    # An overflow would make the bound inf and every answer pass: that is a bad test input.
    assert torch.isfinite(rounded).all(), f"the reference overflows {out_dtype}: pick smaller inputs"
    return rel_err(rounded, ref)


def fp8_accum_floor(k: int, fast_accum: bool) -> float:
    """Accumulation error allowed an FP8 GEMM of depth ``k`` beyond the output rounding.
    Promoted: flat in K (chunks are fp32-summed), a few FP8_FLOOR. Fast: one reduced-precision
    accumulator over all of K, growing like sqrt(K) (H200: 2.1e-3 at K = 8192, 4.4e-3 at
    28672, ~2.5e-5 sqrt(K)); allow 2x that."""
    return 5e-5 * math.sqrt(max(k, 1)) if fast_accum else 5 * FP8_FLOOR


# -- peers: torch on the same inputs --------------------------------------------------------------
def torch_mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """torch.mm with the same output dtype: the peer of ``pg.mm``."""
    if out_dtype == a.dtype:
        return torch.mm(a, b)
    try:  # the mm.dtype overload (bf16/fp16 in, fp32 out, same tensor-core accumulation)
        c = torch.mm(a, b, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        c = torch.mm(a.float(), b.float())
    return c.to(out_dtype)


def _pad_to(x: torch.Tensor, rows: int, cols: int, fill: float = 0.0) -> torch.Tensor:
    """``x`` (row-major result) zero- (or ``fill``-) padded to (rows, cols); fp8 through bytes."""
    if x.shape == (rows, cols):
        return x
    if x.element_size() == 1 and x.dtype != torch.uint8:
        return _pad_to(x.view(torch.uint8), rows, cols).view(x.dtype)
    out = x.new_full((rows, cols), fill)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def torch_scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum) -> Optional[torch.Tensor]:
    """torch._scaled_mm on the same product (``pg.scaled_mm``'s peer), or None where torch
    cannot compute it. torch wants K and N multiples of 16: operands are zero-padded, which
    changes nothing (zero products add nothing; the padding is sliced off). Where torch refuses
    rowwise scales for out_dtype, it runs with unit scales in fp32 and the rowwise scales are
    applied after, as our epilogue does."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    mp, kp, np_ = (-(-x // 16) * 16 for x in (m, k, n))
    ap = _pad_to(a, mp, kp)
    bp = _pad_to(b.t(), np_, kp).t()  # column-major stays column-major
    rowwise = scale_a.numel() != 1 or scale_b.numel() != 1
    sa = _pad_to(scale_a, mp, 1, 1.0) if rowwise else scale_a
    sb = _pad_to(scale_b, 1, np_, 1.0) if rowwise else scale_b
    try:
        return torch._scaled_mm(ap, bp, sa, sb, out_dtype=out_dtype, use_fast_accum=use_fast_accum)[:m, :n]
    except (RuntimeError, NotImplementedError):
        if not rowwise:
            return None
    one = torch.ones((), device=a.device)
    try:
        acc = torch._scaled_mm(ap, bp, one, one, out_dtype=torch.float32, use_fast_accum=use_fast_accum)
    except (RuntimeError, NotImplementedError):
        return None
    return (acc * sa * sb)[:m, :n].to(out_dtype)


def scaled_mm_bound(ref, a, b, scale_a, scale_b, out_dtype, use_fast_accum) -> float:
    """error_bound of torch._scaled_mm's error in the same accumulation mode; where torch has
    no answer, of the output rounding (no kernel does better) plus fp8_accum_floor."""
    peer = torch_scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    if peer is None:
        return error_bound(rounding_err(ref, out_dtype), fp8_accum_floor(a.shape[1], use_fast_accum))
    # Fast accumulation's error depends on how the K loop is cut: cuBLAS may split K over CTAs
    # on small grids (each part accumulating less), our persistent kernels never do. So its
    # floor is the error expected of one unsplit K loop, not the promoted one.
    floor = fp8_accum_floor(a.shape[1], True) if use_fast_accum else FP8_FLOOR
    return error_bound(rel_err(peer, ref), floor)


def check_mm(out, a, b, out_dtype=None):
    """``out`` = a @ b in out_dtype, no NaN, within error_bound of torch.mm's error."""
    out_dtype = out_dtype or a.dtype
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == out_dtype
    assert not out.isnan().any(), "NaN in the output: a tile was never written"
    ref = a.double() @ b.double()
    err, bound = rel_err(out, ref), error_bound(rel_err(torch_mm(a, b, out_dtype), ref))
    assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g}"


def check_scaled_mm(out, a, b, scale_a, scale_b, out_dtype=torch.bfloat16, use_fast_accum=False):
    """``out`` = (scale_a a) @ (scale_b b), no NaN, within scaled_mm_bound."""
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == out_dtype
    assert not out.isnan().any(), "NaN in the output: a tile was never written"
    ref = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    err = rel_err(out, ref)
    bound = scaled_mm_bound(ref, a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    assert err <= bound, f"rel err {err:.3g} > bound {bound:.3g}"
