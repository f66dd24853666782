"""CPU tests of the persistent tile schedule reference (:mod:`persistent_gemm.schedule`):
the coord bijection, worker visits, known orders (plain raster, Triton's GROUP_M), panels, and
argument validation. Names live in test_catalogue.py, footprints and plots in test_footprint.py,
the command line in test_cli.py."""

from __future__ import annotations

import pytest
from conftest import CLUSTERS, FAST, PROPS, TILES, schedules
from hypothesis import given
from hypothesis import strategies as st

from persistent_gemm import schedule as sch
from persistent_gemm.schedule import ScheduleGrid, TileSchedule

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
        (dict(raster=0), ValueError, r"raster must be 'row' or 'column'"),
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


def test_raster_and_style_aliases_normalise():
    from persistent_gemm.catalogue import KernelConfig

    for spelling, want in (("col", "column"), ("Column", "column"), ("c", "column"), ("rows", "row"), ("R", "row")):
        assert TileSchedule(raster=spelling).raster == want
    with pytest.raises(ValueError, match=r"raster must be 'row' or 'column' \(aliases"):
        TileSchedule(raster="diagonal")
    for spelling in ("ping-pong", "Ping_Pong", "pp", "pingpong"):
        assert KernelConfig(dtype="bf16", tile=(128, 128, 64), kernel=spelling).kernel == "pingpong"
    assert KernelConfig(dtype="bf16", tile=(128, 128, 64), kernel="COOP").kernel == "cooperative"
