"""CPU tests of the persistent tile schedule reference, the config names, the per-wave
footprint, the plot and the ``python -m persistent_gemm schedule`` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistent_gemm import schedule as sch
from persistent_gemm.catalogue import (
    CATALOGUE,
    DTYPE_BYTES,
    KERNEL_STYLES,
    ConfigError,
    KernelConfig,
    lookup,
)
from persistent_gemm.schedule import ScheduleGrid, TileSchedule, ceil_div

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CLUSTERS = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4)]
CATALOGUE_TILES = sorted({c.cta_tile for c in CATALOGUE})
# The catalogue's (tile_m, tile_n) plus a few other legal CTA shapes, so the property tests
# do not hinge on the catalogue having a single tile shape.
TILES = sorted(set(CATALOGUE_TILES) | {(128, 128), (256, 128), (64, 256)})

PROPS = settings(deadline=None, max_examples=60)
FAST = settings(deadline=None, max_examples=150)

schedules = st.builds(
    TileSchedule,
    swizzle=st.integers(1, 16),
    cluster=st.sampled_from(CLUSTERS),
    raster=st.sampled_from(["row", "column"]),
)
dims = st.integers(1, 20000)


@st.composite
def grids(draw, batch=st.just(1), sizes=dims):
    s = draw(schedules)
    tm, tn = draw(st.sampled_from(TILES))
    return s.over(M=draw(sizes), N=draw(sizes), tile=(tm, tn), batch=draw(batch))


def workers_for(g: ScheduleGrid):
    # 1..300, and sometimes more workers than there are cluster ids
    return st.one_of(st.integers(1, 300), st.integers(g.num_ids, g.num_ids + 40))


# ----------------------------------------------------------------------------------------------
# ScheduleGrid properties
# ----------------------------------------------------------------------------------------------


@PROPS
@given(g=grids(batch=st.integers(1, 2)))
def test_coord_is_a_bijection_onto_the_cluster_grid(g):
    seen = [g.coord_batched(t) for t in range(g.num_ids)]
    assert g.num_ids == g.batch * g.clusters_m * g.clusters_n
    assert len(set(seen)) == g.num_ids
    assert set(seen) == {
        (l, r, c) for l in range(g.batch) for r in range(g.clusters_m) for c in range(g.clusters_n)
    }
    # the unbatched coord is the batched one with the batch dropped
    assert all(g.coord(t) == seen[t][1:] for t in range(0, g.num_ids, max(1, g.num_ids // 50)))
    for t in (-1, g.num_ids):
        with pytest.raises(IndexError):
            g.coord(t)


@PROPS
@given(data=st.data(), g=grids())
def test_every_tile_produced_exactly_once_by_one_worker(data, g):
    W = data.draw(workers_for(g), label="workers")
    producer = {}
    for w in range(W):
        steps = []
        for v in g.tiles_of(w, W):
            assert 0 <= v.tile_id < g.num_ids
            assert v.tile_id % W == w
            steps.append(v.step)
            assert v.tile_id == w + v.step * W
            for m, n in g.cta_tiles(v.cluster_row, v.cluster_col):
                assert 0 <= m < g.tiles_m and 0 <= n < g.tiles_n
                assert (m, n) not in producer, f"tile {(m, n)} produced twice"
                producer[(m, n)] = w
        assert steps == list(range(len(steps))), "steps must be 0, 1, 2, ... per worker"
        assert len(steps) == len(range(w, g.num_ids, W))
    assert len(producer) == g.tiles_m * g.tiles_n
    if W >= g.num_ids:
        assert g.waves(W) == 1


@FAST
@given(g=grids(batch=st.integers(1, 3), sizes=st.integers(1, 6000)), W=st.integers(1, 300))
def test_order_is_sorted_by_worker_then_step_and_covers_all_ids(g, W):
    order = g.order(W)
    assert len(order) == g.num_ids
    assert order == sorted(order, key=lambda r: (r[0], r[1]))
    assert {(l, r, c) for _, _, l, r, c in order} == {g.coord_batched(t) for t in range(g.num_ids)}
    assert max(s for _, s, *_ in order) == g.waves(W) - 1


@FAST
@given(g=grids())
def test_cta_tiles_drop_only_tail_ctas(g):
    cm, cn = g.schedule.cluster
    for r, c in {(0, 0), (g.clusters_m - 1, g.clusters_n - 1), (g.clusters_m - 1, 0), (0, g.clusters_n - 1)}:
        full = [(r * cm + i, c * cn + j) for i in range(cm) for j in range(cn)]
        assert g.cta_tiles(r, c) == [(m, n) for m, n in full if m < g.tiles_m and n < g.tiles_n]
        assert g.cta_tiles(r, c), "every cluster owns at least one in-bounds tile"


# ----------------------------------------------------------------------------------------------
# Known orders
# ----------------------------------------------------------------------------------------------


def triton_group_m(pid: int, num_pid_m: int, num_pid_n: int, GROUP_M: int) -> tuple[int, int]:
    """Triton's matmul tutorial's GROUP_SIZE_M swizzle, from its definition."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@FAST
