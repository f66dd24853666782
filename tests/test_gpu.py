"""GPU tests of the scheduler on the device and of ``mm``: every output against float64, our
error within error_bound of torch.mm's (cuBLAS, same out dtype) on the same inputs.

Marked ``gpu`` (conftest.py skips them without a CUDA device and the built extension). Every
kernel output is poisoned with NaN before the launch (``poisoned``), so a tile the kernel
never writes shows up as NaN. scaled_mm is in test_gpu_scaled_mm.py; samples, opcheck,
compile, autograd, empty extents, streams and graphs in test_gpu_ops.py.
"""

import dataclasses

import pytest
import torch
from conftest import (
    ARCH,
    OUT_DTYPES,
    STRIDED_MM_CASES,
    built_configs,
    config_out_dtypes,
    catalogue_config,
    check_mm,
    expected_device_walk,
    operand,
    poisoned,
    randn,
    requires_config,
    strided_mm_cases,
)

import persistent_gemm as pg
from persistent_gemm import jit
from persistent_gemm.catalogue import CATALOGUE, parse_name
from persistent_gemm.kernel_config import ConfigError

pytestmark = pytest.mark.gpu

CUDA = "cuda"
# The decode GEMV walks weight strips, not the tile scheduler: it has no device walk to compare.
SCHEDULED = [c.name for c in CATALOGUE if c.arch == ARCH and c.kernel != "gemv"]
ids = lambda s: "x".join(map(str, s))  # noqa: E731


# -- the scheduler on the device ------------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEDULED)
@pytest.mark.parametrize("shape", [(1, 1, 1, 3), (3000, 8192, 1, 66), (8191, 8191, 2, 132), (129, 70000, 1, 7)])
def test_device_scheduler_matches_reference(name, shape):
    m, n, l, workers = shape
    requires_config(name)  # a PGEMM_KERNELS build holds a subset
    cfg = catalogue_config(name)
    got = pg._C.device_schedule(name, m, n, l=l, workers=workers).cpu()
    torch.testing.assert_close(got, expected_device_walk(cfg, m, n, l, workers, got), rtol=0, atol=0)


# -- mm ---------------------------------------------------------------------------------------------
MM_SIZES = [1, 7, 129, 257, 1000]


def run_mm(a, b, out_dtype=None, config=None):
    out_dtype = out_dtype or a.dtype
    out = poisoned(lambda: pg.mm(a, b, out_dtype=out_dtype, config=config), a.shape[0], b.shape[1], out_dtype)
    check_mm(out, a, b, out_dtype)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["rc", "rr", "cc", "cr"])
@pytest.mark.parametrize("mnk", [(m, 257, 1000) for m in MM_SIZES] + [(257, n, 129) for n in MM_SIZES]
                         + [(129, 257, k) for k in MM_SIZES], ids=ids)
def test_mm_shapes_layouts(dtype, layout, mnk):
    m, n, k = mnk
    a = operand(m, k, dtype, layout[0] == "r", seed=m + k, device=CUDA)
    b = operand(k, n, dtype, layout[1] == "r", seed=n * 3 + k, device=CUDA)
    run_mm(a, b)


@pytest.mark.parametrize("mnk", [(8191, 8191, 8192), (8192, 8191, 777), (8191, 257, 8191), (3000, 8192, 8192)], ids=ids)
def test_mm_large_and_unaligned(mnk):
    m, n, k = mnk
    run_mm(randn(m, k, seed=1, device=CUDA), operand(k, n, torch.bfloat16, False, seed=2, device=CUDA))


# Issue 27's ragged rows run the tiles registered for them, as the dispatcher picks them.
@pytest.mark.parametrize("mnk,config", [pytest.param(mnk, c, id=c) for mnk, c in [
    ((257, 4096, 4096), "sm90a_bf16_128x144x64_c1x2_sw1_row_sk2_coop_swapab"),
    ((1000, 3000, 5000), "sm90a_bf16_128x208x64_c4x1_sw8_row_coop")]])
def test_mm_ragged_rows_run_their_tiles(mnk, config):
    m, n, k = mnk
    requires_config(config)
    assert pg.explain(m, n, k).config == config
    run_mm(randn(m, k, seed=m, device=CUDA), operand(k, n, torch.bfloat16, False, seed=n, device=CUDA))


