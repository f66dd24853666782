"""The exact-fold window of MXFP4 weights (persistent_gemm.fold, the FP8 x FP4 fold route): the
window is exact and tight, fold_plan classifies (16-row strip, block) pairs by it, kernel_folds
states the kernel's own rule, and the kernel's conversion tables hold the exact values (a host
program, tests/host/mx_fold_lut.cu)."""

from __future__ import annotations

import subprocess

import pytest
import torch
from support.host_build import ROOT, build_host_program

import persistent_gemm as pg
from persistent_gemm.fold import FOLD_WINDOW, STRIP_ROWS, fold_plan, kernel_folds

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
E2M1 = torch.cat([E2M1, -E2M1])  # codes 0..15


def _exact_in_e4m3(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float8_e4m3fn).to(torch.float64) == v


def test_every_e2m1_value_times_2_to_the_j_is_an_e4m3_value_exactly_in_the_window():
    lo, hi = FOLD_WINDOW
    for j in range(lo, hi + 1):
        assert _exact_in_e4m3(E2M1 * 2.0**j).all(), j
    # and the window is tight: one step past either end loses a value
    assert not _exact_in_e4m3(E2M1 * 2.0 ** (lo - 1)).all()
    assert not _exact_in_e4m3(E2M1 * 2.0 ** (hi + 1)).all()


