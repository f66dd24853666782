"""Split-K in the schedule spec (issue 12, scheduler side): the Python reference's K ranges,
names, footprint and picture; the host C++ walk is checked against it in
test_scheduler_parity.py. No kernel consumes K ranges yet: such configs are refused before
anything compiles, with the reason."""

from __future__ import annotations

from collections import defaultdict

import pytest
from conftest import PROPS, schedules
from hypothesis import given
from hypothesis import strategies as st

from persistent_gemm import codegen, jit
from persistent_gemm import footprint as foot
from persistent_gemm.tools import picture as pic
from persistent_gemm.catalogue import CATALOGUE, ConfigError, KernelConfig
from persistent_gemm.schedule import TileSchedule, ceil_div


def _cfg(split_k: int, **sched) -> KernelConfig:
    return KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=TileSchedule(split_k=split_k, **sched))


@PROPS
@given(base=schedules, split_k=st.integers(1, 16), mt=st.integers(1, 12), nt=st.integers(1, 12),
       k=st.integers(1, 2000), batch=st.integers(1, 2), workers=st.integers(1, 40))
def test_units_partition_each_tiles_k_range(base, split_k, mt, nt, k, batch, workers):
    cfg = KernelConfig(tile=(128, 64, 64), kernel="pingpong", schedule=base.replace(split_k=split_k))
    g = cfg.grid(mt * 128 - 5, nt * 64 - 3, batch=batch, K=k)
    kt = ceil_div(k, 64)
    S = min(split_k, kt)
    assert g.k_tiles == kt and g.splits == S
    plain = cfg.schedule.replace(split_k=1).over(g.M, g.N, (128, 64, 64), batch=batch, K=k)
    assert g.num_ids == plain.num_ids * S
    ranges = defaultdict(list)
    visits = [v for w in range(workers) for v in g.tiles_of(w, workers)]
    assert sorted(v.tile_id for v in visits) == list(range(g.num_ids))
    for v in visits:
        # the units of one coordinate are consecutive ids: unit = id // S, split = id % S
        assert (v.batch, v.cluster_row, v.cluster_col) == plain.coord_batched(v.tile_id // S)
        assert v.split == v.tile_id % S and g.k_range(v.tile_id) == (v.split, v.k_begin, v.k_end)
        ranges[(v.batch, v.cluster_row, v.cluster_col)].append((v.split, v.k_begin, v.k_end))
    for units in ranges.values():
        units.sort()
        assert [s for s, _, _ in units] == list(range(S))
        assert units[0][1] == 0 and units[-1][2] == kt  # contiguous, covering [0, Kt)
        assert all(a[2] == b[1] for a, b in zip(units, units[1:]))
        sizes = {e - b for _, b, e in units}
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_without_k_a_schedule_is_one_k_tile_deep():
    g = _cfg(4).grid(1000, 1000)
    assert (g.k_tiles, g.splits) == (1, 1)
    assert all(v.k_begin == 0 and v.k_end == 1 for v in g.tiles_of(0, 3))


def test_split_k_names_round_trip_and_refuse_sk1():
    cfg = _cfg(4, swizzle=3, cluster=(2, 1), raster="column")
    assert cfg.name == "sm90a_bf16_128x64x64_c2x1_sw3_column_sk4_pp"
    assert KernelConfig.from_name(cfg.name) == cfg
    assert "PersistentSchedule<3, 2, 1, persistent_gemm::scheduler::Raster::Column, 4>" in cfg.template_args()["schedule_tag"]
    assert _cfg(1).template_args()["schedule_tag"].endswith("Raster::Row>")  # unchanged for split_k = 1
    with pytest.raises(ConfigError, match="split_k=1 is written without the _sk token"):
        KernelConfig.from_name("sm90a_bf16_128x64x64_c2x1_sw3_column_sk1_pp")
    with pytest.raises(ConfigError, match=r"split_k must be in \[1, 16\]"):
        KernelConfig.from_name("sm90a_bf16_128x64x64_c2x1_sw3_column_sk17_pp")
    with pytest.raises(TypeError, match="split_k must be an int"):
        TileSchedule(split_k=2.0)


def test_split_k_configs_outside_the_sm90_gemm_builder_are_refused_before_compiling(tmp_path, monkeypatch):
    cfg = KernelConfig(tile=(64, 64, 128), kernel="pingpong", dtype="mxfp8", swap_ab=True,
                       schedule=TileSchedule(split_k=2))
    assert "K-range reduction is built into the sm90a 16-bit and e4m3 kernels only" in cfg.kernel_rejection()
    assert all(c.kernel_rejection() is None for c in CATALOGUE)
    with pytest.raises(ValueError, match="K-range reduction is built into"):
        codegen.kernel_tu(cfg, jit.variants_for(cfg)[0])
    monkeypatch.setattr(jit, "_compile", lambda *a, **k: pytest.fail("must not compile"))
    monkeypatch.setattr(jit, "registered_configs", lambda: set())
    with pytest.raises(ConfigError, match="valid schedule but cannot be compiled.*split_k=2"):
        jit.ensure(cfg)


@pytest.mark.parametrize("swap_ab", [False, True])
def test_split_k_and_swap_ab_lower_to_predicated_stores(swap_ab):
    """The builder's static_asserts, mirrored: split-K and swap-AB kernels write D by predicated
    stores; swap-AB ones take both operands K-major. The TU names the split tag and SwapAB."""
    cfg = _cfg(2) if not swap_ab else KernelConfig(tile=(64, 16, 64), kernel="pingpong", swap_ab=True,
                                                   schedule=TileSchedule(split_k=3))
    for vs in (codegen.variants(cfg), jit.variants_for(cfg)):
        assert vs and all(not v.tma_store for v in vs)
        assert all(v.a_k_major and v.b_k_major for v in vs) or not swap_ab
    tu = codegen.kernel_tu(cfg, jit.variants_for(cfg)[0])
    assert f"Raster::Row, {cfg.schedule.split_k}>" in tu
    assert f"constexpr bool kSwapAB = {str(swap_ab).lower()};" in tu
    assert "size_t workspace_" in tu and "Gemm::workspace_bytes(args)" in tu
    table = codegen.kernel_table("sm90a", [cfg])
    assert (f".style = KernelStyle::PingPong, .split_k = {cfg.schedule.split_k}, .stream_k = false, .grouped = false}},\n"
            "     .run = &gen::run_") in table


def test_footprint_of_one_wave_is_the_same_bytes_split_or_not():
    M, N, K = 1000, 700, 1000
    one = foot.wave_footprint(_cfg(1), M, N, K, workers=10_000)
    four = foot.wave_footprint(_cfg(4), M, N, K, workers=10_000)
    assert len(one) == len(four) == 1
    assert (four[0].a_bytes, four[0].b_bytes) == (one[0].a_bytes, one[0].b_bytes)
    assert four[0].a_panels == 4 * one[0].a_panels and four[0].tiles == 4 * one[0].tiles
    many = foot.wave_footprint(_cfg(4), M, N, K, workers=7)
    assert sum(f.tiles for f in many) == 4 * one[0].tiles


def test_picture_and_cli_show_split_k(tmp_path, capsys):
    step, worker = pic.visit_grid(_cfg(3), 512, 256, workers=5, K=640)  # 4 x 4 tiles, 10 K-tiles
    assert [[step[m][n] * 5 + worker[m][n] for n in range(4)] for m in range(4)] == \
        [[3 * (4 * m + n) for n in range(4)] for m in range(4)]  # split 0 of unit u is id 3u (sw1, row)
    from persistent_gemm.tools.cli import main

    rc = main(["schedule", "--m", "512", "--n", "256", "--k", "640", "--tile", "128x64x64", "--kernel", "pp",
               "--cluster", "1x1", "--swizzle", "1", "--split-k", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and "sw1_row_sk3_pp" in out and "split-K   3 units per tile, each a range of the 10 K-tiles" in out
    pytest.importorskip("matplotlib")
    p = tmp_path / "sk.png"
    assert pic.plot(_cfg(3), 512, 256, p, workers=5, K=640) == p
