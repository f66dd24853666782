"""CPU tests of the per-wave operand footprint (distinct A/B panels per wave, bytes), its
text formatting (:mod:`persistent_gemm.footprint`), and the visit-order plot (:mod:`persistent_gemm.tools.picture`)."""

from __future__ import annotations

import dataclasses
import sys
from collections import defaultdict

import pytest
from conftest import PNG_MAGIC, PROPS, schedules
from hypothesis import given
from hypothesis import strategies as st

from persistent_gemm import footprint as foot
from persistent_gemm import schedule as sch
from persistent_gemm.tools import picture as pic
from persistent_gemm.catalogue import CATALOGUE, ConfigError, KernelConfig
from persistent_gemm.schedule import TileSchedule, ceil_div

BF16_CFG = "sm90a_bf16_128x256x64_c2x1_sw{}_row_coop"


def test_swizzle_8_moves_fewer_bytes_than_swizzle_1_on_8192_cube():
    M = N = K = 8192
    W = sch.default_workers(132, TileSchedule(cluster=(2, 1)))
    assert W == 66
    s1 = foot.footprint_summary(BF16_CFG.format(1), M, N, K, W)
    s8 = foot.footprint_summary(BF16_CFG.format(8), M, N, K, W)
    assert s1["waves"] == s8["waves"] == 16
    assert s8["total_bytes"] < s1["total_bytes"]
    assert s8["mean_bytes"] < s1["mean_bytes"]
    # row raster swizzle 1: each wave sweeps ~2 cluster rows, i.e. every one of the 32 B panels
    assert s1["max_b_panels"] == 32 and s1["mean_b_panels"] == 32
    assert s8["max_b_panels"] < 10
    # exact regression values (the brute-force property test below checks the counting itself)
    assert s1["total_bytes"] == (94 * 128 + 512 * 256) * K * 2
    assert s8["total_bytes"] == (304 * 128 + 140 * 256) * K * 2
    assert s1["compulsory_bytes"] == s8["compulsory_bytes"] == (M + N) * K * 2


def test_footprint_small_case_by_hand():
    # Mt = 4 (last row panel 32 rows), Nt = 4 (last column panel 116 wide), swizzle 2, 1x1,
    # 3 workers. Ids: panel 0 = (0,0) (1,0) (0,1) (1,1) (0,2) (1,2) (0,3) (1,3), panel 1 the same
    # on rows 2, 3.
    cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=2, cluster=(1, 1)))
    M, N, K, W = 416, 500, 64, 3
    fps = foot.wave_footprint(cfg, M, N, K, W)
    A = lambda rows: rows * K * 2  # noqa: E731
    B = A
    expected = [
        # wave, ids, tiles, A panels, B panels, A bytes, B bytes
        (0, 3, 3, 2, 2, A(256), B(256)),  # ids 0-2: m {0,1}, n {0,1}
        (1, 3, 3, 2, 2, A(256), B(256)),  # ids 3-5: m {0,1}, n {1,2}
        (2, 3, 3, 3, 2, A(384), B(116 + 128)),  # ids 6-8: m {0,1,2}, n {3,0}
        (3, 3, 3, 2, 2, A(128 + 32), B(256)),  # ids 9-11: m {3,2}, n {0,1}
        (4, 3, 3, 2, 2, A(128 + 32), B(128 + 116)),  # ids 12-14: m {2,3}, n {2,3}
        (5, 1, 1, 1, 1, A(32), B(116)),  # id 15: (3,3)
    ]
    assert [tuple(f)[:7] for f in fps] == expected
    assert all(f.total_bytes == f.a_bytes + f.b_bytes for f in fps)
    s = foot.footprint_summary(cfg, M, N, K, W, footprints=fps)
    assert (s["a_panel_loads"], s["b_panel_loads"], s["panel_loads"]) == (12, 11, 23)
    assert s["total_bytes"] == 335360
    assert s["compulsory_bytes"] == (416 + 500) * 64 * 2 == 117248
    assert s["max_bytes"] == A(384) + B(244)
    assert s["mean_bytes"] == pytest.approx(335360 / 6)
    assert s == foot.footprint_summary(cfg.name, M, N, K, W)  # a name works as well


def test_footprint_excludes_tail_ctas_and_handles_more_workers_than_ids():
    # tile rows 0..2 in 2x1 clusters: cluster row 1 holds tile rows 2 and 3; row 3 is a tail CTA
    cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(cluster=(2, 1)))
    (f,) = foot.wave_footprint(cfg, 384, 256, 1000, workers=10)
    assert (f.visits, f.tiles, f.a_panels, f.b_panels) == (4, 6, 3, 2)
    assert (f.a_bytes, f.b_bytes) == (384 * 1000 * 2, 256 * 1000 * 2)


