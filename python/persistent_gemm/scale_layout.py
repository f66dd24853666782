"""Layouts of MX block scales: "plain" and "blocked".

An MX operand of ``rows`` rows and K columns carries one e8m0 scale per 1x32 block along K:
``blocks = ceil(K / 32)`` per row.

* ``"plain"``: a row-major ``(rows, blocks)`` tensor, torchao's and our quantizers' output.
* ``"blocked"``: the layout block-scaled tensor cores read (SM100's tcgen05, and cuBLAS /
  CUTLASS for MX; torchao's ``to_blocked``). Rows are padded to a multiple of 128 and blocks
  to a multiple of 4; the padded matrix is cut into 128x4 tiles, stored tile after tile (tiles
  of one 128-row band first, along the blocks), each tile as 512 contiguous bytes in which
  local row ``r = 32 * i + j`` and local block ``c`` sit at byte ``16 * j + 4 * i + c``. The
  tensor is 1-D (or any contiguous shape) with ``padded_rows * padded_blocks`` elements.

The two layouts hold the same scales and coincide in element count at some shapes (e.g.
``rows = 128, blocks = 4``), so the ops never guess: ``scale_layout=`` says which one a scale
tensor is in. Padding is filled with code 127 (2^0), never NaN, so a kernel that reads a padded
position multiplies zero-filled data by a finite scale.
"""

from __future__ import annotations

import torch

__all__ = ["SCALE_LAYOUTS", "TILE_ROWS", "TILE_BLOCKS", "blocked_shape", "padded_extents", "to_blocked",
           "from_blocked", "check_scale_layout"]

SCALE_LAYOUTS: tuple[str, ...] = ("plain", "blocked")
#: One blocked tile: 128 rows x 4 scale blocks (= 128 K-elements), 512 bytes.
TILE_ROWS = 128
TILE_BLOCKS = 4
_PAD_CODE = 127  # 2^0


def check_scale_layout(scale_layout) -> str:
    """``scale_layout`` itself, or a ValueError naming it."""
    if not isinstance(scale_layout, str) or scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    return scale_layout


def blocked_shape(rows: int, blocks: int) -> tuple[int, int]:
    """(padded rows, padded blocks) of the blocked layout for a ``(rows, blocks)`` scale."""
    for name, v in (("rows", rows), ("blocks", blocks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    return padded_extents(rows, blocks)


def padded_extents(rows, blocks):
    """:func:`blocked_shape` without its argument checks: plain arithmetic, so the ops' fake
    kernels can pass the symbolic sizes of torch.compile through it."""
    return (-(-rows // TILE_ROWS) * TILE_ROWS, -(-blocks // TILE_BLOCKS) * TILE_BLOCKS)


def _check_e8m0(scale: torch.Tensor, name: str) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float8_e8m0fnu:
        raise TypeError(f"{name} must be torch.float8_e8m0fnu, got {scale.dtype}")


def to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """A plain ``(rows, blocks)`` e8m0 scale in the blocked layout: a new contiguous 1-D tensor
    of ``padded_rows * padded_blocks`` elements (see the module docstring)."""
    _check_e8m0(scale, "scale")
    if scale.dim() != 2:
        raise ValueError(f"scale must be a 2-D (rows, blocks) tensor, got {scale.dim()}-D")
    rows, blocks = scale.shape
    prows, pblocks = blocked_shape(rows, blocks)
    codes = scale.view(torch.uint8)
    padded = torch.full((prows, pblocks), _PAD_CODE, dtype=torch.uint8, device=scale.device)
    padded[:rows, :blocks] = codes
    # (band, i, j, tile, c) -> (band, tile, j, i, c): local row 32 i + j, byte 16 j + 4 i + c.
    tiles = padded.view(prows // TILE_ROWS, 4, 32, pblocks // TILE_BLOCKS, TILE_BLOCKS).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().view(-1).view(torch.float8_e8m0fnu)


def from_blocked(blocked: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """The plain ``(rows, blocks)`` scale held by a blocked-layout tensor (inverse of
    :func:`to_blocked`; padding dropped)."""
    _check_e8m0(blocked, "blocked")
    prows, pblocks = blocked_shape(rows, blocks)
    if blocked.numel() != prows * pblocks:
        raise ValueError(f"blocked must hold {prows} x {pblocks} = {prows * pblocks} scales for (rows, blocks) = "
                         f"({rows}, {blocks}), got {blocked.numel()}")
    if not blocked.is_contiguous():
        raise ValueError("blocked must be contiguous")
    tiles = blocked.view(torch.uint8).reshape(prows // TILE_ROWS, pblocks // TILE_BLOCKS, 32, 4, TILE_BLOCKS)
    plain = tiles.permute(0, 3, 2, 1, 4).reshape(prows, pblocks)
    return plain[:rows, :blocks].contiguous().view(torch.float8_e8m0fnu)