@pytest.mark.parametrize("m", [1, 3, 100])
def test_mm_decode_shapes_and_padded_m(m):
    # Where the dispatcher pads the partial M-tile (explain(...).pad_m), the rows past M in the
    # copy are uninitialised and must never reach the output.
    # M = 1 on a 64-row tile forced (the dispatcher itself takes a swap-AB kernel there).
    n, k = 4096, 8192
    padded = "sm90a_bf16_64x64x64_c1x2_sw8_row_pp"
    config = padded if m == 1 else None
    if config:
        requires_config(config)
        assert pg.explain(m, n, k, config=config).pad_m
    out = run_mm(randn(m, k, seed=30 + m, device=CUDA), operand(k, n, torch.bfloat16, False, seed=31, device=CUDA),
                 config=config)
    assert out.is_contiguous()


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mnk", [(300, 264, 520), (129, 7, 1000)], ids=ids)
def test_mm_out_dtypes(dtype, out_dtype, mnk):
    m, n, k = mnk
    run_mm(randn(m, k, dtype, seed=3, device=CUDA), randn(k, n, dtype, seed=4, device=CUDA), out_dtype)


@pytest.mark.parametrize("name", built_configs("bf16", arch=ARCH) + built_configs("fp16", arch=ARCH))
def test_mm_every_config(name):
    dtype = torch.bfloat16 if parse_name(name).dtype == "bf16" else torch.float16
    cfg = catalogue_config(name)
    tm = cfg.cta_tile[0]
    m = cfg.schedule.cluster_m * tm * 3 + tm + 17  # a tail cluster: M not a multiple of cluster_m * tile_m
    a, b = randn(m, 1000, dtype, seed=5, device=CUDA), randn(1000, 777, dtype, seed=6, device=CUDA)
    for out_dtype in config_out_dtypes(name):
        run_mm(a, b, out_dtype, config=name)
    if torch.float32 not in config_out_dtypes(name):  # shape-tuned configs: a clear refusal
        with pytest.raises(ValueError, match="has no variant writing"):
            pg.mm(a, b, out_dtype=torch.float32, config=name)


@pytest.mark.sm90
def test_readme_forced_config_example():
    # README's example: a named config with fp32 output (skipped where PGEMM_KERNELS left it out).
    name = "sm90a_bf16_128x256x64_c2x1_sw8_row_coop"
    requires_config(name)
    a, b = randn(1000, 777, seed=11, device=CUDA), randn(777, 1500, seed=12, device=CUDA)
    run_mm(a, b, torch.float32, config=name)


def test_unknown_and_unbuilt_configs_say_which(monkeypatch):
    """An invalid name is unknown and points at the catalogue; a valid canonical name that this
    process cannot run yet (neither built nor JIT-loaded) is "valid but not built" when the JIT,
    which would otherwise compile it (test_gpu_jit.py), is off."""
    a, b = randn(64, 64, device=CUDA), randn(64, 64, device=CUDA)
    with pytest.raises(ConfigError, match="(?s)unknown config 'sm90a_bf16_1x1x1'.*the catalogue has"):
        pg.mm(a, b, config="sm90a_bf16_1x1x1")
    base = next(c for c in CATALOGUE if c.arch == ARCH and c.dtype == "bf16" and c.kernel != "gemv")
    registered = jit.registered_configs()
    respun = (dataclasses.replace(base, schedule=base.schedule.replace(swizzle=s)) for s in range(1, 17))
    unbuilt = next(c for c in respun if c.name not in registered and not c.kernel_rejection())
    monkeypatch.setenv(jit.JIT_ENV, "0")
    with pytest.raises(jit.KernelNotBuiltError, match=f"(?s)config {unbuilt.name} is valid but not built.*PGEMM_JIT=0"):
        pg.mm(a, b, config=unbuilt.name)


# -- strided and broadcast operands ----------------------------------------------------------------
@pytest.mark.parametrize("case", STRIDED_MM_CASES)
@pytest.mark.parametrize("mnk", [(37, 29, 70), (300, 264, 520)], ids=ids)
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["same", "fp32"])
def test_mm_strided_and_broadcast_operands(case, mnk, out_dtype):
    # Like torch.mm, any strides: what TMA cannot read (stride 0, no unit stride) is copied.
    a, b = strided_mm_cases(*mnk, device=CUDA)[case]
    out = run_mm(a, b, out_dtype)
    assert out.is_contiguous()
