"""GPU tests of configs that are not built (persistent_gemm.jit) and of tune(): a JIT-compiled
column-raster, swizzle-3, cluster-1x2 schedule against float64 (tails, NaN-poisoned outputs),
its device walk against the Python reference, and tune's pick against an independent re-timing."""

from __future__ import annotations

import statistics

import pytest
import torch
from conftest import check_mm, expected_device_walk, operand, poisoned

import persistent_gemm as pg
from persistent_gemm import jit
from persistent_gemm import tuning as tune
from persistent_gemm.catalogue import CATALOGUE, KernelConfig
from persistent_gemm.schedule import TileSchedule

pytestmark = pytest.mark.sm90

#: In no catalogue: the schedule a user writes and runs.
SPEC = KernelConfig(tile=(128, 64, 64), schedule=TileSchedule(swizzle=3, cluster=(1, 2), raster="column"),
                    kernel="pingpong")


@pytest.fixture(scope="module")
def spec_name(tmp_path_factory):
    assert SPEC.name not in {c.name for c in CATALOGUE}
    return jit.ensure(SPEC)


@pytest.mark.parametrize("mnk", [(1000, 700, 300), (1, 8192, 4096), (257, 129, 64), (4096, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_jit_spec_matches_float64(spec_name, mnk, out_dtype):
    m, n, k = mnk
    a, b = operand(m, k, torch.bfloat16, True, 1, "cuda"), operand(k, n, torch.bfloat16, False, 2, "cuda")
    for config in (SPEC, spec_name):  # the spec and its name
        out = poisoned(lambda: pg.mm(a, b, out_dtype=out_dtype, config=config), m, n, out_dtype)
        check_mm(out, a, b, out_dtype)
    assert pg.explain(m, n, k, config=SPEC).config == spec_name


@pytest.mark.parametrize("shape", [(1, 1, 1, 3), (3000, 8192, 1, 66), (8191, 8191, 2, 132), (129, 70000, 1, 7)])
def test_jit_spec_device_walk_matches_reference(spec_name, shape):
    m, n, l, workers = shape
    got = pg._C.device_schedule(spec_name, m, n, l=l, workers=workers).cpu()
    torch.testing.assert_close(got, expected_device_walk(SPEC, m, n, l, workers, got), rtol=0, atol=0)


def test_tune_picks_within_3_percent_of_the_best(spec_name, tmp_path, monkeypatch):
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path))  # the tuning file; the JIT module is loaded already
    M = N = K = 4096
    try:
        r = pg.tune(M, N, K, op="mm", candidates=[SPEC], progress=False, reps=15)
        assert r.stored and r.winner == r.rows[0].config and spec_name in {x.config for x in r.rows}
        assert len(r.rows) >= 2 and str(r).count("\n") >= len(r.rows) + 1
        d = pg.explain(M, N, K, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
        assert d.tuned and d.config == r.winner
        # An independent re-timing of every candidate, interleaved: the pick is within 3% of the best.
        sets = tune._inputs("mm", "bf16", M, N, K, "rc", "none", torch.device("cuda"), 2)
        names = [x.config for x in r.rows]
        calls = [[tune._runner("mm", s, "bf16", False, n) for s in sets] for n in names]
        med = {n: statistics.median(t) for n, t in zip(names, tune.replay_times(calls, 15, 10))}
        assert med[r.winner] <= 1.03 * min(med.values()), (r.winner, med)
        a, b = operand(M, K, torch.bfloat16, True, 3, "cuda"), operand(K, N, torch.bfloat16, False, 4, "cuda")
        check_mm(poisoned(lambda: pg.mm(a, b), M, N, torch.bfloat16), a, b)  # the tuned pick runs right
    finally:
        pg.clear_tuning()
    assert not pg.explain(M, N, K).tuned