@given(
    cluster=st.sampled_from(CLUSTERS),
    tile=st.sampled_from(TILES),
    M=dims,
    N=dims,
)
def test_swizzle_1_is_plain_raster_order(cluster, tile, M, N):
    row = TileSchedule(swizzle=1, cluster=cluster, raster="row").over(M, N, tile)
    col = TileSchedule(swizzle=1, cluster=cluster, raster="column").over(M, N, tile)
    Mc, Nc = row.clusters_m, row.clusters_n
    assert [row.coord(t) for t in range(row.num_ids)] == [(r, c) for r in range(Mc) for c in range(Nc)]
    assert [col.coord(t) for t in range(col.num_ids)] == [(r, c) for c in range(Nc) for r in range(Mc)]


@FAST
@given(
    pid_m=st.integers(1, 60),
    pid_n=st.integers(1, 60),
    group=st.integers(1, 16),
    tile=st.sampled_from(TILES),
    rem=st.tuples(st.integers(0, 127), st.integers(0, 127)),
)
def test_row_raster_1x1_matches_triton_group_size_m(pid_m, pid_n, group, tile, rem):
    tm, tn = tile
    M, N = pid_m * tm - rem[0] % tm, pid_n * tn - rem[1] % tn
    g = TileSchedule(swizzle=group, cluster=(1, 1), raster="row").over(M, N, tile)
    assert (g.clusters_m, g.clusters_n) == (pid_m, pid_n)
    for pid in range(g.num_ids):
        assert g.coord(pid) == triton_group_m(pid, pid_m, pid_n, group), pid


@FAST
@given(
    swizzle=st.integers(1, 16),
    cluster=st.sampled_from(CLUSTERS),
    tile=st.sampled_from(TILES),
    M=st.integers(1, 8000),
    N=st.integers(1, 8000),
)
def test_column_raster_is_transposed_row_raster(swizzle, cluster, tile, M, N):
    (cm, cn), (tm, tn) = cluster, tile
    col = TileSchedule(swizzle=swizzle, cluster=(cm, cn), raster="column").over(M, N, (tm, tn))
    row = TileSchedule(swizzle=swizzle, cluster=(cn, cm), raster="row").over(N, M, (tn, tm))
    assert col.num_ids == row.num_ids
    for t in range(col.num_ids):
        r, c = row.coord(t)
        assert col.coord(t) == (c, r)
        assert col.cta_tiles(c, r) == sorted((m, n) for n, m in row.cta_tiles(r, c))


def test_last_panel_is_narrowed_not_padded():
    # 5 cluster rows, swizzle 2: panels of rows {0,1}, {2,3}, {4}; Nc = 3
    g = TileSchedule(swizzle=2).over(M=5 * 128, N=3 * 128, tile=(128, 128))
    assert (g.clusters_m, g.clusters_n, g.num_ids) == (5, 3, 15)
    coords = [g.coord(t) for t in range(g.num_ids)]
    assert coords[:6] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert coords[6:12] == [(2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2)]
    assert coords[12:] == [(4, 0), (4, 1), (4, 2)]  # one row wide: a plain sweep along N
    # the docstring example
    g = TileSchedule(swizzle=2).over(M=3 * 128, N=2 * 128, tile=(128, 128))
    assert [g.coord(t) for t in range(g.num_ids)] == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    # column raster: the last panel of columns is narrowed the same way
    g = TileSchedule(swizzle=4, raster="column").over(M=2 * 128, N=6 * 128, tile=(128, 128))
    assert [g.coord(t) for t in range(8, 12)] == [(0, 4), (0, 5), (1, 4), (1, 5)]


