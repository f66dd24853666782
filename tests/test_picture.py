"""CPU tests of the schedule picture (:mod:`persistent_gemm.tools.picture`): the pure data behind it
(cluster and swizzle-panel outlines, one wave's operand footprint, build status, colours,
legends, titles and captions), checked against the schedule's own walk without matplotlib,
and drawing smoke tests that skip without matplotlib."""

from __future__ import annotations

import colorsys
import sys

import pytest
from conftest import PNG_MAGIC, PROPS, schedules
from hypothesis import given
from hypothesis import strategies as st

import persistent_gemm as pg
from persistent_gemm.tools import picture as pic
from persistent_gemm import footprint as foot
from persistent_gemm.catalogue import CATALOGUE, KernelConfig
from persistent_gemm.schedule import TileSchedule, ceil_div

# Hand-made configs: every raster, swizzles below, at and above the cluster rows, uneven
# clusters, split-K, and the e4m3 / FP4 element sizes (swap-AB and not).
HAND = [
    KernelConfig(tile=(128, 256, 64), schedule=TileSchedule(swizzle=3, cluster=(2, 1))),
    KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=2, cluster=(1, 2), raster="column")),
    KernelConfig(tile=(64, 64, 64), kernel="pingpong", schedule=TileSchedule(swizzle=1, cluster=(4, 2))),
    KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=TileSchedule(swizzle=5, cluster=(2, 4),
                                                                               raster="column")),
    KernelConfig(tile=(256, 128, 64), schedule=TileSchedule(swizzle=64, cluster=(1, 1))),
    KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=TileSchedule(swizzle=2, split_k=3)),
    KernelConfig(tile=(128, 128, 128), dtype="e4m3", schedule=TileSchedule(swizzle=4, cluster=(2, 2))),
]
CONFIGS = HAND + list(CATALOGUE)
SHAPES = [(1000, 1500), (4096, 4096), (129, 17), (3000, 700)]
NEVER_BUILDABLE = KernelConfig(tile=(128, 128, 128), kernel="1sm", dtype="mxfp8", arch="sm100a",
                               schedule=TileSchedule(split_k=2))
_PROP_TILES = [((128, 256, 64), "cooperative"), ((128, 128, 64), "cooperative"), ((64, 64, 64), "pingpong"),
               ((256, 128, 64), "cooperative")]


def _ids(cfgs):
    return [c.name for c in cfgs]


def _tiles(g):
    return [(m, n) for m in range(g.tiles_m) for n in range(g.tiles_n)]


def _covering(rects, tile):
    return [i for i, r in enumerate(rects) if tile in r]


# ----------------------------------------------------------------------------------------------
# Cluster and panel outlines
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids(CONFIGS))
@pytest.mark.parametrize("M,N", SHAPES)
def test_cluster_outlines_are_the_clusters(cfg, M, N):
    g = cfg.grid(M, N)
    rects = pic.cluster_outlines(cfg, M, N)
    cm, cn = cfg.schedule.cluster
    assert len(rects) == g.clusters_m * g.clusters_n
    count = [[0] * g.tiles_n for _ in range(g.tiles_m)]
    for r in rects:
        for m, n in _tiles_of(r):
            count[m][n] += 1
    assert all(c == 1 for row in count for c in row)  # every tile in exactly one cluster
    for i, r in enumerate(rects):
        rc = divmod(i, g.clusters_n)
        assert {(m, n) for m in range(r.row0, r.row1) for n in range(r.col0, r.col1)} == set(g.cta_tiles(*rc))
        h, w = r.shape
        assert h == cm or (r.row1 == g.tiles_m and h < cm)  # the cluster shape, but at the grid edge
        assert w == cn or (r.col1 == g.tiles_n and w < cn)


