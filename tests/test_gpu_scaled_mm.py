"""GPU tests of ``scaled_mm`` (FP8 e4m3): shapes, scales, out dtypes, every built config, and
the two accumulation modes of ``use_fast_accum`` (as in torch._scaled_mm). The MX ops are in
test_gpu_mx.py.

Each result is checked against float64 within error_bound of torch._scaled_mm's error on the
same inputs in the same accumulation mode (conftest.scaled_mm_bound).
"""

import pytest
import torch
from conftest import (
    ARCH,
    FP8_FLOOR,
    STRIDED_SCALED_MM_CASES,
    built_configs,
    config_out_dtypes,
    catalogue_config,
    check_scaled_mm,
    config_is_fast_accum,
    error_bound,
    fp8_pair,
    fp32_scales,
    poisoned,
    rel_err,
    requires_config,
    strided_scaled_mm_cases,
    torch_scaled_mm,
)

import persistent_gemm as pg

pytestmark = pytest.mark.gpu

CUDA = "cuda"
ids = lambda s: "x".join(map(str, s))  # noqa: E731
FAST_BUILT = bool(built_configs("e4m3", fast_accum=True, arch=ARCH))
ACCUM = [pytest.param(False, id="promoted"),
         pytest.param(True, id="fastacc", marks=pytest.mark.skipif(not FAST_BUILT, reason="no _fastacc config built"))]


def run_scaled(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=False, config=None):
    out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, use_fast_accum=use_fast_accum,
                                        config=config), a.shape[0], b.shape[1], out_dtype)
    check_scaled_mm(out, a, b, sa, sb, out_dtype, use_fast_accum)
    return out


@pytest.mark.parametrize("fast", ACCUM)
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16], ids=["bf16", "fp32", "fp16"])
@pytest.mark.parametrize("mnk", [(1, 257, 1024), (129, 7, 512), (1000, 3000, 5000), (8191, 8191, 8192),
                                 (257, 129, 1000)], ids=ids)
def test_scaled_mm(rowwise, out_dtype, mnk, fast):
    m, n, k = mnk
    a, b = fp8_pair(m, n, k, seed=k, device=CUDA)
    sa, sb = fp32_scales(m, n, rowwise, seed=m, device=CUDA)
    run_scaled(a, b, sa, sb, out_dtype, fast)


# Issue 27's ragged row runs the swap-AB tiles registered for it, as the dispatcher picks them.
@pytest.mark.parametrize("fast,config", [pytest.param(f, c, id=c) for f, c in [
    (False, "sm90a_e4m3_128x96x128_c1x2_sw1_row_coop_swapab"),
    (True, "sm90a_e4m3_128x144x128_c1x2_sw1_row_sk2_coop_swapab_fastacc")]])
def test_scaled_mm_ragged_row_runs_its_tile(fast, config):
    m, n, k = 257, 4096, 4096
    requires_config(config)
    assert pg.explain(m, n, k, dtype="e4m3", scale="tensor", use_fast_accum=fast).config == config
    a, b = fp8_pair(m, n, k, seed=7, device=CUDA)
    sa, sb = fp32_scales(m, n, False, seed=8, device=CUDA)
    run_scaled(a, b, sa, sb, use_fast_accum=fast)


def test_default_out_dtype_is_bf16_and_default_accumulation_is_promoted():
    a, b = fp8_pair(129, 264, 512, seed=3, device=CUDA)
    sa, sb = fp32_scales(129, 264, False, device=CUDA)
    out = pg.scaled_mm(a, b, sa, sb)
    assert out.dtype == torch.bfloat16
    # The default is use_fast_accum=False: bit-identical to asking for it.
    torch.testing.assert_close(out, pg.scaled_mm(a, b, sa, sb, use_fast_accum=False), rtol=0, atol=0)


@pytest.mark.parametrize("m", [1, 3, 100])
def test_scaled_mm_decode_shapes_and_padded_m(m):
    n, k = 4096, 8192
    a, b = fp8_pair(m, n, k, seed=32 + m, device=CUDA)
    sa, sb = torch.tensor(0.75, device=CUDA), torch.tensor(1.5, device=CUDA)
    assert run_scaled(a, b, sa, sb).is_contiguous()


# -- every built config ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", built_configs("e4m3", arch=ARCH))
def test_scaled_mm_every_config(name):
    fast = config_is_fast_accum(name)
    cfg = catalogue_config(name)
    m = cfg.schedule.cluster_m * cfg.cta_tile[0] * 2 + 33  # tail cluster
    n, k = 520, 1000  # N and K off every tile multiple; K's rows not 16-byte aligned
    a, b = fp8_pair(m, n, k, seed=21, device=CUDA)
    for rowwise in (False, True):
        sa, sb = fp32_scales(m, n, rowwise, seed=22, device=CUDA)
        for out_dtype in config_out_dtypes(name):
            run_scaled(a, b, sa, sb, out_dtype, use_fast_accum=fast, config=name)
    if fast:  # a fast kernel needs the caller's permission
        with pytest.raises(ValueError, match="use_fast_accum"):
            pg.scaled_mm(a, b, sa, sb, use_fast_accum=False, config=name)
    else:  # a promoted kernel is allowed under use_fast_accum=True, and keeps promoted accuracy
        out_dtype = config_out_dtypes(name)[-1]  # fp32 where the config writes it
        out = pg.scaled_mm(a, b, sa, sb, out_dtype=out_dtype, use_fast_accum=True, config=name)
        check_scaled_mm(out, a, b, sa, sb, out_dtype, use_fast_accum=False)