@FAST
@given(g=grids())
def test_panels_are_contiguous_blocks_of_ids(g):
    s = g.schedule.swizzle
    major = g.clusters_m if g.schedule.raster == "row" else g.clusters_n
    minor = g.clusters_n if g.schedule.raster == "row" else g.clusters_m
    for t in range(0, g.num_ids, max(1, g.num_ids // 200)):
        r, c = g.coord(t)
        a = r if g.schedule.raster == "row" else c
        panel = t // (s * minor)
        assert panel * s <= a < min(major, panel * s + s)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(swizzle=0), ValueError, r"swizzle must be in \[1, 64\]"),
        (dict(swizzle=65), ValueError, r"swizzle must be in \[1, 64\]"),
        (dict(swizzle=-3), ValueError, r"swizzle must be in"),
        (dict(swizzle=2.0), TypeError, r"swizzle must be an int"),
        (dict(swizzle=True), TypeError, r"swizzle must be an int"),
        (dict(swizzle="8"), TypeError, r"swizzle must be an int"),
        (dict(cluster=(3, 1)), ValueError, r"cluster extents must each be one of"),
        (dict(cluster=(1, 8)), ValueError, r"cluster extents must each be one of"),
        (dict(cluster=(4, 4)), ValueError, r"exceeds the portable maximum of 8"),
        (dict(cluster=(2,)), ValueError, r"cluster must be a pair of ints"),
        (dict(cluster=(2, 1, 1)), ValueError, r"cluster must be a pair of ints"),
        (dict(cluster=(2.0, 1)), ValueError, r"cluster must be a pair of ints"),
        (dict(raster="diagonal"), ValueError, r"raster must be 'row' or 'column'"),
        (dict(raster="Row"), ValueError, r"raster must be 'row' or 'column'"),
    ],
)
def test_tile_schedule_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TileSchedule(**kwargs)


def test_tile_schedule_accepts_list_cluster_and_normalises_it():
    s = TileSchedule(swizzle=4, cluster=[2, 1])
    assert s.cluster == (2, 1) and (s.cluster_m, s.cluster_n) == (2, 1)
    assert s.replace(swizzle=8) == TileSchedule(swizzle=8, cluster=(2, 1))
    assert hash(s) == hash(TileSchedule(swizzle=4, cluster=(2, 1)))


@pytest.mark.parametrize("field", ["M", "N", "tile_m", "tile_n", "batch"])
def test_schedule_grid_validation(field):
    kw = dict(schedule=TileSchedule(), M=256, N=256, tile_m=128, tile_n=128, batch=1)
    kw[field] = 0
    with pytest.raises(ValueError, match=f"{field} must be a positive int"):
        ScheduleGrid(**kw)


def test_tiles_of_rejects_bad_worker():
    g = TileSchedule().over(1024, 1024, (128, 128))
    with pytest.raises(ValueError, match=r"worker 4 outside \[0, 4\)"):
        list(g.tiles_of(4, workers=4))
    with pytest.raises(ValueError, match="outside"):
        list(g.tiles_of(-1, workers=4))


def test_default_workers():
    assert sch.default_workers(132, TileSchedule(cluster=(2, 1))) == 66
    assert sch.default_workers(132, TileSchedule(cluster=(4, 2))) == 16
    assert sch.default_workers(132, TileSchedule()) == 132
    assert sch.default_workers(1, TileSchedule(cluster=(2, 2))) == 1


# ----------------------------------------------------------------------------------------------
# Canonical names
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CATALOGUE, ids=lambda c: c.name)
def test_catalogue_name_round_trip(cfg):
    assert cfg.rejection() is None
    back = KernelConfig.from_name(cfg.name)
    assert back == cfg
    assert back.name == cfg.name == str(cfg)
    assert lookup(cfg.name) is cfg
    assert cfg.template_args()["name"] == cfg.name


def test_catalogue_names_are_unique():
    names = [c.name for c in CATALOGUE]
    assert len(names) == len(set(names))