def _check_panels(cfg, M, N):
    g = cfg.grid(M, N)
    s = cfg.schedule
    panels = pic.panel_outlines(cfg, M, N)
    idx = pic.panel_index(cfg, M, N)
    for m, n in _tiles(g):  # a partition, and panel_index names the rectangle
        assert _covering(panels, (m, n)) == [idx[m][n]]
    assert sum(r.shape[0] * r.shape[1] for r in panels) == g.tiles_m * g.tiles_n
    # The schedule's own walk: the ids of one panel are consecutive, and the panels come in order.
    seq = [idx[m][n] for t in range(0, g.num_ids, g.splits) for m, n in g.cta_tiles(*g.coord(t))[:1]]
    runs = [p for i, p in enumerate(seq) if i == 0 or p != seq[i - 1]]
    assert runs == list(range(len(panels))), runs
    # Their shape: `swizzle` cluster rows (columns) across the whole grid, the last one narrowed.
    row = s.raster == "row"
    major, minor, ext = (g.clusters_m, g.tiles_n, s.cluster_m) if row else (g.clusters_n, g.tiles_m, s.cluster_n)
    assert len(panels) == ceil_div(major, s.swizzle)
    for p, r in enumerate(panels):
        lo, hi, across = (r.row0, r.row1, r.shape[1]) if row else (r.col0, r.col1, r.shape[0])
        assert across == minor
        assert lo == p * s.swizzle * ext
        assert hi == min((p + 1) * s.swizzle * ext, g.tiles_m if row else g.tiles_n)
    return panels


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids(CONFIGS))
@pytest.mark.parametrize("M,N", SHAPES)
def test_panel_outlines_partition_the_grid_in_visit_order(cfg, M, N):
    _check_panels(cfg, M, N)


@PROPS
@given(s=schedules, tile=st.sampled_from(_PROP_TILES), M=st.integers(1, 5000), N=st.integers(1, 5000))
def test_outlines_property(s, tile, M, N):
    cfg = KernelConfig(tile=tile[0], kernel=tile[1], schedule=s)
    _check_panels(cfg, M, N)
    g = cfg.grid(M, N)
    rects = pic.cluster_outlines(cfg, M, N)
    assert sorted(t for r in rects for t in _tiles_of(r)) == _tiles(g)


def _tiles_of(r):
    return [(m, n) for m in range(r.row0, r.row1) for n in range(r.col0, r.col1)]


def test_panels_by_hand():
    # 6 x 4 tiles, 2x1 clusters (3 cluster rows), swizzle 2, row raster: panels of 4 and 2 tile rows
    cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=2, cluster=(2, 1)))
    assert pic.panel_outlines(cfg, 6 * 128, 4 * 128) == [(0, 0, 4, 4), (4, 0, 6, 4)]
    # swizzle 1: one panel per cluster row; swizzle >= the cluster rows: the whole grid
    one = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=1, cluster=(2, 1)))
    assert pic.panel_outlines(one, 6 * 128, 4 * 128) == [(0, 0, 2, 4), (2, 0, 4, 4), (4, 0, 6, 4)]
    wide = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=8, cluster=(2, 1)))
    assert pic.panel_outlines(wide, 6 * 128, 4 * 128) == [(0, 0, 6, 4)]
    # column raster: panels of swizzle cluster columns, full height
    col = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=3, cluster=(1, 2), raster="column"))
    assert pic.panel_outlines(col, 3 * 128, 9 * 128) == [(0, 0, 3, 6), (0, 6, 3, 9)]
    assert pic.cluster_outlines(col, 3 * 128, 3 * 128) == [(0, 0, 1, 2), (0, 2, 1, 3), (1, 0, 2, 2), (1, 2, 2, 3),
                                                          (2, 0, 3, 2), (2, 2, 3, 3)]
    r = pic.TileRect(1, 2, 3, 5)
    assert r.shape == (2, 3) and (1, 2) in r and (2, 4) in r and (3, 2) not in r and (1, 5) not in r


# ----------------------------------------------------------------------------------------------
# One wave's operand footprint
# ----------------------------------------------------------------------------------------------


def _elem_bytes(cfg):
    a, b = foot.operand_bytes(cfg.dtype)
    return (b, a) if cfg.swap_ab else (a, b)


def _brute_footprint(cfg, M, N, K, step, wave):
    """From the picture's own grid (split 0 stands for its tile, so split_k = 1 only)."""
    tm, tn = cfg.cta_tile
    tiles = sorted((m, n) for m, row in enumerate(step) for n, s in enumerate(row) if s == wave)
    rows, cols = sorted({m for m, _ in tiles}), sorted({n for _, n in tiles})
    hm = lambda m: min(tm, M - m * tm)  # noqa: E731
    wn = lambda n: min(tn, N - n * tn)  # noqa: E731
    a_el, b_el = _elem_bytes(cfg)
    a = ceil_div(int(sum(hm(m) for m in rows) * K * a_el * 2), 2)
    b = ceil_div(int(sum(wn(n) for n in cols) * K * b_el * 2), 2)
    naive = (ceil_div(int(sum(hm(m) for m, _ in tiles) * K * a_el * 2), 2)
             + ceil_div(int(sum(wn(n) for _, n in tiles) * K * b_el * 2), 2))
    return tiles, rows, cols, a, b, naive