def test_footprint_fp4_b_operand_is_half_a_byte():
    cfg = KernelConfig(tile=(128, 128, 128), kernel="1sm", dtype="e4m3xe2m1", arch="sm100a")
    assert foot.operand_bytes("e4m3xe2m1") == (1, 0.5)
    fps = foot.wave_footprint(cfg, 256, 256, 128, workers=1)
    assert [(f.a_bytes, f.b_bytes) for f in fps] == [(128 * 128, 128 * 128 // 2)] * 4
    # an odd count of FP4 elements rounds up to whole bytes
    (f,) = foot.wave_footprint(cfg, 1, 1, 3, workers=1)
    assert (f.a_bytes, f.b_bytes) == (3, 2)
    s = foot.footprint_summary(cfg, 256, 256, 128, workers=1)
    assert s["compulsory_bytes"] == 256 * 128 + 256 * 128 // 2


def _with_schedule(cfg, sched):
    """``cfg`` on ``sched``, or ``cfg`` itself where its kernel refuses that schedule (the MX
    bf16 route with e4m3 activations runs 1x1 clusters only)."""
    try:
        return dataclasses.replace(cfg, schedule=sched)
    except ConfigError:
        return cfg


@PROPS
@given(
    cfg=st.sampled_from(CATALOGUE).flatmap(
        lambda c: schedules.map(lambda s: _with_schedule(c, s))
        if c.kernel not in ("2sm", "gemv")  # 2-SM pairs and the stream-K GEMV fix their schedule
        else st.just(c)
    ),
    M=st.integers(1, 6000),
    N=st.integers(1, 6000),
    K=st.integers(1, 5000),
    W=st.integers(1, 300),
    batch=st.integers(1, 2),
)
def test_footprint_matches_brute_force_over_order(cfg, M, N, K, W, batch):
    g = cfg.grid(M, N, batch=batch)
    fps = foot.wave_footprint(cfg, M, N, K, W, batch=batch)
    assert len(fps) == g.waves(W)
    ms, ns, tiles = defaultdict(set), defaultdict(set), defaultdict(int)
    for w, step, l, r, c in g.order(W):
        for m, n in g.cta_tiles(r, c):
            ms[step].add((l, m))
            ns[step].add((l, n))
            tiles[step] += 1
    a_el, b_el = foot.operand_bytes(cfg.dtype)
    if cfg.swap_ab:  # the grid's rows are the weight
        a_el, b_el = b_el, a_el
    tm, tn = cfg.cta_tile
    for f in fps:
        assert f.a_panels == len(ms[f.wave]) and f.b_panels == len(ns[f.wave])
        assert f.tiles == tiles[f.wave]
        rows = sum(min(tm, M - m * tm) for _, m in ms[f.wave])
        cols = sum(min(tn, N - n * tn) for _, n in ns[f.wave])
        assert f.a_bytes == ceil_div(int(rows * K * a_el * 2), 2)
        assert f.b_bytes == ceil_div(int(cols * K * b_el * 2), 2)
    assert sum(f.tiles for f in fps) == batch * g.tiles_m * g.tiles_n
    assert sum(f.visits for f in fps) == g.num_ids
    s = foot.footprint_summary(cfg, M, N, K, W, batch=batch, footprints=fps)
    assert s["total_bytes"] >= s["compulsory_bytes"]
    if W >= g.num_ids:
        assert s["waves"] == 1 and s["total_bytes"] == s["compulsory_bytes"]


def test_footprint_argument_errors():
    with pytest.raises(ValueError, match="K must be a positive int"):
        foot.wave_footprint(CATALOGUE[0], 128, 128, 0, 1)
    with pytest.raises(ValueError, match="workers must be a positive int"):
        foot.wave_footprint(CATALOGUE[0], 128, 128, 64, 0)
    with pytest.raises(ConfigError):
        foot.wave_footprint("not_a_config", 128, 128, 64, 1)


def test_format_footprint_and_summary():
    fps = foot.wave_footprint(BF16_CFG.format(8), 8192, 8192, 8192, 66)
    table = foot.format_footprint(fps)
    lines = table.splitlines()
    assert lines[0].split() == ["wave", "ids", "tiles", "A", "panels", "B", "panels", "A", "MiB", "B", "MiB", "total", "MiB"]
    assert len(lines) == 2 + len(fps)
    assert lines[2].split() == ["0", "66", "132", "16", "9", "32.0", "36.0", "68.0"]
    short = foot.format_footprint(fps, max_rows=4).splitlines()
    assert len(short) == 2 + 4 + 1 and short[4].strip() == "..."
    assert short[-1] == lines[-1]
    text = foot.format_summary(foot.footprint_summary(BF16_CFG.format(8), 8192, 8192, 8192, 66, footprints=fps))
    assert "1168.0 MiB" in text and "4.56x" in text


# ----------------------------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------------------------


def test_visit_grid_matches_order():
    cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=3, cluster=(2, 2), raster="column"))
    M, N, W = 1000, 1500, 5
    step, worker = pic.visit_grid(cfg, M, N, W)
    g = cfg.schedule.over(M, N, (128, 128))
    assert len(step) == g.tiles_m and all(len(r) == g.tiles_n for r in step)
    for w, s, _, r, c in g.order(W):
        for m, n in g.cta_tiles(r, c):
            assert (step[m][n], worker[m][n]) == (s, w)
    assert all(v >= 0 for row in step for v in row)


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    small = tmp_path / "small.png"
    assert pic.plot("sm90a_bf16_128x256x64_c2x1_sw4_row_coop", 1500, 3000, small, workers=7) == small
    assert small.read_bytes()[:8] == PNG_MAGIC
    big = tmp_path / "big.png"  # 80 x 40 tiles: too many to label, still drawn
    assert pic.plot(CATALOGUE[0], 80 * 128, 40 * 256, str(big)) == str(big)
    assert big.read_bytes()[:8] == PNG_MAGIC


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(ImportError, match=r"pip install matplotlib.*pip install '\.\[plot\]'"):
        pic.plot(CATALOGUE[0], 1024, 1024, tmp_path / "x.png")