def _weight(strip_exponents, k=128, zero_blocks=(), rows=None):
    """A packed e2m1 weight with all-nonzero codes. ``strip_exponents[s][b]`` lists the exponents
    of block b across the rows of strip s (cycled over its 16 rows); ``zero_blocks`` holds
    (row, block) pairs whose codes are zeroed."""
    g = torch.Generator().manual_seed(0)
    blocks = k // 32
    n = rows if rows is not None else STRIP_ROWS * len(strip_exponents)
    codes = torch.randint(1, 16, (n, k), generator=g, dtype=torch.uint8)
    codes[codes == 8] = 9  # no -0: every block nonzero unless zeroed below
    for r, b in zero_blocks:
        codes[r, 32 * b:32 * (b + 1)] = 0
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.float4_e2m1fn_x2)
    scale = torch.empty(n, blocks, dtype=torch.uint8)
    for r in range(n):
        strip = strip_exponents[r // STRIP_ROWS]
        for b in range(blocks):
            es = strip[b]
            scale[r, b] = es[(r % STRIP_ROWS) % len(es)] + 127
    return packed, scale.view(torch.float8_e8m0fnu)


def test_fold_plan_classifies_strip_blocks_by_their_span():
    # Strip 0's blocks: rows all alike; rows 14 apart (fits exactly); 15 apart (out); wide
    # exponents 10 apart. Strip 1: an outlier row 2^30 above at block 1 only.
    strips = [[[0], [-20, -6, -10], [-20, -5], [100, 90, 95]],
              [[3], [0, 30, 0], [-1, 0], [7]]]
    wq, ws = _weight(strips)
    plan = fold_plan(wq, ws)
    assert plan.ref_exponent.shape == (2, 4)
    assert plan.span.tolist() == [[0, 14, 15, 10], [0, 30, 1, 0]]
    assert plan.in_window.tolist() == [[True, True, False, True], [True, False, True, True]]
    assert plan.ref_exponent.tolist() == [[-6, -12, -11, 94], [-3, 24, -6, 1]]
    assert not plan.foldable and plan.blocks_out_of_window == 2
    s = plan.shifts(ws)
    ok = plan.in_window.repeat_interleave(STRIP_ROWS, dim=0)
    assert (s[ok] >= FOLD_WINDOW[0]).all() and (s[ok] <= FOLD_WINDOW[1]).all()


def test_a_row_spanning_many_binades_along_k_still_folds():
    # The reference is per (strip, block): a row whose blocks span 2^100 along K folds exactly
    # as long as the strip's rows agree within 14 at each block (a per-row reference could not).
    wq, ws = _weight([[[0], [50], [100], [-50]]])
    plan = fold_plan(wq, ws)
    assert plan.foldable and plan.span.tolist() == [[0, 0, 0, 0]]


def test_zero_blocks_nan_scales_and_a_partial_last_strip():
    # 20 rows: strip 1 holds rows 16..19 only. Row 0's outlier block is all zeros (its scale does
    # not count); row 1 has a NaN scale on a nonzero block (no e4m3 code carries it); row 2 NaN on
    # an all-zero block; strip 1's block 0 is all zeros.
    wq, ws = _weight([[[0], [0], [0], [0]], [[0], [0], [0], [0]]], rows=20,
                     zero_blocks=[(0, 1), (2, 3)] + [(r, 0) for r in range(16, 20)])
    ws = ws.view(torch.uint8).clone()
    ws[0, 1] = 127 + 40
    ws[1, 2] = 255
    ws[2, 3] = 255
    ws[16:, 0] = 127 + 90
    plan = fold_plan(wq, ws.view(torch.float8_e8m0fnu))
    assert plan.ref_exponent.shape == (2, 4)
    assert plan.in_window.tolist() == [[True, True, False, True], [True, True, True, True]]
    assert plan.span.tolist() == [[0, 0, -1, 0], [0, 0, 0, 0]]
    assert plan.ref_exponent[1, 0].item() == 0  # all zeros: no reference needed


@pytest.mark.parametrize("n,k", [(7, 32), (33, 96), (16, 1024)])
def test_folding_an_in_window_weight_is_exact(n, k):
    """e4m3(e2m1 * 2^(e - R)) * 2^R == the MX value, bit for bit, on quantize_mxfp4's output for a
    weight whose rows differ by up to 2^12 at a block."""
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g, dtype=torch.float64)
    w *= 2.0 ** torch.randint(-6, 7, (n, k // 32), generator=g).repeat_interleave(32, dim=1)
    w *= 2.0 ** (torch.arange(k // 32) % 8).mul(9).repeat_interleave(32)[None, :]  # and 2^9 apart along K
    wq, ws = pg.quantize_mxfp4(w.float())
    plan = fold_plan(wq, ws)
    assert plan.foldable
    codes = wq.view(torch.uint8)
    vals = torch.stack([E2M1[(codes & 0xF).long()], E2M1[(codes >> 4).long()]], dim=2).reshape(n, -1)
    j = plan.shifts(ws).repeat_interleave(32, dim=1)[:, :k].double()
    folded = (vals * 2.0**j).to(torch.float8_e4m3fn).double()
    assert torch.equal(folded, vals * 2.0**j)  # the conversion rounds nothing
    got = folded * 2.0 ** plan.row_ref_exponent(n).repeat_interleave(32, dim=1)[:, :k].double()
    assert torch.equal(got.float(), pg.dequantize_mxfp4(wq, ws).float())


def test_fold_plan_errors_name_the_argument():
    wq, ws = _weight([[[0], [0], [0], [0]]])
    with pytest.raises(TypeError, match="wq must be the packed e2m1"):
        fold_plan(torch.zeros(1, 64), ws)
    with pytest.raises(TypeError, match="ws must be the e8m0"):
        fold_plan(wq, torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"ws must be \(N, ceil\(K/32\)\)"):
        fold_plan(wq, ws[:, :3])
    with pytest.raises(ValueError, match="materialised"):
        fold_plan(wq.to("meta"), ws.to("meta"))


def test_a_prepared_fp4_weight_gives_its_fold_window():
    wq, ws = _weight([[[0], [0, 20], [-3], [1]], [[5], [5], [5], [5]]])
    plain = pg.prepare_weight(wq, ws, fmt="fp4")
    blocked = pg.prepare_weight(wq, pg.to_blocked(ws), fmt="fp4", scale_layout="blocked")
    for pw in (plain, blocked):
        plan = pw.fold_plan()
        assert plan.in_window.tolist() == [[True, False, True, True], [True, True, True, True]]
        assert plan.ref_exponent.tolist() == [[-6, 14, -9, -5], [-1, -1, -1, -1]]
        assert not plan.foldable
    wq8, ws8 = pg.quantize_mxfp8(torch.randn(8, 64))
    with pytest.raises(ValueError, match="fold_plan is for fmt='fp4'"):
        pg.prepare_weight(wq8, ws8, fmt="mxfp8").fold_plan()
    # a meta weight (loaded later) has no bytes to read yet
    with pytest.raises(ValueError, match="materialised"):
        pg.prepare_weight(wq.to("meta"), ws.to("meta"), fmt="fp4").fold_plan()


def test_kernel_folds_is_the_window_over_every_code_of_the_strip():
    # The kernel sees codes, not data: an all-zero block's outlying code and the blocked layout's
    # tail padding (code 127) count. Strip 0 as in fold_plan's test above; strip 1 is 4 rows.
    wq, ws = _weight([[[0], [-20, -6, -10], [-20, -5], [100, 90, 95]], [[0], [0], [0], [0]]], rows=20,
                     zero_blocks=[(0, 0)])
    codes = ws.view(torch.uint8).clone()
    codes[0, 0] = 127 + 40          # an all-zero block: fold_plan ignores it, the kernel cannot
    codes[17, 1] = 255              # NaN in strip 1
    codes[18, 2] = 127 + 14         # with the padding rows' 127: span 14, still in
    codes[19, 3] = 127 - 15         # span 15 against the padding: out
    got = kernel_folds(codes.view(torch.float8_e8m0fnu))
    assert got.tolist() == [[False, True, False, True], [True, False, True, False]]
    plan = fold_plan(wq, codes.view(torch.float8_e8m0fnu))
    assert plan.in_window[0, 0] and not got[0, 0]  # the kernel folds a subset of the plan
    with pytest.raises(TypeError, match="ws must be 2-D e8m0"):
        kernel_folds(torch.zeros(4, 4))


def test_the_kernels_fold_tables_are_exact(tmp_path):
    """Every byte of every shifted conversion LUT (collective/mx_block_scales.hpp) is the e4m3 code
    of e2m1 x 2^j over the whole window, the plain table is j = 0, and the row factors 2^e are
    exact down to fp32's subnormals: compiled and run on the host."""
    exe = build_host_program([ROOT / "tests" / "host" / "mx_fold_lut.cu"], tmp_path / "mx_fold_lut", timeout=600)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "mismatches: 0" in run.stdout, run.stdout + run.stderr