FOOT = [c for c in CONFIGS if c.schedule.split_k == 1 and not c.schedule.stream_k]  # whole-K units only


@pytest.mark.parametrize("cfg", FOOT, ids=_ids(FOOT))
@pytest.mark.parametrize("M,N,K,W", [(1000, 1500, 512, 7), (4096, 4096, 4096, 66), (129, 17, 96, 3),
                                     (3000, 700, 1000, 132)])
def test_wave_footprint_matches_brute_force(cfg, M, N, K, W):
    g = cfg.grid(M, N)
    step, _ = pic.visit_grid(cfg, M, N, W)
    waves = range(g.waves(W))
    for wave in waves if len(waves) <= 12 else [*waves[:6], *waves[-6:]]:  # the first and last waves
        fp = pic.wave_operand_footprint(cfg, M, N, K, W, wave)
        tiles, rows, cols, a, b, naive = _brute_footprint(cfg, M, N, K, step, wave)
        assert fp["wave"] == wave and fp["tiles"] == tiles and fp["units"] == len(tiles)
        assert (fp["rows"], fp["cols"]) == (rows, cols)
        assert (fp["a_bytes"], fp["b_bytes"], fp["naive_bytes"]) == (a, b, naive)
        assert fp["bytes"] == a + b and fp["reuse"] == pytest.approx(naive / (a + b)) and fp["reuse"] >= 1
        assert fp["swap_ab"] == cfg.swap_ab


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids(CONFIGS))
def test_wave_footprint_agrees_with_schedule_footprint(cfg):
    M, N, K, W = 3000, 2000, 1000, 11
    per_wave = foot.wave_footprint(cfg, M, N, K, W)
    units = 0
    for f in per_wave:
        fp = pic.wave_operand_footprint(cfg, M, N, K, W, f.wave)
        units += fp["units"]
        assert fp["units"] == f.tiles
        # Both price a swap-AB kernel's rows as the weight (e2m1 for e4m3xe2m1).
        assert (fp["a_bytes"], fp["b_bytes"]) == (f.a_bytes, f.b_bytes)
    g = cfg.grid(M, N, K=K)
    pieces = sum(len(g.cta_tiles(v.cluster_row, v.cluster_col)) for wave in g.wave_visits(W) for v in wave)
    assert units == pieces == (g.tiles_m * g.tiles_n * g.splits if not cfg.schedule.stream_k else pieces)
    if cfg.schedule.stream_k:  # every tile at least once, the tail's split ones more often
        assert pieces >= g.tiles_m * g.tiles_n


def test_wave_footprint_by_hand_and_element_sizes():
    # 4 x 4 tiles of 128x128, swizzle 2, 4 workers: wave 0 is the 2x2 block at the top left.
    for dtype, tk, el in (("bf16", 64, 2), ("e4m3", 128, 1)):
        cfg = KernelConfig(tile=(128, 128, tk), dtype=dtype, schedule=TileSchedule(swizzle=2))
        fp = pic.wave_operand_footprint(cfg, 512, 512, 1024, 4, 0)
        assert fp["tiles"] == [(0, 0), (0, 1), (1, 0), (1, 1)] and fp["rows"] == fp["cols"] == [0, 1]
        assert fp["a_bytes"] == fp["b_bytes"] == 256 * 1024 * el
        assert fp["naive_bytes"] == 4 * 256 * 1024 * el and fp["reuse"] == 2.0
    # FP8 x FP4 on sm100a (not swap-AB): B (the columns) is e2m1, half a byte
    fp4 = KernelConfig(tile=(128, 128, 128), kernel="1sm", dtype="e4m3xe2m1", arch="sm100a",
                       schedule=TileSchedule(swizzle=2))
    fp = pic.wave_operand_footprint(fp4, 512, 512, 1024, 4, 0)
    assert (fp["a_bytes"], fp["b_bytes"]) == (256 * 1024, 128 * 1024)
    # swap-AB: the rows are the e2m1 weight
    swp = KernelConfig(tile=(64, 64, 128), kernel="pingpong", dtype="e4m3xe2m1", swap_ab=True,
                       schedule=TileSchedule(swizzle=2))
    fp = pic.wave_operand_footprint(swp, 256, 256, 1024, 4, 0)
    assert (fp["a_bytes"], fp["b_bytes"]) == (64 * 1024, 128 * 1024) and fp["swap_ab"]
    # split-K 2, one tile: two units, each reading half of K; the bytes are the whole K once
    sk = KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=TileSchedule(split_k=2))
    fp = pic.wave_operand_footprint(sk, 100, 50, 640, 2, 0)
    assert fp["units"] == 2 and fp["tiles"] == [(0, 0)]
    assert (fp["a_bytes"], fp["b_bytes"]) == (100 * 640 * 2, 50 * 640 * 2) and fp["reuse"] == 1.0


