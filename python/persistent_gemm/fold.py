"""The exact-fold window of an MXFP4 weight: which (16-row strip, 32-K block) pairs can carry their
block scales inside e4m3, for the FP8 x FP4 fold route (``route="fold"`` configs,
collective/sm90_mx_block_scaled_mma.hpp with MxOperandE2m1Fold).

An e2m1 value times 2^j is exactly an e4m3 value for every j in FOLD_WINDOW = [-8, +6]:
6 * 2^6 = 384 <= 448 at the top, 0.5 * 2^-8 = 2^-9 (e4m3's smallest subnormal) at the bottom,
and e2m1's two significant bits fit e4m3's subnormals from 2^-9 on. The fold route converts a
warp's A fragment -- 16 weight rows (a strip) of one 32-K block -- with one reference exponent
R = max over the strip's nonzero rows of e_row - 6, turning every row's block into e4m3 codes of
e2m1 * 2^(e_row - R) with no rounding, and applies 2^R together with the activation's block scale
in the per-block promotion it already does (one FFMA per accumulator element). A (strip, block)
whose rows' exponents span more than 14 (or that holds a NaN scale on a nonzero block, which no
e4m3 code can carry) is out of the window: the fold route must not re-quantize it -- the weight
takes the kernel's plain path for that strip and block (per-row promotion, as the promotion
route does), so every weight stays exact and only the speed depends on the window.

The kernel decides per (strip, block) from the scale codes alone -- it cannot see which blocks
are all zeros -- so :func:`kernel_folds` is its rule: the strip's codes (all 16 rows, tail rows
padded with code 127 as the blocked layout pads them) span at most 14 and none is NaN. It folds
a subset of :func:`fold_plan`'s window (equal when no block is all zeros and N % 16 == 0).

    from persistent_gemm.fold import fold_plan
    plan = fold_plan(wq, ws)          # the (N, K/2) e2m1 weight and its (N, K/32) scales
    plan.foldable, plan.blocks_out_of_window, plan.ref_exponent.shape   # (ceil(N/16), K/32)

Blocks whose e2m1 codes are all +-0 contribute nothing and are left out of a strip's span (their
scale is arbitrary in quantize_mxfp4's output for all-zero blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quant import MX_BLOCK
from .scale_layout import _PAD_CODE

__all__ = ["FOLD_WINDOW", "STRIP_ROWS", "FoldPlan", "fold_plan", "kernel_folds"]

#: Shifts j for which every e2m1 value times 2^j is exactly representable in e4m3.
FOLD_WINDOW = (-8, 6)
#: Weight rows sharing one reference exponent per block: one warp's rows of the A fragment
#: (m16 of mma.sync, a warp's 16 of wgmma's 64).
STRIP_ROWS = 16
_E8M0_BIAS = 127
_E8M0_NAN = 255


@dataclass(frozen=True)
class FoldPlan:
    """Per (16-row strip, 32-K block): the reference exponent and whether the strip's rows fit
    the window there. All three are (ceil(N/16), blocks) int32 / bool.

    ``ref_exponent``: R (0 where the strip's block is all zeros); ``in_window``; ``span``: max - min
    of the nonzero rows' exponents (0 for at most one; -1 where a nonzero block has a NaN scale)."""

    ref_exponent: torch.Tensor
    in_window: torch.Tensor
    span: torch.Tensor

    @property
    def foldable(self) -> bool:
        """Every (strip, block) fits: the fold route may serve this weight exactly."""
        return bool(self.in_window.all())

    @property
    def blocks_out_of_window(self) -> int:
        return int((~self.in_window).sum())

    def shifts(self, scale: torch.Tensor) -> torch.Tensor:
        """(N, blocks) int32: j = e - R per row and block, the exponent the conversion adds
        (inside FOLD_WINDOW for every nonzero block of an in-window strip)."""
        e = scale.view(torch.uint8).to(torch.int32) - _E8M0_BIAS
        return e - self.ref_exponent.repeat_interleave(STRIP_ROWS, dim=0)[: e.shape[0]]

    def row_ref_exponent(self, n: int) -> torch.Tensor:
        """(N, blocks) int32: each row's strip reference, the factor 2^R a row's block carries."""
        return self.ref_exponent.repeat_interleave(STRIP_ROWS, dim=0)[:n]


def _check(wq: torch.Tensor, ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(wq, torch.Tensor) or wq.dtype not in (torch.float4_e2m1fn_x2, torch.uint8):
        raise TypeError(f"wq must be the packed e2m1 weight (torch.float4_e2m1fn_x2 or uint8), got "
                        f"{getattr(wq, 'dtype', type(wq).__name__)}")
    if not isinstance(ws, torch.Tensor) or ws.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"ws must be the e8m0 block scales (torch.float8_e8m0fnu or uint8), got "
                        f"{getattr(ws, 'dtype', type(ws).__name__)}")
    if wq.dim() != 2 or ws.dim() != 2:
        raise ValueError(f"wq and ws must be 2-D (N, K/2) and (N, K/32), got {tuple(wq.shape)} and {tuple(ws.shape)}")
    if wq.device != ws.device or wq.device.type == "meta":
        raise ValueError(f"wq and ws must be materialised on one device, got {wq.device} and {ws.device}")
    n, half_k = wq.shape
    blocks = -(-2 * half_k // MX_BLOCK)
    if ws.shape != (n, blocks):
        raise ValueError(f"ws must be (N, ceil(K/32)) = ({n}, {blocks}) for wq {tuple(wq.shape)}, got {tuple(ws.shape)}")
    return wq.view(torch.uint8), ws.view(torch.uint8)


def fold_plan(wq: torch.Tensor, ws: torch.Tensor) -> FoldPlan:
    """The fold window of a plain MXFP4 weight (``quantize_mxfp4``'s (N, K/2) and (N, K/32)).

    Raises TypeError for other dtypes, ValueError for shapes that do not belong together or
    tensors on the meta device / on two devices."""
    codes, scale = _check(wq, ws)
    n, half_k = codes.shape
    blocks = scale.shape[1]
    # A block is nonzero if any of its codes has a nonzero magnitude (-0 is code 8).
    mag = (codes & 0x77) != 0
    pad = blocks * (MX_BLOCK // 2) - half_k
    if pad:
        mag = torch.nn.functional.pad(mag, (0, pad))
    nonzero = mag.view(n, blocks, MX_BLOCK // 2).any(dim=2)
    e = scale.to(torch.int32) - _E8M0_BIAS
    nan = (scale == _E8M0_NAN) & nonzero
    # Pad N to whole strips with all-zero rows (they contribute nothing), then reduce per strip.
    strips = -(-n // STRIP_ROWS)
    rpad = strips * STRIP_ROWS - n
    if rpad:
        nonzero = torch.nn.functional.pad(nonzero, (0, 0, 0, rpad))
        e = torch.nn.functional.pad(e, (0, 0, 0, rpad))
        nan = torch.nn.functional.pad(nan, (0, 0, 0, rpad))
    nonzero = nonzero.view(strips, STRIP_ROWS, blocks)
    e = e.view(strips, STRIP_ROWS, blocks)
    big, small = torch.iinfo(torch.int32).max, torch.iinfo(torch.int32).min
    hi = torch.where(nonzero, e, torch.full_like(e, small)).amax(dim=1)
    lo = torch.where(nonzero, e, torch.full_like(e, big)).amin(dim=1)
    any_nonzero = nonzero.any(dim=1)
    span = torch.where(any_nonzero, hi - lo, torch.zeros_like(hi))
    ref = torch.where(any_nonzero, hi - FOLD_WINDOW[1], torch.zeros_like(hi))
    has_nan = nan.view(strips, STRIP_ROWS, blocks).any(dim=1)
    span = torch.where(has_nan, torch.full_like(span, -1), span)
    in_window = ~has_nan & (span <= FOLD_WINDOW[1] - FOLD_WINDOW[0])
    return FoldPlan(ref_exponent=ref.to(torch.int32), in_window=in_window, span=span.to(torch.int32))


def kernel_folds(ws: torch.Tensor) -> torch.Tensor:
    """(ceil(N/16), blocks) bool: the (strip, block) pairs the fold-route kernel converts with
    their scale folded, from plain (N, ceil(K/32)) e8m0 scales -- the kernel's rule (module
    docstring), which python mirrors here for explain and tests. The others run the kernel's
    plain per-row path, exact as well."""
    if not isinstance(ws, torch.Tensor) or ws.dtype not in (torch.float8_e8m0fnu, torch.uint8) or ws.dim() != 2:
        raise TypeError(f"ws must be 2-D e8m0 block scales (torch.float8_e8m0fnu or uint8), got "
                        f"{getattr(ws, 'dtype', type(ws).__name__)} {tuple(getattr(ws, 'shape', ()))}")
    codes = ws.view(torch.uint8).to(torch.int32)
    n, blocks = codes.shape
    strips = -(-n // STRIP_ROWS)
    if strips * STRIP_ROWS != n:  # the blocked layout's padding rows
        codes = torch.nn.functional.pad(codes, (0, 0, 0, strips * STRIP_ROWS - n), value=_PAD_CODE)
    codes = codes.view(strips, STRIP_ROWS, blocks)
    hi, lo = codes.amax(dim=1), codes.amin(dim=1)
    return (hi != _E8M0_NAN) & (hi - lo <= FOLD_WINDOW[1] - FOLD_WINDOW[0])
