"""The dispatcher's kernel choice, asked without a GPU (the same C++ the ops run)."""

import pytest

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available() or "sm90a" not in pg.built_archs(),
                                reason="needs the sm90a kernel module built")


def names(dtype, arch="sm90a"):
    return [c.name for c in pg.CATALOGUE if c.dtype == dtype and c.arch == arch]


def test_large_square_takes_the_cooperative_tile():
    d = pg.explain(8192, 8192, 8192)
    assert d.config == "sm90a_bf16_128x256x64_c2x1_sw8_row_coop"
    assert not (d.copy_a or d.copy_b or d.pad_d) and d.tma_store
    assert d.log and d.log[0].startswith(d.config)


def test_small_m_prefers_the_tile_without_tail_ctas():
    # M = 128 with a 2x1 cluster of 128-row tiles leaves half the CTAs as tail CTAs.
    assert pg.explain(128, 8192, 8192).config == "sm90a_bf16_128x128x64_c1x2_sw8_row_pp"


def test_unaligned_n_uses_predicated_stores():
    d = pg.explain(8191, 8191, 8192)
    assert not d.tma_store and not d.pad_d
    assert "predicated stores" in d.log[0]


def test_layout_and_alignment_fallbacks_are_reported():
    d = pg.explain(4096, 4096, 4096, layout="cr")  # A column-major, B row-major: built variant
    assert not d.copy_a and not d.copy_b
    d = pg.explain(4096, 4096, 4096, out_dtype="fp16")  # bf16 -> fp16: fp32 kernel, then a cast
    assert "casts fp32 D" in d.log[0]
    d = pg.explain(4095, 8191, 4096, dtype="e4m3", scale="row")  # fp8: TMA store into padded D
    assert d.pad_d and d.config in names("e4m3")


def test_forced_and_rejected_configs():
    forced = names("bf16")[1]
    assert pg.explain(8192, 8192, 8192, config=forced).config == forced
    with pytest.raises(RuntimeError, match="no built sm90a kernel fits"):
        pg.explain(64, 64, 64, config=names("fp16")[0])  # a fp16 kernel for a bf16 problem
    d = pg.explain(256, 256, 256, dtype="e4m3", scale="tensor")
    assert any(line.startswith("rejected ") and "operands are bf16" in line for line in d.log)


def test_bad_arguments():
    with pytest.raises(ValueError, match="layout must be"):
        pg.explain(1, 1, 1, layout="xx")
    with pytest.raises(ValueError, match="dtype must be bf16"):
        pg.explain(1, 1, 1, dtype="int8")
    with pytest.raises(ValueError, match="no kernel module for arch 'sm80'"):
        pg.explain(1, 1, 1, arch="sm80")