def test_plot_colours_by_worker_and_outlines_a_tile(tmp_path):
    pytest.importorskip("matplotlib")
    cfg = "sm90a_bf16_128x64x64_c1x2_sw3_column_pp"  # any spec: it need not be built
    p = tmp_path / "w.png"
    assert pic.plot(cfg, 2000, 3000, p, workers=9, color_by="worker", highlight=(3, 5)) == p
    assert p.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="color_by must be 'wave' or 'worker'"):
        pic.plot(cfg, 2000, 3000, p, color_by="step")
    with pytest.raises(ValueError, match=r"highlight=\(16, 0\) is outside the 16 x 47 tile grid"):
        pic.plot(cfg, 2000, 3000, p, highlight=(16, 0))
    with pytest.raises(TypeError, match="highlight must be a"):
        pic.plot(cfg, 2000, 3000, p, highlight=3)


def test_wave_edges_separate_exactly_the_tiles_of_different_waves():
    # 2 x 2 tiles, row raster, one row per panel, 2 workers: row 0 is wave 0, row 1 wave 1.
    step, _ = pic.visit_grid(KernelConfig(tile=(128, 64, 64), kernel="pingpong",
                                          schedule=TileSchedule(swizzle=1, cluster=(1, 1))), 256, 128, 2)
    assert step == [[0, 0], [1, 1]]
    assert sorted(pic.wave_edges(step)) == [((0.5, 0.5), (-0.5, 0.5)), ((0.5, 0.5), (0.5, 1.5))]
    cfg = KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=TileSchedule(swizzle=3, cluster=(1, 2)))
    step, _ = pic.visit_grid(cfg, 1300, 900, 7)
    edges = set(pic.wave_edges(step))
    for m in range(len(step)):
        for n in range(len(step[0])):
            if n + 1 < len(step[0]):
                assert (((m - 0.5, m + 0.5), (n + 0.5, n + 0.5)) in edges) == (step[m][n] != step[m][n + 1])
            if m + 1 < len(step):
                assert (((m + 0.5, m + 0.5), (n - 0.5, n + 0.5)) in edges) == (step[m][n] != step[m + 1][n])


def test_footprint_swap_ab_fp4_prices_the_grid_rows_as_the_weight():
    """A swap-AB FP8 x FP4 kernel's grid rows are the e2m1 weight (half a byte), its columns the
    e4m3 activations; the kernel's extents are the op's (N, M)."""
    cfg = KernelConfig(tile=(128, 128, 128), kernel="cooperative", dtype="e4m3xe2m1", arch="sm90a",
                       schedule=TileSchedule(cluster=(1, 2)), swap_ab=True)
    (f,) = foot.wave_footprint(cfg, 256, 256, 128, workers=10)
    assert (f.a_bytes, f.b_bytes) == (256 * 128 // 2, 256 * 128)