@st.composite
def valid_configs(draw):
    arch = draw(st.sampled_from(["sm90a", "sm100a"]))
    kernel = draw(st.sampled_from(KERNEL_STYLES[arch]))
    dtypes = ["bf16", "fp16", "e4m3"] if arch == "sm90a" else ["bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1"]
    dtype = draw(st.sampled_from(dtypes))
    tk = draw(st.sampled_from([64, 128])) // DTYPE_BYTES[dtype]
    tm = draw(st.sampled_from({"cooperative": [128, 256], "pingpong": [64, 128], "1sm": [64, 128], "2sm": [128, 256]}[kernel]))
    tn = 16 * draw(st.integers(1, 16))
    clusters = [c for c in CLUSTERS if kernel != "2sm" or c[0] % 2 == 0]
    schedule = TileSchedule(
        swizzle=draw(st.integers(1, 64)),
        cluster=draw(st.sampled_from(clusters)),
        raster=draw(st.sampled_from(["row", "column"])),
    )
    stages = draw(st.one_of(st.none(), st.integers(2, 12)))
    return KernelConfig(tile=(tm, tn, tk), schedule=schedule, stages=stages, kernel=kernel, dtype=dtype, arch=arch)


@settings(deadline=None, max_examples=300)
@given(cfg=valid_configs())
def test_generated_config_name_round_trip(cfg):
    name = cfg.name
    back = KernelConfig.from_name(name)
    assert back == cfg
    assert back.name == name


@settings(deadline=None, max_examples=300)
@given(
    arch=st.sampled_from(["sm90a", "sm100a"]),
    kernel=st.sampled_from(["cooperative", "pingpong", "1sm", "2sm"]),
    dtype=st.sampled_from(["bf16", "fp16", "e4m3", "mxfp8", "e4m3xe2m1"]),
    tile=st.tuples(st.sampled_from([32, 64, 128, 256]), st.integers(1, 20).map(lambda k: 16 * k - 8 * (k % 3 == 0)), st.sampled_from([32, 64, 128, 256])),
    schedule=schedules,
    stages=st.one_of(st.none(), st.integers(0, 14)),
)
def test_any_config_is_valid_and_round_trips_or_raises_config_error_with_a_reason(arch, kernel, dtype, tile, schedule, stages):
    try:
        cfg = KernelConfig(tile=tile, schedule=schedule, stages=stages, kernel=kernel, dtype=dtype, arch=arch)
    except ConfigError as e:
        msg = str(e)
        assert msg.startswith("invalid kernel config: ") and len(msg) > len("invalid kernel config: ") + 10
        # spelled as a name, the same config is rejected for the same reason
        token = {"cooperative": "coop", "pingpong": "pp", "1sm": "1sm", "2sm": "2sm"}[kernel]
        name = (
            f"{arch}_{dtype}_{tile[0]}x{tile[1]}x{tile[2]}_c{schedule.cluster_m}x{schedule.cluster_n}"
            f"_sw{schedule.swizzle}_{schedule.raster}_{token}" + ("" if stages is None else f"_s{stages}")
        )
        with pytest.raises(ConfigError) as again:
            KernelConfig.from_name(name)
        assert str(again.value) == msg
        return
    assert cfg.rejection() is None
    assert KernelConfig.from_name(cfg.name) == cfg


