"""Weights prepared once for the MX ops, so serving does not pay their re-layout per call.

The SM90 MX kernels read e8m0 scales in the blocked layout (128-row x 4-block atoms, one
512-byte bulk copy per tile and K-tile) and weights K-major with 16-byte aligned rows: the
prefill kernels by TMA tiles, the decode GEMV by 256-byte row chunks of 128-row strips (whose
scale rows are exactly one atom row), so one prepared layout serves every M.
:func:`prepare_weight` does both conversions once: the scales are relaid out, the data is at
most copied to aligned rows. Both stay in MX form -- e4m3 or packed e2m1 bytes and e8m0
scales, the bytes the kernel streams -- nothing is dequantized; the kernels convert operands
in registers or shared memory, inside the GEMM.

    wq, ws = pg.quantize_mxfp4(w)                 # w (N, K)
    pw = pg.prepare_weight(wq, ws, fmt="fp4")     # once, at load time
    y = pg.fp8_fp4_mm(xq, pw, xs)                 # per call: only the activations' scales relaid
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .quant import MX_BLOCK
from .scale_layout import blocked_shape, check_scale_layout, from_blocked, to_blocked

if TYPE_CHECKING:
    from .fold import FoldPlan

__all__ = ["FORMATS", "PreparedWeight", "prepare_weight", "from_mxfp4_blocks"]

#: fmt -> (weight dtype, data bytes per K element, the op that takes it)
FORMATS = {
    "mxfp8": (torch.float8_e4m3fn, 1.0, "mxfp8_mm"),
    "fp4": (torch.float4_e2m1fn_x2, 0.5, "fp8_fp4_mm"),
}

#: The other names of a format in the library (its pg.nn format, its dtype family, its quantizer).
FORMAT_ALIASES = {"mxfp4": "fp4", "fp8_fp4": "fp4", "e4m3xe2m1": "fp4"}


@dataclass(frozen=True)
class PreparedWeight:
    """A weight ready for :func:`mxfp8_mm` (``fmt="mxfp8"``) or :func:`fp8_fp4_mm` (``"fp4"``):
    pass it as ``b`` and leave ``scale_b`` out.

    ``b`` is the (K, N) column-major operand view (for fp4: (K/2, N) packed pairs), ``scale_b``
    its e8m0 scales in ``scale_b_layout`` ("blocked"), ``n``/``k`` the logical extents."""

    b: torch.Tensor
    scale_b: torch.Tensor
    fmt: str
    n: int
    k: int
    scale_b_layout: str = "blocked"

    def __repr__(self) -> str:  # the packed bytes are not worth printing
        return (f"PreparedWeight(fmt={self.fmt!r}, n={self.n}, k={self.k}, b={tuple(self.b.shape)} {self.b.dtype}, "
                f"scale_b={self.scale_b.numel()} e8m0 {self.scale_b_layout}, device={self.b.device})")

    @property
    def nbytes(self) -> int:
        """Bytes a GEMM streams for this weight: data plus scales."""
        return self.b.untyped_storage().nbytes() + self.scale_b.numel()

    def dequantize(self) -> torch.Tensor:
        """The weight's values, (N, K) float32, read from the prepared layout (the bytes the
        kernels stream): equal bit for bit to dequantizing the (wq, ws) it was prepared from."""
        from .quant import dequantize_mxfp4, dequantize_mxfp8

        wq, ws = self._plain()
        return dequantize_mxfp8(wq, ws) if self.fmt == "mxfp8" else dequantize_mxfp4(wq, ws)

    def fold_plan(self) -> "FoldPlan":
        """fmt="fp4": the exact-fold window of each (16-row strip, block) (persistent_gemm.fold), read from the prepared
        bytes when asked (nothing computes it at load time: the fold-route kernel decides per
        strip and block itself, and stays exact outside the window)."""
        if self.fmt != "fp4":
            raise ValueError(f"fold_plan is for fmt='fp4' weights (e2m1 folds into e4m3), got fmt={self.fmt!r}")
        from .fold import fold_plan

        return fold_plan(*self._plain())

    def _plain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(wq (N, K or K/2) rows, ws (N, ceil(K/32)) plain scales) viewed or relaid from the prepared layout."""
        return self.b.t(), from_blocked(self.scale_b, self.n, -(-self.k // MX_BLOCK))


def _aligned_rows(w: torch.Tensor) -> torch.Tensor:
    """``w`` (rows, cols) of 1-byte elements with unit column stride and 16-byte aligned rows:
    itself when it already is, else a copy into a buffer whose rows are padded to 16 bytes."""
    rows, cols = w.shape
    ok = (w.stride(1) == 1 or cols == 1) and (rows == 1 or (w.stride(0) % 16 == 0 and w.stride(0) >= cols))
    if ok and w.data_ptr() % 16 == 0:
        return w
    ld = -(-cols // 16) * 16
    buf = torch.empty((rows, ld), dtype=torch.uint8, device=w.device)
    buf[:, :cols].copy_(w.view(torch.uint8))
    return buf[:, :cols].view(w.dtype)


def _blocked_numel(rows: int, blocks: int) -> int:
    """Scales a (rows, blocks) plain scale holds in the blocked layout (rows padded to 128, blocks to 4)."""
    rows_p, blocks_p = blocked_shape(rows, blocks)
    return rows_p * blocks_p


def prepare_weight(wq: torch.Tensor, ws: torch.Tensor, *, fmt: str, scale_layout: str = "plain") -> PreparedWeight:
    """Prepare an MX weight once for repeated GEMMs.

    ``wq``: the weight as stored, (N, K) ``float8_e4m3fn`` for ``fmt="mxfp8"`` or (N, K/2)
    ``float4_e2m1fn_x2`` (element 2i in the low nibble) for ``fmt="fp4"`` -- what
    :func:`quantize_mxfp8` / :func:`quantize_mxfp4` return. ``ws``: its e8m0 scales, plain
    (N, ceil(K/32)) or, with ``scale_layout="blocked"``, already blocked.
    """
    fmt = FORMAT_ALIASES.get(fmt, fmt) if isinstance(fmt, str) else fmt
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {tuple(FORMATS)} (or {', '.join(map(repr, FORMAT_ALIASES))}), got {fmt!r}")
    dtype, per_k, op = FORMATS[fmt]
    check_scale_layout(scale_layout)
    if not isinstance(wq, torch.Tensor) or wq.dim() != 2:
        raise ValueError(f"wq must be a 2-D (N, K{'/2' if fmt == 'fp4' else ''}) tensor, got "
                         f"{getattr(wq, 'shape', type(wq).__name__)}")
    if wq.dtype != dtype:
        raise TypeError(f"wq must be {dtype} for fmt={fmt!r} ({op}), got {wq.dtype}")
    if not isinstance(ws, torch.Tensor) or ws.dtype != torch.float8_e8m0fnu:
        raise TypeError(f"ws must be a torch.float8_e8m0fnu tensor of e8m0 scales, got "
                        f"{getattr(ws, 'dtype', type(ws).__name__)}")
    if ws.device != wq.device:
        raise ValueError(f"ws is on {ws.device} but wq is on {wq.device}")
    n = wq.shape[0]
    k = int(wq.shape[1] / per_k)
    if fmt == "fp4" and k % MX_BLOCK:
        # quantize_mxfp4 keeps the format's partial last block; fp8_fp4_mm does not take one.
        raise ValueError(f"fmt='fp4' needs K % {MX_BLOCK} == 0 (fp8_fp4_mm's rule), got K = {k}: pad the "
                         f"weight's K to a multiple of {MX_BLOCK} before quantize_mxfp4")
    blocks = -(-k // MX_BLOCK)
    if scale_layout == "plain":
        if ws.dim() != 2 or tuple(ws.shape) != (n, blocks):
            hint = ""
            if ws.numel() == _blocked_numel(n, blocks):
                hint = ("; ws holds the blocked layout's count of scales for this N and K (what to_blocked "
                        "returns): pass scale_layout='blocked', or the plain scales the quantizer returned")
            elif ws.dim() == 2 and ws.shape[0] == wq.shape[1]:
                hint = ("; wq looks transposed: prepare_weight takes the weight as stored, (N, K) rows (what the "
                        "quantizer returned), not the wq.t() the ops take")
            raise ValueError(f"ws must be (N, ceil(K/32)) = ({n}, {blocks}) plain scales, got {tuple(ws.shape)}{hint}")
        blocked = to_blocked(ws.contiguous())
    else:
        want = _blocked_numel(n, blocks)
        if ws.numel() != want:
            raise ValueError(f"ws in the blocked layout must hold {want} scales for N = {n}, K = {k}, got {ws.numel()}")
        blocked = ws.contiguous()
    if blocked.data_ptr() % 16:
        blocked = blocked.clone()
    return PreparedWeight(b=_aligned_rows(wq).t(), scale_b=blocked.reshape(-1), fmt=fmt, n=n, k=k)


def from_mxfp4_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> PreparedWeight:
    """A prepared MXFP4 weight from a checkpoint's (blocks, scales) tensors, as gpt-oss and the OCP
    MX spec store them: ``blocks`` (N, K/32, 16) uint8 -- 32 e2m1 codes per scale block, two per
    byte, the low nibble first -- and ``scales`` (N, K/32) uint8 e8m0 codes (bias 127). Nothing
    is converted: the bytes are the weight as ``quantize_mxfp4`` would lay it out, viewed and
    prepared (``pg.mm(x, w)`` for bf16/fp16 activations, ``fp8_fp4_mm(xq, w, xs)`` for MXFP8 ones).
    An expert-stacked tensor (E, N, K/32, 16) is taken one expert at a time: ``blocks[e]``."""
    for name, t, dims in (("blocks", blocks, 3), ("scales", scales, 2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.uint8, torch.int8) and not (name == "scales" and t.dtype == torch.float8_e8m0fnu):
            raise TypeError(f"{name} must be the checkpoint's uint8 bytes, got {t.dtype}")
        if t.dim() != dims:
            extra = " (one expert at a time: blocks[e], scales[e])" if t.dim() == dims + 1 else ""
            want = "(N, K/32, 16)" if name == "blocks" else "(N, K/32)"
            raise ValueError(f"{name} must be {want}, got shape {tuple(t.shape)}{extra}")
    n, nb, width = blocks.shape
    if width != MX_BLOCK // 2:
        raise ValueError(f"blocks must hold {MX_BLOCK // 2} bytes (32 e2m1 codes) per scale block, got {width}")
    if tuple(scales.shape) != (n, nb):
        raise ValueError(f"scales must be (N, K/32) = ({n}, {nb}) for blocks {tuple(blocks.shape)}, got {tuple(scales.shape)}")
    wq = blocks.contiguous().view(torch.uint8).reshape(n, nb * width).view(torch.float4_e2m1fn_x2)
    ws = scales.contiguous().view(torch.uint8).view(torch.float8_e8m0fnu)
    return prepare_weight(wq, ws, fmt="fp4")
