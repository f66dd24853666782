"""The self-check's problems reach what a small problem does not (issue 25, audit bug 2): walked
on the CPU with the schedule reference for a B200's 148 SMs (and the H200's 132). For every built
kernel of both archs (csrc/self_check.cpp ``check_shapes``, as ``_C.self_check_shapes`` reports
them): the first pass has tails in M, N and K on the full grid; the second (all but the decode
GEMV) runs on one cluster, whose every CTA walks >= 6 tiles -- so both accumulator stages and the
persistent loop's later passes run -- each over more K-tiles than any stage count (kMaxStages 16),
so the shared-memory ring wraps inside every tile; its extents end ragged too."""

import pytest

import persistent_gemm as pg
from persistent_gemm.catalogue import E2M1_DTYPES, KernelConfig
from persistent_gemm.schedule import ceil_div, default_workers

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the built extension")

MAX_STAGES = 16  # kMaxStages of the builders: no kernel holds more K-tiles in flight
SMS = {"sm90a": 132, "sm100a": 148}


def _kernels():
    seen = {}
    for e in (pg._C.built_kernels() if pg.extension_available() else ()):  # collected without it too
        seen.setdefault(e["config"], e)
    return sorted(seen)


@pytest.mark.parametrize("name", _kernels())
def test_the_self_check_reaches_multi_tile_wraparound_and_tails(name):
    cfg = KernelConfig.from_name(name)
    shapes = pg._C.self_check_shapes(name)
    tm, tn = cfg.cta_tile
    tk = cfg.tile[2]
    # 1. the full grid, with tails: the op's M, N (a swap-AB kernel's rows are the op's N).
    m, n, k, workers = shapes[0]
    km, kn = (n, m) if cfg.swap_ab else (m, n)
    # K ends in a partial K-tile -- but for SM100's grouped FP8 x FP4, which takes whole ones only
    # (TMA's e2m1 rule, and a stack of experts is not padded).
    whole_k = cfg.schedule.grouped and cfg.arch == "sm100a" and cfg.dtype in E2M1_DTYPES
    assert workers == 0 and (k % tk or (whole_k and k % tk == 0)), (name, shapes[0])
    if cfg.kernel != "gemv":
        assert km % tm and kn % tn, (name, shapes[0])
        grid = cfg.schedule.over(km, kn, (tm, tn, tk), K=k)
        assert grid.num_ids > 1
    if cfg.kernel == "gemv":  # its tokens fit its tile; its strips have a tail; whole 1x32 blocks
        assert len(shapes) == 1 and m <= cfg.tile[1] and n % cfg.tile[0] and k % 32 == 0, shapes
        return
    # 2. one cluster walks many tiles, each longer than the stage ring.
    m, n, k, workers = shapes[1]
    km, kn = (n, m) if cfg.swap_ab else (m, n)
    assert workers == 1 and km % tm and kn % tn, (name, shapes[1])
    grid = cfg.schedule.over(km, kn, (tm, tn, tk), K=k)
    visits = list(grid.tiles_of(0, 1))
    cm, cn = cfg.schedule.cluster
    # every visit is a cluster of cm x cn CTA tiles: each CTA computes one per visit
    assert len(visits) >= 6, (name, len(visits))
    assert ceil_div(k, tk) > MAX_STAGES, (name, k, tk)
    # and the full-grid pass is not already this: on a B200 / H200 it gives a CTA at most a few tiles
    m0, n0, _, _ = shapes[0]
    g0 = cfg.schedule.over(*((n0, m0) if cfg.swap_ab else (m0, n0)), (tm, tn))
    w = default_workers(SMS[cfg.arch], cfg.schedule)
    assert max(1, ceil_div(g0.num_ids, w)) < len(visits)
