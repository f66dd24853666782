"""The C++ scheduler (include/persistent_gemm/scheduler/tile_scheduler.hpp), instantiated with
each config's compile-time parameters, walks exactly the order of the Python reference."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import persistent_gemm as pg
from persistent_gemm.catalogue import CATALOGUE, KernelConfig
from persistent_gemm.codegen import PARITY_PROBES

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="extension not built")

ALL = {c.name: c for c in (*CATALOGUE, *PARITY_PROBES)}


def reference(cfg: KernelConfig, m, n, l, workers, k=None):
    grid = cfg.grid(m, n, batch=l, K=k)
    return torch.tensor(grid.work_order(workers), dtype=torch.int32).reshape(-1, 8)


def cpp(name, m, n, l, workers, k=None):
    k_tiles = -(-k // ALL[name].tile[2]) if k else 1
    return pg._C.schedule_order(name, m, n, l=l, workers=workers, k_tiles=k_tiles)


def test_catalogue_names_agree():
    assert list(pg._C.catalogue_names()) == [c.name for c in CATALOGUE]
    assert set(pg._C.parity_probe_names()) == {c.name for c in PARITY_PROBES}
    # probes span the template space: every raster, several swizzles and clusters
    assert {c.schedule.raster for c in ALL.values()} == {"row", "column"}
    assert len({c.schedule.cluster for c in ALL.values()}) >= 6
    assert {c.schedule.split_k for c in ALL.values()} >= {1, 2, 3, 4, 16}
    assert {c.schedule.stream_k_lanes for c in ALL.values() if c.schedule.stream_k} == {True, False}


@pytest.mark.parametrize("name", sorted(ALL))
def test_parity_edge_shapes(name):
    cfg = ALL[name]
    tm, tn = cfg.cta_tile
    cm, cn = cfg.schedule.cluster
    s = cfg.schedule.swizzle
    shapes = [
        (1, 1, 1, 1),                                   # Mt = Nt = 1
        (tm * cm * s + 1, tn * cn * 3 - 1, 1, 7),       # one row past a full panel; tail cluster
        (tm * (cm * (2 * s + 1) - 1), 1, 1, 5),         # Nt = 1, narrowed last panel
        (1, tn * (cn * 5 + 1), 2, 3),                   # Mt = 1, batched
        (tm * 13 + 5, tn * 11 + 3, 1, 1000),            # W > number of clusters
        (8192, 8192, 1, 66),
    ]
    tk = cfg.tile[2]
    for m, n, l, w in shapes:
        for k in (None, 1, tk * 3 - 1, tk * 17 + 5):  # fewer K-tiles than splits, ragged ranges
            torch.testing.assert_close(cpp(name, m, n, l, w, k), reference(cfg, m, n, l, w, k), rtol=0, atol=0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(ALL)),
    mt=st.integers(1, 60), nt=st.integers(1, 60),
    dm=st.integers(0, 127), dn=st.integers(0, 63),
    l=st.integers(1, 3), workers=st.integers(1, 300), k=st.integers(1, 5000),
)
def test_parity_random(name, mt, nt, dm, dn, l, workers, k):
    cfg = ALL[name]
    tm, tn = cfg.cta_tile
    m = (mt - 1) * tm + 1 + dm % tm
    n = (nt - 1) * tn + 1 + dn % tn
    torch.testing.assert_close(cpp(name, m, n, l, workers, k), reference(cfg, m, n, l, workers, k), rtol=0, atol=0)


def test_unknown_config_and_bad_shape():
    with pytest.raises(ValueError, match="unknown config"):
        pg._C.schedule_order("sm90a_bf16_nope", 1, 1, workers=1)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        pg._C.schedule_order(CATALOGUE[0].name, 8, 8, workers=0)
    with pytest.raises(ValueError, match="M, N and L must be >= 1"):
        pg._C.schedule_order(CATALOGUE[0].name, 0, 8, workers=1)
    with pytest.raises(ValueError, match="k_tiles must be >= 1"):
        pg._C.schedule_order(CATALOGUE[0].name, 8, 8, workers=1, k_tiles=0)