def test_wave_footprint_rejects_bad_arguments():
    cfg = HAND[0]
    with pytest.raises(ValueError, match=r"wave must be in \[0, 1\] \(2 waves of 8 workers\), got 2"):
        pic.wave_operand_footprint(cfg, 1024, 1024, 64, 8, 2)  # 4 x 4 clusters of 2x1 tiles
    with pytest.raises(ValueError, match=r"wave must be a non-negative int, got -1"):
        pic.wave_operand_footprint(cfg, 1024, 1024, 64, 4, -1)
    with pytest.raises(TypeError, match="wave must be an int"):
        pic.wave_operand_footprint(cfg, 1024, 1024, 64, 4, 0.0)
    with pytest.raises(ValueError, match=r"\bK\b"):
        pic.wave_operand_footprint(cfg, 1024, 1024, 0, 4, 0)
    with pytest.raises(ValueError, match="workers"):
        pic.wave_operand_footprint(cfg, 1024, 1024, 64, 0, 0)
    with pytest.raises(TypeError, match="config"):
        pic.wave_operand_footprint(None, 1024, 1024, 64, 4, 0)


# ----------------------------------------------------------------------------------------------
# Build status
# ----------------------------------------------------------------------------------------------


def test_build_status_names_a_config_that_cannot_be_built():
    s = pic.build_status(NEVER_BUILDABLE)
    assert s.startswith("cannot be built: ") and NEVER_BUILDABLE.kernel_rejection() in s
    assert pic.build_status(NEVER_BUILDABLE.name) == s  # names work too


def test_build_status_without_the_extension(monkeypatch):
    monkeypatch.setattr(pg._extension, "extension_available", lambda: False)
    assert pic.build_status(CATALOGUE[0]) == pic.NO_EXTENSION_STATUS == "extension not built here"
    assert pic.build_status(NEVER_BUILDABLE).startswith("cannot be built")  # known without the extension


def test_build_status_built_or_jit(monkeypatch):
    cfg = HAND[0]
    monkeypatch.setattr(pg._extension, "extension_available", lambda: True)
    monkeypatch.setattr(pg._extension, "built_configs", lambda arch=None: [cfg.name])
    assert pic.build_status(cfg) == "built"
    monkeypatch.setattr(pg._extension, "built_configs", lambda arch=None: [])
    monkeypatch.delenv("PGEMM_JIT", raising=False)
    assert pic.build_status(cfg) == pic.JIT_STATUS
    assert pic.JIT_STATUS == "not built — JIT-compiles on first use (persistent_gemm.precompile)"
    monkeypatch.setenv("PGEMM_JIT", "0")
    assert pic.build_status(cfg).startswith("not built — PGEMM_JIT=0")


def test_build_status_of_this_install():
    s = pic.build_status(CATALOGUE[0])
    if not pg.extension_available():
        assert s == pic.NO_EXTENSION_STATUS
    else:
        assert s == ("built" if CATALOGUE[0].name in pg.built_configs() else pic.JIT_STATUS) or "PGEMM_JIT=0" in s


# ----------------------------------------------------------------------------------------------
# Colours, legends, captions
# ----------------------------------------------------------------------------------------------


