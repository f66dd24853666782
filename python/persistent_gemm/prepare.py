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
from typing import TYPE_CHECKING, Optional

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
    its e8m0 scales in ``scale_b_layout`` ("blocked"), ``n``/``k`` the logical extents.

    A stack of ``experts`` (MoE; :func:`persistent_gemm.grouped_mm`): ``b`` is (E, K, N) (for fp4
    (E, K/2, N)), each expert's (K, N) view of its own aligned rows, and ``scale_b`` (E, S), each
    expert's blocked scales in a row."""

    b: torch.Tensor
    scale_b: torch.Tensor
    fmt: str
    n: int
    k: int
    scale_b_layout: str = "blocked"
    experts: Optional[int] = None

    def __repr__(self) -> str:  # the packed bytes are not worth printing
        stack = f"experts={self.experts}, " if self.experts is not None else ""
        return (f"PreparedWeight(fmt={self.fmt!r}, {stack}n={self.n}, k={self.k}, b={tuple(self.b.shape)} {self.b.dtype}, "
                f"scale_b={self.scale_b.numel()} e8m0 {self.scale_b_layout}, device={self.b.device})")

    @property
    def nbytes(self) -> int:
        """Bytes a GEMM streams for this weight: data plus scales."""
        return self.b.untyped_storage().nbytes() + self.scale_b.numel()

    def dequantize(self) -> torch.Tensor:
        """The weight's values, (N, K) float32 ((E, N, K) for a stack), read from the prepared
        layout (the bytes the kernels stream): equal bit for bit to dequantizing the (wq, ws) it
        was prepared from."""
        from .quant import dequantize_mxfp4, dequantize_mxfp8

        if self.experts is not None:
            return torch.stack([self.expert(e).dequantize() for e in range(self.experts)])
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

    def expert(self, e: int) -> "PreparedWeight":
        """Expert ``e`` of a stack as a 2-D prepared weight (views, no copy): what ``pg.mm`` or
        the MX ops take for that expert alone."""
        if self.experts is None:
            raise ValueError("expert() is for stacked weights (prepare_weight of a 3-D wq); this weight is 2-D")
        return PreparedWeight(b=self.b[e], scale_b=self.scale_b[e], fmt=self.fmt, n=self.n, k=self.k)

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

    MoE experts: a 3-D ``wq`` (E, N, K or K/2) with ``ws`` (E, N, ceil(K/32)) (plain) prepares a
    stack for :func:`persistent_gemm.grouped_mm` -- each expert prepared as above, the experts'
    rows and scales a fixed stride apart in one buffer each.
    """
    if isinstance(wq, torch.Tensor) and wq.dim() == 3:
        return _prepare_stack(wq, ws, fmt=fmt, scale_layout=scale_layout)
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


def _prepare_stack(wq: torch.Tensor, ws: torch.Tensor, *, fmt: str, scale_layout: str) -> PreparedWeight:
    """prepare_weight of E experts: each one prepared alone (so every rule and message is the 2-D
    one's), then their aligned rows and blocked scales copied into one buffer each."""
    if not isinstance(ws, torch.Tensor) or ws.dim() != 3 or ws.shape[0] != wq.shape[0]:
        raise ValueError(f"a 3-D wq (E, N, K) takes ws (E, N, ceil(K/32)) with the same E = {wq.shape[0]}, got "
                         f"{getattr(ws, 'shape', type(ws).__name__)}")
    if scale_layout != "plain":
        raise ValueError("a 3-D wq takes plain scales (E, N, ceil(K/32)); scale_layout='blocked' is for one expert")
    experts = wq.shape[0]
    if experts < 1:
        raise ValueError("wq must hold at least one expert, got E = 0")
    one = [prepare_weight(wq[e], ws[e], fmt=fmt) for e in range(experts)]
    first = one[0]
    rows = first.b.t()  # (N, Kb): aligned rows, ld a multiple of 16 bytes
    ld = rows.stride(0) if rows.shape[0] > 1 else -(-rows.shape[1] // 16) * 16
    data = torch.empty((experts, rows.shape[0], ld), dtype=torch.uint8, device=wq.device)
    scales = torch.empty((experts, first.scale_b.numel()), dtype=torch.uint8, device=wq.device)
    for e, w in enumerate(one):
        data[e, :, :rows.shape[1]].copy_(w.b.t().view(torch.uint8))
        scales[e].copy_(w.scale_b.view(torch.uint8))
    b = data[:, :, :rows.shape[1]].view(wq.dtype).transpose(1, 2)
    return PreparedWeight(b=b, scale_b=scales.view(torch.float8_e8m0fnu), fmt=first.fmt, n=first.n, k=first.k,
                          experts=experts)


def from_mxfp4_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> PreparedWeight:
    """A prepared MXFP4 weight from a checkpoint's (blocks, scales) tensors, as gpt-oss and the OCP
    MX spec store them: ``blocks`` (N, K/32, 16) uint8 -- 32 e2m1 codes per scale block, two per
    byte, the low nibble first -- and ``scales`` (N, K/32) uint8 e8m0 codes (bias 127). Nothing
    is converted: the bytes are the weight as ``quantize_mxfp4`` would lay it out, viewed and
    prepared (``pg.mm(x, w)`` for bf16/fp16 activations, ``fp8_fp4_mm(xq, w, xs)`` for MXFP8 ones).
    gpt-oss's expert stacks, ``blocks`` (E, N, K/32, 16) and ``scales`` (E, N, K/32), give a stacked
    weight for :func:`persistent_gemm.grouped_mm`."""
    if isinstance(blocks, torch.Tensor) and blocks.dim() == 4:
        if not isinstance(scales, torch.Tensor) or scales.dim() != 3 or scales.shape[0] != blocks.shape[0]:
            raise ValueError(f"blocks (E, N, K/32, 16) take scales (E, N, K/32) with the same E = {blocks.shape[0]}, "
                             f"got {getattr(scales, 'shape', type(scales).__name__)}")
        one = [_mxfp4_operands(blocks[e], scales[e]) for e in range(blocks.shape[0])]
        return _prepare_stack(torch.stack([w for w, _ in one]), torch.stack([s for _, s in one]), fmt="fp4",
                              scale_layout="plain")
    return prepare_weight(*_mxfp4_operands(blocks, scales), fmt="fp4")


def _mxfp4_operands(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's checkpoint (blocks, scales) checked and viewed as quantize_mxfp4's (wq, ws)."""
    for name, t, dims in (("blocks", blocks, 3), ("scales", scales, 2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.uint8, torch.int8) and not (name == "scales" and t.dtype == torch.float8_e8m0fnu):
            raise TypeError(f"{name} must be the checkpoint's uint8 bytes, got {t.dtype}")
        if t.dim() != dims:
            want = "(N, K/32, 16) or a stack (E, N, K/32, 16)" if name == "blocks" else "(N, K/32) for blocks (N, K/32, 16)"
            raise ValueError(f"{name} must be {want}, got shape {tuple(t.shape)}")
    n, nb, width = blocks.shape
    if width != MX_BLOCK // 2:
        raise ValueError(f"blocks must hold {MX_BLOCK // 2} bytes (32 e2m1 codes) per scale block, got {width}")
    if tuple(scales.shape) != (n, nb):
        raise ValueError(f"scales must be (N, K/32) = ({n}, {nb}) for blocks {tuple(blocks.shape)}, got {tuple(scales.shape)}")
    wq = blocks.contiguous().view(torch.uint8).reshape(n, nb * width).view(torch.float4_e2m1fn_x2)
    ws = scales.contiguous().view(torch.uint8).view(torch.float8_e8m0fnu)
    return wq, ws