# -- accumulation: promoted vs fast ----------------------------------------------------------------
def _accum_problem(k, rowwise, m=256, n=256):
    a, b = fp8_pair(m, n, k, seed=k + rowwise, device=CUDA)
    sa, sb = fp32_scales(m, n, rowwise, seed=k, device=CUDA)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    return a, b, sa, sb, ref


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("k", [4096, 8192, 16384, 28672])
def test_promoted_accumulation_matches_torch(k, rowwise):
    # Deep K is where FP8 accumulation precision shows; fp32 out, so no rounding hides it.
    a, b, sa, sb, ref = _accum_problem(k, rowwise)
    out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, use_fast_accum=False),
                   256, 256, torch.float32)
    peer = torch_scaled_mm(a, b, sa, sb, torch.float32, use_fast_accum=False)
    assert peer is not None, "torch._scaled_mm should accept a 256 x 256 fp32 problem"
    err, bound = rel_err(out, ref), error_bound(rel_err(peer, ref), FP8_FLOOR)
    assert err <= bound, f"promoted rel err {err:.3g} > bound {bound:.3g} (torch {rel_err(peer, ref):.3g})"


@pytest.mark.sm90
def test_promoted_accumulation_bound_rejects_fast_accumulation():
    # At K = 28672 fast accumulation is ~30x less accurate than promoted (H200: 4.4e-3 vs
    # 1.3e-4). The promoted kernel must meet torch's promoted bound, and that bound must be
    # tight enough that the fast kernel fails it: otherwise the test above could not tell the
    # two modes apart.
    a, b, sa, sb, ref = _accum_problem(28672, rowwise=False)
    peer = torch_scaled_mm(a, b, sa, sb, torch.float32, use_fast_accum=False)
    bound = error_bound(rel_err(peer, ref), FP8_FLOOR)
    promoted = pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, use_fast_accum=False)
    assert rel_err(promoted, ref) <= bound
    if not FAST_BUILT:
        pytest.skip("no _fastacc config built: the self-check half needs one")
    # use_fast_accum=True only admits fast kernels; force one so the fast path really runs.
    name = next(c for c in built_configs("e4m3", fast_accum=True, arch=ARCH) if torch.float32 in config_out_dtypes(c))
    fast = pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, use_fast_accum=True, config=name)
    assert not fast.isnan().any()
    assert rel_err(fast, ref) > bound, "the promoted bound cannot tell fast accumulation apart"


@pytest.mark.sm100
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_sm100_use_fast_accum_runs_the_same_fp32_accumulating_kernel(rowwise):
    # tcgen05 accumulates e4m3 products in fp32 over the whole K: sm100a has no _fastacc kernel,
    # so use_fast_accum=True picks the same kernel, bit for bit, at torch's promoted accuracy.
    a, b, sa, sb, ref = _accum_problem(28672, rowwise)
    run = lambda fast: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, use_fast_accum=fast)  # noqa: E731
    assert pg.explain(256, 256, 28672, dtype="e4m3", scale="row" if rowwise else "tensor",
                      use_fast_accum=True).config == pg.explain(256, 256, 28672, dtype="e4m3",
                                                                scale="row" if rowwise else "tensor").config
    torch.testing.assert_close(run(True), run(False), rtol=0, atol=0)
    peer = torch_scaled_mm(a, b, sa, sb, torch.float32, use_fast_accum=False)
    assert rel_err(run(False), ref) <= error_bound(rel_err(peer, ref), FP8_FLOOR)


@pytest.mark.sm90
@pytest.mark.parametrize("name", built_configs("e4m3", fast_accum=True, arch=ARCH))
def test_forced_fast_config_without_use_fast_accum_raises(name):
    a, b = fp8_pair(64, 64, 128, seed=5, device=CUDA)
    one = torch.tensor(1.0, device=CUDA)
    with pytest.raises(ValueError, match="use_fast_accum"):
        pg.scaled_mm(a, b, one, one, config=name)  # the default, use_fast_accum=False


# -- strided and broadcast operands ----------------------------------------------------------------
@pytest.mark.parametrize("case", STRIDED_SCALED_MM_CASES)
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("mnk", [(37, 29, 96), (300, 264, 520)], ids=ids)
def test_scaled_mm_strided_and_broadcast_operands(case, rowwise, mnk):
    a, b = strided_scaled_mm_cases(*mnk, device=CUDA)[case]
    sa, sb = fp32_scales(a.shape[0], b.shape[1], rowwise, seed=6, device=CUDA)
    run_scaled(a, b, sa, sb, torch.float32)
