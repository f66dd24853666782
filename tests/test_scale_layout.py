"""MX scale layouts: the blocked (128x4-tile) layout's index formula, its inverse, and the ops'
explicit scale_layout argument (CPU reference, fake kernels, errors)."""

import pytest
import torch

import persistent_gemm as pg
from persistent_gemm.scale_layout import blocked_shape, from_blocked, to_blocked

from conftest import e8m0_scales, mxfp8_operands, fp8_fp4_operands

SHAPES = [(1, 1), (128, 4), (129, 5), (300, 33), (7, 256)]


def _codes(rows, blocks, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 255, (rows, blocks), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("rows,blocks", SHAPES)
def test_to_blocked_places_every_scale_by_the_tile_formula(rows, blocks):
    plain = _codes(rows, blocks)
    blocked = to_blocked(plain).view(torch.uint8)
    prows, pblocks = blocked_shape(rows, blocks)
    assert blocked.shape == (prows * pblocks,)
    r = torch.arange(prows).view(-1, 1).expand(prows, pblocks)
    c = torch.arange(pblocks).view(1, -1).expand(prows, pblocks)
    # tile (r // 128, c // 4) of 512 bytes, tiles of a 128-row band contiguous along the blocks;
    # inside it local row 32 i + j and block c at byte 16 j + 4 i + c.
    tile = (r // 128) * (pblocks // 4) + c // 4
    offset = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    placed = blocked[offset]  # (prows, pblocks): what the formula reads back
    assert torch.equal(placed[:rows, :blocks], plain.view(torch.uint8))
    assert (placed[rows:, :] == 127).all() and (placed[:, blocks:] == 127).all()  # padding is 2^0
    assert torch.equal(torch.sort(offset.flatten()).values, torch.arange(prows * pblocks))  # a bijection


@pytest.mark.parametrize("rows,blocks", SHAPES)
def test_from_blocked_inverts_to_blocked(rows, blocks):
    plain = _codes(rows, blocks, seed=1)
    back = from_blocked(to_blocked(plain), rows, blocks)
    assert back.dtype == torch.float8_e8m0fnu and torch.equal(back.view(torch.uint8), plain.view(torch.uint8))
    # A 2-D view of the same bytes is accepted too (cuBLAS-style (prows / 4 ... ) shapes).
    two_d = to_blocked(plain).view(-1, 16)
    assert torch.equal(from_blocked(two_d, rows, blocks).view(torch.uint8), plain.view(torch.uint8))


def test_layout_helpers_reject_bad_arguments():
    with pytest.raises(TypeError, match="float8_e8m0fnu"):
        to_blocked(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="2-D"):
        to_blocked(_codes(4, 4).view(-1))
    with pytest.raises(ValueError, match="must hold 128 x 4 = 512 scales"):
        from_blocked(_codes(4, 4), 4, 4)
    with pytest.raises(ValueError, match="rows must be"):
        blocked_shape(-1, 4)


needs_ext = pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")


def _blocked(*scales):
    return tuple(to_blocked(s) for s in scales)


@needs_ext
@pytest.mark.parametrize("m,n,k", [(1, 7, 33), (129, 40, 200), (128, 128, 128)])
def test_mxfp8_mm_blocked_scales_give_the_plain_result(m, n, k):
    a, scale_a, b, scale_b = mxfp8_operands(m, n, k, seed=3)
    plain = pg.mxfp8_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    bs_a, bs_b = _blocked(scale_a, scale_b)
    blocked = pg.mxfp8_mm(a, b, bs_a, bs_b, out_dtype=torch.float32, scale_layout="blocked")
    assert torch.equal(plain, blocked)


@needs_ext
@pytest.mark.parametrize("m,n,k", [(1, 7, 64), (129, 40, 256)])
def test_fp8_fp4_mm_blocked_scales_give_the_plain_result(m, n, k):
    a, scale_a, b, scale_b = fp8_fp4_operands(m, n, k, seed=4)
    plain = pg.fp8_fp4_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    bs_a, bs_b = _blocked(scale_a, scale_b)
    assert torch.equal(plain, pg.fp8_fp4_mm(a, b, bs_a, bs_b, out_dtype=torch.float32, scale_layout="blocked"))


@needs_ext
def test_layout_is_stated_not_guessed():
    # M = N = 128, K = 128: a plain (128, 4) scale has exactly the blocked element count, so only
    # the argument can tell the two apart -- and they mean different things.
    a, scale_a, b, scale_b = mxfp8_operands(128, 128, 128, seed=5)
    plain = pg.mxfp8_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)
    as_blocked = pg.mxfp8_mm(a, b, scale_a.contiguous(), scale_b.contiguous(), out_dtype=torch.float32,
                             scale_layout="blocked")
    assert not torch.equal(plain, as_blocked)


@needs_ext
def test_scale_layout_errors_name_the_argument():
    a, scale_a, b, scale_b = mxfp8_operands(33, 17, 64, seed=6)
    with pytest.raises(ValueError, match="scale_layout must be 'plain' or 'blocked'"):
        pg.mxfp8_mm(a, b, scale_a, scale_b, scale_layout="swizzled")
    with pytest.raises(ValueError, match=r"scale_a in the blocked layout must hold 512 scales"):
        pg.mxfp8_mm(a, b, scale_a, to_blocked(scale_b), scale_layout="blocked")
    with pytest.raises(ValueError, match=r"scale_b must be a 2-D tensor"):
        pg.mxfp8_mm(a, b, scale_a, to_blocked(scale_b))  # blocked tensor, plain layout stated


@needs_ext
def test_blocked_layout_traces_and_passes_opcheck():
    a, scale_a, b, scale_b = mxfp8_operands(40, 24, 96, seed=7)
    bs_a, bs_b = _blocked(scale_a, scale_b)
    # test_schema compares inputs with allclose, which has no CPU kernel for fp8 (as in test_ops).
    torch.library.opcheck(torch.ops.persistent_gemm.mxfp8_mm.default, (a, b, bs_a, bs_b, torch.float32, "blocked", None),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    f = torch.compile(lambda *t: pg.mxfp8_mm(*t, out_dtype=torch.float32, scale_layout="blocked"),
                      fullgraph=True, backend="eager")
    assert torch.equal(f(a, b, bs_a, bs_b), pg.mxfp8_mm(a, b, scale_a, scale_b, out_dtype=torch.float32))