def test_wave_colours_are_discrete_and_cycle():
    P = pic.WAVE_PALETTE
    assert len(set(P)) == len(P) >= 10
    assert [pic.wave_colour(w) for w in range(len(P))] == list(P)  # the palette first
    assert all(pic.wave_colour(w) != pic.wave_colour(w + 1) for w in range(2 * pic.SERIES_COLOURS))
    assert "#d62728" not in P  # red is the wave boundary
    with pytest.raises(ValueError, match="wave"):
        pic.wave_colour(-1)
    with pytest.raises(ValueError, match="worker"):
        pic.worker_colour(-1)
    assert pic.text_colour("#000000") == "white" and pic.text_colour("#ffffff") == "black"
    assert pic.text_colour("#1f77b4") == "white" and pic.text_colour("#ffbb78") == "black"


def test_every_wave_and_worker_drawn_has_its_own_colour():
    """Newcomer 12-07 #10: waves 12-15 of an 8192^2 schedule looked like waves 0-3 (12 colours,
    cycled), and 66 workers shared 20. Every colour of a series is distinct up to SERIES_COLOURS,
    which covers a worker per SM of the largest GPU here (148) and the waves of a long problem;
    none is red (the wave boundaries), magenta (the highlight) or near white (unvisited tiles)."""
    n = pic.SERIES_COLOURS
    assert n >= 256
    colours = [pic.series_colour(i) for i in range(n)]
    assert len(set(colours)) == n, "two waves (or workers) of one picture share a colour"
    assert [pic.series_colour(i) for i in range(n, 2 * n)] == colours  # then they repeat, in order
    assert [pic.wave_colour(i) for i in range(n)] == [pic.worker_colour(i) for i in range(n)] == colours
    for c in colours:
        r, g, b = (int(c[i:i + 2], 16) / 255 for i in (1, 3, 5))
        h, lightness, s = colorsys.rgb_to_hls(r, g, b)
        assert lightness <= 0.8, c  # not near the white of unvisited tiles
        if c not in pic.WAVE_PALETTE:
            assert 20 / 360 <= h <= 290 / 360, c  # no red, pink or magenta hue
    # The newcomer's pictures: 16 waves of 132 workers; 66 workers of 2x1 clusters.
    waves = pic.panel_data("sm90a_bf16_128x256x64_c1x1_sw8_row_coop", 8192, 8192)
    drawn = {s for row in waves.step for s in row}
    assert len(drawn) == 16 and len({pic.wave_colour(s) for s in drawn}) == 16
    workers = pic.panel_data("sm90a_bf16_128x256x64_c2x1_sw1_row_coop", 8192, 8192, color_by="worker")
    drawn = {w for row in workers.worker for w in row}
    assert len(drawn) == 66 and len({pic.worker_colour(w) for w in drawn}) == 66
    assert "each its own colour" in pic.legend_labels(66, "worker")[-1]


def test_legend_labels_are_capped():
    assert pic.legend_labels(3) == ["wave 0", "wave 1", "wave 2"]
    assert pic.legend_labels(12) == [f"wave {i}" for i in range(12)]
    many = pic.legend_labels(30)
    assert len(many) == pic.LEGEND_MAX + 1 == 13 and many[:12] == [f"wave {i}" for i in range(12)]
    assert many[-1].startswith("…") and "30 waves" in many[-1] and "repeat" not in many[-1]
    w = pic.legend_labels(25, "worker", cap=4)
    assert w[:4] == ["worker 0", "worker 1", "worker 2", "worker 3"] and "25 workers" in w[4]
    past = pic.legend_labels(pic.SERIES_COLOURS + 1)
    assert f"colours repeat every {pic.SERIES_COLOURS}" in past[-1]
    assert pic.legend_labels(0) == []


def test_format_bytes():
    assert pic.format_bytes(512) == "512 B"
    assert pic.format_bytes(3 * 2**10) == "3.0 KiB"
    assert pic.format_bytes(20 * 2**20) == "20.0 MiB"
    assert pic.format_bytes(1.5 * 2**30) == "1.5 GiB"