@pytest.mark.parametrize(
    "name, match",
    [
        ("", r"is not of the form"),
        ("sm80_bf16_128x256x64_c2x1_sw8_row_coop", r"is not of the form"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_extra", r"is not of the form"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_diag_coop", r"is not of the form"),
        ("sm90a_int8_128x256x64_c2x1_sw8_row_coop", r"is not of the form"),
        ("SM90A_BF16_128X256X64_C2X1_SW8_ROW_COOP", r"is not of the form"),
        ("sm90a_bf16_128x256x64_c3x1_sw8_row_coop", r"cluster extents must each be one of"),
        ("sm90a_bf16_128x256x64_c4x4_sw8_row_coop", r"exceeds the portable maximum"),
        ("sm90a_bf16_128x256x64_c2x1_sw0_row_coop", r"swizzle must be in \[1, 64\]"),
        ("sm90a_bf16_128x256x64_c2x1_sw65_row_coop", r"swizzle must be in \[1, 64\]"),
        ("sm90a_bf16_128x256x128_c2x1_sw8_row_coop", r"tile_k=128 x 2 B is not one 64 B or 128 B"),
        ("sm90a_bf16_64x256x64_c2x1_sw8_row_coop", r"tile_m must be 128 or 256"),
        ("sm90a_bf16_256x256x64_c2x1_sw8_row_pp", r"tile_m must be 64 or 128"),
        ("sm90a_bf16_128x250x64_c2x1_sw8_row_coop", r"multiple of 16"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_1sm", r"does not exist on sm90a"),
        ("sm100a_bf16_128x256x64_c2x1_sw8_row_coop", r"does not exist on sm100a"),
        ("sm90a_mxfp8_128x256x128_c2x1_sw8_row_coop", r"needs block-scaled tensor cores"),
        ("sm100a_bf16_128x256x64_c1x1_sw8_row_2sm", r"cluster_m must be even"),
        ("sm100a_bf16_256x256x64_c2x1_sw8_row_1sm", r"1sm UMMA needs tile_m in"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_s1", r"stages must be None"),
        ("sm90a_bf16_128x256x64_c2x1_sw8_row_coop_s13", r"stages must be None"),
    ],
)
def test_invalid_names_raise_config_error_with_reason(name, match):
    with pytest.raises(ConfigError, match=match):
        KernelConfig.from_name(name)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(arch="sm80"), r"arch must be one of"),
        (dict(dtype="int8"), r"dtype must be one of"),
        (dict(kernel="2sm"), r"kernel style '2sm' does not exist on sm90a"),
        (dict(tile=(128, 256)), r"tile must be \(tile_m, tile_n, tile_k\)"),
        (dict(schedule=(8, (2, 1), "row")), r"schedule must be a TileSchedule"),
        (dict(tile=(128, 256, 32), dtype="e4m3"), r"tile_k=32 x 1 B"),
        (dict(dtype="e4m3xe2m1"), r"needs block-scaled"),
    ],
)
def test_invalid_configs_raise_config_error_with_reason(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        KernelConfig(**kwargs)
    assert issubclass(ConfigError, ValueError)


def test_lookup_unknown_name_lists_the_catalogue():
    with pytest.raises(ConfigError, match=r"unknown config 'nope'; the catalogue has: .*sm90a_bf16_128x256x64_c2x1_sw8_row_coop"):
        lookup("nope")


# ----------------------------------------------------------------------------------------------
# Footprint
# ----------------------------------------------------------------------------------------------

BF16_CFG = "sm90a_bf16_128x256x64_c2x1_sw{}_row_coop"


def test_swizzle_8_moves_fewer_bytes_than_swizzle_1_on_8192_cube():
    M = N = K = 8192
    W = sch.default_workers(132, TileSchedule(cluster=(2, 1)))
    assert W == 66
    s1 = sch.footprint_summary(BF16_CFG.format(1), M, N, K, W)
    s8 = sch.footprint_summary(BF16_CFG.format(8), M, N, K, W)
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
    fps = sch.wave_footprint(cfg, M, N, K, W)
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
    s = sch.footprint_summary(cfg, M, N, K, W, footprints=fps)
    assert (s["a_panel_loads"], s["b_panel_loads"], s["panel_loads"]) == (12, 11, 23)
    assert s["total_bytes"] == 335360
    assert s["compulsory_bytes"] == (416 + 500) * 64 * 2 == 117248
    assert s["max_bytes"] == A(384) + B(244)
    assert s["mean_bytes"] == pytest.approx(335360 / 6)
    assert s == sch.footprint_summary(cfg.name, M, N, K, W)  # a name works as well


def test_footprint_excludes_tail_ctas_and_handles_more_workers_than_ids():
    # tile rows 0..2 in 2x1 clusters: cluster row 1 holds tile rows 2 and 3; row 3 is a tail CTA
    cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(cluster=(2, 1)))
    (f,) = sch.wave_footprint(cfg, 384, 256, 1000, workers=10)
    assert (f.visits, f.tiles, f.a_panels, f.b_panels) == (4, 6, 3, 2)
    assert (f.a_bytes, f.b_bytes) == (384 * 1000 * 2, 256 * 1000 * 2)


