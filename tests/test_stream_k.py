"""Stream-K in the schedule spec (issue 27, scheduler side): the Python reference's head / tail
cut and the tail's pieces, names, rules, the bound the device walk's row count relies on. The
host C++ walk is held to this reference in test_scheduler_parity.py (the stream-K probes and
catalogue entries); the device walk and the kernels in test_gpu_stream_k.py."""

from __future__ import annotations

from collections import defaultdict

import pytest
from conftest import PROPS, schedules
from hypothesis import given
from hypothesis import strategies as st

from persistent_gemm import codegen
from persistent_gemm.catalogue import CATALOGUE, ConfigError, KernelConfig
from persistent_gemm.schedule import STREAM_K_MIN_ITERS, TileSchedule, ceil_div, stream_k_partition

#: tile_scheduler.hpp's kStreamKExtraSteps: the device walk allots ceil(ids / W) + this many rows.
EXTRA_STEPS = 3


def _cfg(**sched) -> KernelConfig:
    return KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=TileSchedule(stream_k=True, **sched))


@PROPS
@given(base=schedules, mt=st.integers(1, 30), nt=st.integers(1, 30), k=st.integers(1, 6000),
       batch=st.integers(1, 2), workers=st.integers(1, 140), lanes=st.booleans())
def test_pieces_cover_each_units_k_once_in_fixed_order(base, mt, nt, k, batch, workers, lanes):
    cfg = KernelConfig(tile=(128, 64, 64), kernel="pingpong",
                       schedule=base.replace(split_k=1, stream_k=True, stream_k_lanes=lanes))
    g = cfg.grid(mt * 128 - 5, nt * 64 - 3, batch=batch, K=k)
    plain = cfg.schedule.replace(stream_k=False, stream_k_lanes=True).over(g.M, g.N, (128, 64, 64), batch=batch, K=k)
    part = g.stream_k(workers)
    kt = g.k_tiles
    head_steps = part.dp_units // workers
    assert part.dp_units % workers == 0 and part.dp_units + part.sk_units == g.num_ids
    pieces = defaultdict(list)
    for w in range(workers):
        visits = list(g.tiles_of(w, workers))
        assert [v.step for v in visits] == list(range(len(visits)))
        assert len(visits) <= ceil_div(g.num_ids, workers) + EXTRA_STEPS
        for v in visits:
            # the same coordinate map as the data-parallel schedule, whole K in the head
            assert (v.batch, v.cluster_row, v.cluster_col) == plain.coord_batched(v.tile_id)
            if v.tile_id < part.dp_units:
                assert (v.step, v.split, v.k_begin, v.k_end) == ((v.tile_id - w) // workers, 0, 0, kt)
            pieces[v.tile_id].append((v.k_begin, v.k_end, v.split, w, v.step, len(visits)))
    assert sorted(pieces) == list(range(g.num_ids))
    for t, ps in pieces.items():
        ps.sort()
        assert ps[0][0] == 0 and ps[-1][1] == kt  # contiguous K ranges covering [0, Kt)
        assert all(a[1] == b[0] and a[1] > a[0] for a, b in zip(ps, ps[1:]))
        assert [p[2] for p in ps] == list(range(len(ps)))  # split: index in K order
        # consecutive workers of one lane (every worker's lane index is w // lanes)
        assert [p[3] for p in ps] == list(range(ps[0][3], ps[0][3] + part.lanes * len(ps), part.lanes))
        if len(ps) > 1:
            assert t >= part.dp_units and part.pieces(t - part.dp_units) == len(ps)
            assert ps[0][4] == ps[0][5] - 1  # the reducer is its worker's last step: it waits last
            assert all(p[4] == head_steps for p in ps[1:])  # a partial is its worker's first tail step
    if part.sk_units:  # each lane's iterations, dealt as evenly as integers allow
        sizes = [part.begin(j + 1) - part.begin(j) for j in range(part.parts)]
        assert sum(sizes) * part.lanes == part.sk_units * kt and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        flat = stream_k_partition(g.num_ids, kt, workers).sk_workers
        assert part.sk_workers % part.lanes == 0 and flat - part.lanes < part.sk_workers <= flat
    if not lanes:
        assert part.lanes == 1


@PROPS
@given(base=schedules, mt=st.integers(1, 30), nt=st.integers(1, 30), k=st.integers(1, 3000),
       batch=st.integers(1, 2), workers=st.integers(1, 140))
def test_lanes_keep_a_strips_units_in_step(base, mt, nt, k, batch, workers):
    """The point of lanes: the workers ``lanes * j + lane`` of one lane index visit, step for
    step, units that share the minor operand's strip (one panel column) over the same K-tiles;
    a tail that is not whole panel columns is not cut into lanes."""
    sched = base.replace(split_k=1, stream_k=True)
    g = sched.over(mt * 128 - 5, nt * 64 - 3, (128, 64, 64), batch=batch, K=k)
    part = g.stream_k(workers)
    flat = sched.replace(stream_k_lanes=False).over(g.M, g.N, (128, 64, 64), batch=batch, K=k).stream_k(workers)
    assert (part.dp_units, part.sk_units) == (flat.dp_units, flat.sk_units)
    if part.lanes == 1:
        return
    assert part.sk_units % part.lanes == 0 and part.lanes <= sched.swizzle
    row = sched.raster == "row"
    for j in range(part.parts):
        walks = [list(g.tiles_of(part.lanes * j + lane, workers))[part.dp_units // workers:]
                 for lane in range(part.lanes)]
        assert len({len(wk) for wk in walks}) == 1
        for step in zip(*walks):
            assert len({(v.batch, v.cluster_col if row else v.cluster_row) for v in step}) == 1  # one strip
            assert len({(v.k_begin, v.k_end, v.split) for v in step}) == 1                       # same K
            assert sorted(v.cluster_row if row else v.cluster_col for v in step) == \
                list(range(min(v.cluster_row if row else v.cluster_col for v in step),
                           min(v.cluster_row if row else v.cluster_col for v in step) + part.lanes))


def test_lanes_at_257_rows_put_a_columns_three_bands_side_by_side():
    """257 x 4096^2 on 128x128 tiles with 1x2 clusters: 3 bands x 16 cluster columns, all tail
    on 66 workers; 3 lanes of 22 workers. Without lanes one worker's range crosses from band to
    band, so the bands of a column are read at unrelated K offsets."""
    sched = TileSchedule(swizzle=8, cluster=(1, 2), stream_k=True)
    g = sched.over(257, 4096, (128, 128, 64), K=4096)
    part = g.stream_k(66)
    assert (part.sk_units, part.sk_workers, part.lanes, part.items) == (48, 66, 3, 16 * 64)
    first = [next(iter(g.tiles_of(w, 66))) for w in range(3)]
    assert [(v.cluster_row, v.cluster_col, v.k_begin, v.k_end) for v in first] == [(r, 0, 0, 47) for r in range(3)]
    flat = sched.replace(stream_k_lanes=False).over(257, 4096, (128, 128, 64), K=4096)
    assert flat.stream_k(66).lanes == 1
    # unit-major: at step 0 the bands of column 0 are read from K-tiles 0, 47, 30 and 13
    assert [(v.tile_id, v.k_begin) for v in (next(iter(flat.tiles_of(w, 66))) for w in range(4))] == \
        [(0, 0), (0, 47), (1, 30), (2, 13)]


@pytest.mark.parametrize("units, k_tiles, workers, want", [
    (96, 64, 132, (0, 96, 132)),     # under one wave: every unit in the tail, every worker on it
    (48, 64, 66, (0, 48, 66)),       # 257 x 4096 x 4096 on 128x128 tiles, 1x2 clusters
    (300, 64, 132, (132, 168, 132)),  # DP for the full waves but one, stream-K for the last 36 + 132
    (264, 64, 132, (264, 0, 0)),     # whole waves: data-parallel
    (10, 1, 132, (0, 10, 10)),       # one K-tile each: no unit is split (a worker per unit)
    (10, 8, 132, (0, 10, 20)),       # 80 iterations: a worker per STREAM_K_MIN_ITERS of them
])
def test_partition(units, k_tiles, workers, want):
    part = stream_k_partition(units, k_tiles, workers)
    assert (part.dp_units, part.sk_units, part.sk_workers) == want
    if part.sk_workers > max(part.sk_units, 1):
        assert part.items // part.sk_workers >= STREAM_K_MIN_ITERS


def test_257_rows_fill_every_worker_where_data_parallel_leaves_a_third_idle():
    g = KernelConfig(tile=(128, 128, 64), kernel="pingpong",
                     schedule=TileSchedule(swizzle=8, cluster=(1, 2), stream_k=True)).grid(257, 4096, K=4096)
    busy = [sum(v.k_end - v.k_begin for v in g.tiles_of(w, 66)) for w in range(66)]
    assert g.num_ids == 48 and min(busy) == 46 and max(busy) == 47  # 3072 K-tiles over 66 workers
    assert g.waves(66) == 1


def test_names_round_trip_and_rules():
    cfg = _cfg(swizzle=3, cluster=(2, 1), raster="column")
    assert cfg.name == "sm90a_bf16_128x64x64_c2x1_sw3_column_streamk_pp"
    assert KernelConfig.from_name(cfg.name) == cfg
    assert cfg.template_args()["schedule_tag"].endswith("Raster::Column, 1, true>")
    assert cfg.template_args()["stream_k"] == "true"
    with pytest.raises(ValueError, match="two ways to split K"):
        TileSchedule(split_k=2, stream_k=True)
    with pytest.raises(ConfigError, match="two ways to split K"):
        KernelConfig.from_name("sm90a_bf16_128x64x64_c2x1_sw3_column_sk2_streamk_pp")
    with pytest.raises(TypeError, match="stream_k must be a bool"):
        TileSchedule(stream_k=1)
    flat = _cfg(swizzle=3, stream_k_lanes=False)
    assert flat.name == "sm90a_bf16_128x64x64_c1x1_sw3_row_streamk_nolanes_pp"
    assert KernelConfig.from_name(flat.name) == flat
    assert flat.template_args()["schedule_tag"].endswith("Raster::Row, 1, true, false>")
    with pytest.raises(ValueError, match="stream_k_lanes=False .* needs stream_k=True"):
        TileSchedule(stream_k_lanes=False)
    with pytest.raises(ConfigError, match="stream_k_lanes=False"):
        KernelConfig.from_name("sm90a_bf16_128x64x64_c2x1_sw3_column_nolanes_pp")


def test_stream_k_outside_the_sm90_gemm_builder_is_refused_before_compiling():
    mx = KernelConfig(tile=(128, 128, 128), dtype="mxfp8", schedule=TileSchedule(cluster=(2, 1), stream_k=True))
    assert "stream_k=True: the K-range reduction is built into the sm90a 16-bit and e4m3" in mx.kernel_rejection()
    sm100 = KernelConfig(tile=(256, 128, 64), kernel="2sm", arch="sm100a",
                         schedule=TileSchedule(cluster=(2, 1), stream_k=True))
    assert "stream_k=True" in sm100.kernel_rejection()
    with pytest.raises(ConfigError, match="no split-K or stream-K"):
        KernelConfig(tile=(128, 256, 64), dtype="mxfp8", swap_ab=True, route="bf16",
                     schedule=TileSchedule(stream_k=True))


def test_catalogue_stream_k_kernels_keep_the_tma_store():
    """Unlike split-K's decode kernels, stream-K's partial pieces skip a TMA epilogue (the roles
    step its states past them): the whole tiles, most of the work, keep the faster store."""
    sk = [c for c in CATALOGUE if c.schedule.stream_k]
    assert sk, "the catalogue has stream-K kernels"
    for c in sk:
        assert c.kernel_rejection() is None
        assert any(v.tma_store for v in codegen.variants(c)), c.name
    probes = [c for c in codegen.PARITY_PROBES if c.schedule.stream_k]
    assert {c.schedule.raster for c in probes} == {"row", "column"} and len({c.schedule.cluster for c in probes}) >= 3