def test_panel_data_says_what_the_picture_shows(monkeypatch):
    monkeypatch.setattr(pg._extension, "extension_available", lambda: False)
    cfg = "sm90a_bf16_128x256x64_c2x1_sw4_row_coop"
    p = pic.panel_data(cfg, 3000, 6000, 22, K=4096)
    assert p.annotate and p.true_aspect and p.waves == 14 and p.footprint["wave"] == 0
    assert p.title[0] == cfg and "22 workers, 14 waves" in p.title[1] and p.title[2] == "extension not built here"
    text = "\n".join(p.caption)
    assert pic.NUMBER_CAPTION in text and "2x1 cluster" in text
    assert "swizzle panels of 4 cluster rows" in text and "red lines = wave boundaries" in text
    fp = p.footprint
    assert f"= {pic.format_bytes(fp['a_bytes'])} + {pic.format_bytes(fp['b_bytes'])}" in text
    assert f"reuse {fp['reuse']:.1f}x" in text and "hatched" in text  # 3000 is not a multiple of 128
    assert p.clusters == pic.cluster_outlines(cfg, 3000, 6000) and p.panels == pic.panel_outlines(cfg, 3000, 6000)
    # 1x1 clusters say so; no K: the reuse without bytes; swizzle 1 is plain raster order
    q = pic.panel_data(KernelConfig(tile=(128, 128, 64), schedule=TileSchedule()), 1024, 1024, 8, footprint_wave=1)
    text = "\n".join(q.caption)
    assert "pass K= for bytes" in text and "clusters are 1x1" in text and "swizzle 1 = plain row raster" in text
    assert "hatched" not in text and q.footprint["wave"] == 1
    # too many tiles to label: no sentence about the numbers; footprint off
    big = pic.panel_data(CATALOGUE[0], 80 * 128, 40 * 256, footprint_wave=None)
    assert not big.annotate and big.footprint is None and pic.NUMBER_CAPTION not in "\n".join(big.caption)
    # split-K and highlight in the title
    sk = pic.panel_data(HAND[5], 512, 256, 5, K=640, highlight=(1, 2))
    assert "split-K 3" in sk.title[1] and "tile (1, 2): worker" in sk.title[1] and sk.highlight == (1, 2)


def test_swap_ab_axes_are_named_as_the_op_sees_them():
    """Newcomer 12-07 #10: explain(1, 8192, 8192, render=...) drew the swap-AB grid (the op's N
    down, its M across) under axes reading "M (rows)" 0-8192 and "N" 0-16."""
    swap = pic.panel_data("sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab", 8192, 1, K=8192)  # (N, M) = (8192, 1)
    assert "swap-AB" in swap.title[1] and swap.grid.M == 8192
    assert swap.ylabel.startswith("N (weight rows") and swap.xlabel.startswith("M (tokens")
    ticks = pic.panel_data("sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab", 8192, 1, tile_ticks=True)
    assert "64 weight rows each" in ticks.ylabel and "16 tokens each" in ticks.xlabel
    plain = pic.panel_data(CATALOGUE[0], 4096, 4096)
    assert plain.ylabel == "M (rows, elements)" and plain.xlabel == "N (columns, elements)"


def test_panel_data_aspect():
    decode = pic.panel_data("sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab", 4096, 16, K=4096)
    assert not decode.true_aspect and any("not to scale" in c for c in decode.caption)
    assert any(c.startswith("swap-AB") for c in decode.caption)
    forced = pic.panel_data("sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab", 4096, 16, true_aspect=True)
    assert forced.true_aspect and not any("not to scale" in c for c in forced.caption)
    square = pic.panel_data(CATALOGUE[0], 4096, 4096, true_aspect=False, tile_ticks=True)
    assert not square.true_aspect and square.tile_ticks
    assert pic.panel_data(CATALOGUE[0], 4096, 4096).true_aspect


def test_panel_data_rejects_bad_arguments():
    cfg = HAND[0]
    with pytest.raises(ValueError, match=r"footprint_wave must be None or in \[0, 1\] \(2 waves\), got 2"):
        pic.panel_data(cfg, 1024, 1024, 8, footprint_wave=2)
    with pytest.raises(ValueError, match="footprint_wave"):
        pic.panel_data(cfg, 1024, 1024, footprint_wave=-1)
    with pytest.raises(TypeError, match="footprint_wave must be an int"):
        pic.panel_data(cfg, 1024, 1024, footprint_wave="0")
    with pytest.raises(TypeError, match="true_aspect must be None, True or False"):
        pic.panel_data(cfg, 1024, 1024, true_aspect="yes")
    with pytest.raises(TypeError, match="tile_ticks must be True or False"):
        pic.panel_data(cfg, 1024, 1024, tile_ticks=1)
    with pytest.raises(ValueError, match="color_by"):
        pic.panel_data(cfg, 1024, 1024, color_by="step")