def test_footprint_fp4_b_operand_is_half_a_byte():
    cfg = KernelConfig(tile=(128, 128, 128), kernel="1sm", dtype="e4m3xe2m1", arch="sm100a")
    assert sch.operand_bytes("e4m3xe2m1") == (1, 0.5)
    fps = sch.wave_footprint(cfg, 256, 256, 128, workers=1)
    assert [(f.a_bytes, f.b_bytes) for f in fps] == [(128 * 128, 128 * 128 // 2)] * 4
    # an odd count of FP4 elements rounds up to whole bytes
    (f,) = sch.wave_footprint(cfg, 1, 1, 3, workers=1)
    assert (f.a_bytes, f.b_bytes) == (3, 2)
    s = sch.footprint_summary(cfg, 256, 256, 128, workers=1)
    assert s["compulsory_bytes"] == 256 * 128 + 256 * 128 // 2


@PROPS
@given(
    cfg=st.sampled_from(CATALOGUE).flatmap(
        lambda c: schedules.map(lambda s: KernelConfig(c.tile, s, c.stages, c.kernel, c.dtype, c.arch))
        if c.kernel != "2sm"
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
    fps = sch.wave_footprint(cfg, M, N, K, W, batch=batch)
    assert len(fps) == g.waves(W)
    ms, ns, tiles = defaultdict(set), defaultdict(set), defaultdict(int)
    for w, step, l, r, c in g.order(W):
        for m, n in g.cta_tiles(r, c):
            ms[step].add((l, m))
            ns[step].add((l, n))
            tiles[step] += 1
    a_el, b_el = sch.operand_bytes(cfg.dtype)
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
    s = sch.footprint_summary(cfg, M, N, K, W, batch=batch, footprints=fps)
    assert s["total_bytes"] >= s["compulsory_bytes"]
    if W >= g.num_ids:
        assert s["waves"] == 1 and s["total_bytes"] == s["compulsory_bytes"]


def test_footprint_argument_errors():
    with pytest.raises(ValueError, match="K must be a positive int"):
        sch.wave_footprint(CATALOGUE[0], 128, 128, 0, 1)
    with pytest.raises(ValueError, match="workers must be a positive int"):
        sch.wave_footprint(CATALOGUE[0], 128, 128, 64, 0)
    with pytest.raises(ConfigError):
        sch.wave_footprint("not_a_config", 128, 128, 64, 1)


def test_format_footprint_and_summary():
    fps = sch.wave_footprint(BF16_CFG.format(8), 8192, 8192, 8192, 66)
    table = sch.format_footprint(fps)
    lines = table.splitlines()
    assert lines[0].split() == ["wave", "ids", "tiles", "A", "panels", "B", "panels", "A", "MiB", "B", "MiB", "total", "MiB"]
    assert len(lines) == 2 + len(fps)
    assert lines[2].split() == ["0", "66", "132", "16", "9", "32.0", "36.0", "68.0"]
    short = sch.format_footprint(fps, max_rows=4).splitlines()
    assert len(short) == 2 + 4 + 1 and short[4].strip() == "..."
    assert short[-1] == lines[-1]
    text = sch.format_summary(sch.footprint_summary(BF16_CFG.format(8), 8192, 8192, 8192, 66, footprints=fps))
    assert "1168.0 MiB" in text and "4.56x" in text


# ----------------------------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------------------------


def test_visit_grid_matches_order():
    cfg = KernelConfig(tile=(128, 128, 64), schedule=TileSchedule(swizzle=3, cluster=(2, 2), raster="column"))
    M, N, W = 1000, 1500, 5
    step, worker = sch.visit_grid(cfg, M, N, W)
    g = cfg.schedule.over(M, N, (128, 128))
    assert len(step) == g.tiles_m and all(len(r) == g.tiles_n for r in step)
    for w, s, _, r, c in g.order(W):
        for m, n in g.cta_tiles(r, c):
            assert (step[m][n], worker[m][n]) == (s, w)
    assert all(v >= 0 for row in step for v in row)


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    small = tmp_path / "small.png"
    assert sch.plot("sm90a_bf16_128x256x64_c2x1_sw4_row_coop", 1500, 3000, small, workers=7) == small
    assert small.read_bytes()[:8] == PNG_MAGIC
    big = tmp_path / "big.png"  # 80 x 40 tiles: too many to label, still drawn
    assert sch.plot(CATALOGUE[0], 80 * 128, 40 * 256, str(big)) == str(big)
    assert big.read_bytes()[:8] == PNG_MAGIC


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(ImportError, match=r"pip install matplotlib.*persistent_gemm\[plot\]"):
        sch.plot(CATALOGUE[0], 1024, 1024, tmp_path / "x.png")


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MPLBACKEND"] = "Agg"
    return env


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "persistent_gemm", *args],
        capture_output=True, text=True, env=_env(), cwd=cwd or REPO, timeout=120,
    )


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_cli_schedule_writes_png(tmp_path):
    out = tmp_path / "order.png"
    p = _cli(
        "schedule", "--m", "8192", "--n", "8192", "--k", "8192", "--swizzle", "8", "--cluster", "2x1",
        "--raster", "row", "--tile", "128x256x64", "--kernel", "cooperative", "--dtype", "bf16",
        "--arch", "sm90a", "--sms", "132", "--out", str(out),
    )
    assert "sm90a_bf16_128x256x64_c2x1_sw8_row_coop" in p.stdout
    assert "Mt x Nt = 64 x 32" in p.stdout and "Mc x Nc = 32 x 32" in p.stdout
    assert "ids = 1024" in p.stdout and "66 (132 SMs" in p.stdout and "waves = 16" in p.stdout
    assert "1168.0 MiB" in p.stdout
    if _has_matplotlib():
        assert p.returncode == 0, p.stderr
        assert out.read_bytes()[:8] == PNG_MAGIC
    else:
        assert p.returncode != 0 and "pip install matplotlib" in p.stderr


def _main(capsys, *args):
    """The CLI in-process (a fresh interpreter costs seconds once the package imports torch)."""
    from persistent_gemm.__main__ import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_schedule_with_config_name_and_workers(capsys):
    name = "sm90a_bf16_128x256x64_c2x1_sw1_row_coop"
    rc, out, err = _main(capsys, "schedule", "--m", "8192", "--n", "8192", "--config", name, "--workers", "66", "--per-wave")
    assert rc == 0, err
    assert name in out and "66 (given)" in out
    assert "2236.0 MiB" in out
    assert sum(1 for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()) == 16


def test_cli_schedule_defaults_and_kernel_aliases(capsys):
    rc, out, _ = _main(capsys, "schedule", "--m", "4096", "--n", "4096")
    assert rc == 0 and "config    sm90a_bf16_128x256x64_c2x1_sw8_row_coop" in out
    rc, out, _ = _main(capsys, "schedule", "--m", "4096", "--n", "4096", "--kernel", "pp", "--tile", "64x128x64", "--cluster", "1x1")
    assert rc == 0 and "sm90a_bf16_64x128x64_c1x1_sw8_row_pp" in out and "workers   132 (132 SMs" in out
    rc, out, _ = _main(capsys, "schedule", "--m", "4096", "--n", "4096", "--arch", "sm100a", "--dtype", "e4m3xe2m1", "--tile", "128x256x128")
    assert rc == 0 and "sm100a_e4m3xe2m1_128x256x128_c2x1_sw8_row_1sm" in out and "B 0.5 B/elem" in out


@pytest.mark.parametrize(
    "args, match",
    [
        (["--config", "sm90a_bf16_128x256x64_c2x1_sw8_row_coop", "--swizzle", "4"], "drop --swizzle"),
        (["--config", "sm90a_bf16_128x256x64_c3x1_sw8_row_coop"], "cluster extents"),
        (["--tile", "64x256x64"], "tile_m must be 128 or 256"),
        (["--cluster", "2by1"], "--cluster must look like NxN"),
        (["--swizzle", "0"], r"swizzle must be in"),
        (["--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_cli_schedule_errors(capsys, args, match):
    import re

    rc, _, err = _main(capsys, "schedule", "--m", "1024", "--n", "1024", *args)
    assert rc == 2
    assert re.search(match, err), err


def test_cli_requires_a_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        _main(capsys)
    assert e.value.code == 2 and "usage" in capsys.readouterr().err


def test_cli_schedule_does_not_import_the_extension():
    code = (
        "import sys, persistent_gemm; before = set(sys.modules)\n"
        "from persistent_gemm.__main__ import main\n"
        "rc = main(['schedule', '--m', '2048', '--n', '2048'])\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('persistent_gemm')))\n"
        "sys.exit(rc)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    loaded = eval(p.stdout.strip().splitlines()[-1])
    assert set(loaded) <= {"persistent_gemm.__main__", "persistent_gemm.schedule", "persistent_gemm.catalogue"}, loaded