def _no_matplotlib(monkeypatch):
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg",
                "persistent_gemm.tools.picture_layers"):
        monkeypatch.setitem(sys.modules, mod, None)


def test_plot_checks_its_arguments_before_matplotlib(monkeypatch, tmp_path):
    _no_matplotlib(monkeypatch)
    png = tmp_path / "x.png"
    with pytest.raises(ValueError, match="footprint_wave"):
        pic.plot(HAND[0], 1024, 1024, png, workers=4, footprint_wave=99)
    with pytest.raises(TypeError, match="true_aspect"):
        pic.plot(HAND[0], 1024, 1024, png, true_aspect=1)
    with pytest.raises(ValueError, match="configs must hold exactly 2 configs to compare, got 3"):
        pic.plot_compare([HAND[0]] * 3, 1024, 1024, png)
    with pytest.raises(ValueError, match="configs must hold exactly 2 configs to compare, got 1"):
        pic.plot_compare([HAND[0]], 1024, 1024, png)
    with pytest.raises(TypeError, match="configs must be a sequence"):
        pic.plot_compare(HAND[0].name, 1024, 1024, png)
    with pytest.raises(TypeError, match="configs must be a sequence"):
        pic.plot_compare(HAND[0], 1024, 1024, png)
    with pytest.raises(ValueError, match="workers must be None, an int or a pair"):
        pic.plot_compare(HAND[:2], 1024, 1024, png, workers=(1, 2, 3))
    with pytest.raises(TypeError, match="unexpected keyword argument.*colour_by"):
        pic.plot_compare(HAND[:2], 1024, 1024, png, colour_by="wave")
    with pytest.raises(ValueError, match="footprint_wave"):
        pic.plot_compare(HAND[:2], 1024, 1024, png, workers=4, footprint_wave=50)
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        pic.plot(HAND[0], 1024, 1024, png)
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        pic.plot_compare(HAND[:2], 1024, 1024, png)
    assert not png.exists()


# ----------------------------------------------------------------------------------------------
# Drawing (needs matplotlib)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg,M,N,kw", [
    ("sm90a_bf16_128x256x64_c2x1_sw4_row_coop", 3000, 6000, dict(workers=22, K=4096)),
    ("sm90a_bf16_128x64x64_c1x2_sw3_column_pp", 2000, 3000,
     dict(workers=9, color_by="worker", highlight=(3, 5), footprint_wave=None)),
    ("sm90a_bf16_64x16x128_c1x1_sw1_row_sk4_pp_swapab", 4096, 16, dict(K=4096)),
    ("sm90a_e4m3xe2m1_64x64x128_c1x1_sw8_row_pp_swapab", 4096, 512, dict(K=4096, footprint_wave=1, tile_ticks=True)),
    (NEVER_BUILDABLE, 2048, 2048, dict(K=2048, true_aspect=False)),
    (CATALOGUE[0], 80 * 128, 40 * 256, {}),
], ids=["clusters", "worker", "decode", "fp4", "unbuildable", "big"])
def test_plot_writes_png(tmp_path, cfg, M, N, kw):
    pytest.importorskip("matplotlib")
    p = tmp_path / "s.png"
    assert pic.plot(cfg, M, N, p, **kw) == p
    assert p.read_bytes()[:8] == PNG_MAGIC


def test_plot_compare_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "c.png"
    names = ["sm90a_bf16_128x256x64_c2x1_sw1_row_coop", "sm90a_bf16_128x256x64_c2x1_sw8_row_coop"]
    assert pic.plot_compare(names, 4096, 4096, p, K=4096) == p
    assert p.read_bytes()[:8] == PNG_MAGIC
    q = tmp_path / "c2.png"  # config objects, a pair of worker counts, different grids and aspects
    assert pic.plot_compare((HAND[1], "sm90a_bf16_64x16x128_c1x1_sw1_row_pp_swapab"), 2048, 128, str(q),
                            workers=(7, 40), footprint_wave=0, color_by="worker") == str(q)
    assert q.read_bytes()[:8] == PNG_MAGIC
