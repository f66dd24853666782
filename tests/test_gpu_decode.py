"""GPU tests of the decode kernels (issue 12): swap-AB (the weight on the wgmma's 64-row side,
the tokens a narrow N, D written transposed) and split-K (K ranges per work unit, reduced in a
fixed order through a workspace).

Every built swap-AB or split-K config of the 16-bit and e4m3 families is forced on shapes with
tails in every dimension (M past the 16-token tile, N past the 64-row weight tile, K a partial
K-tile, K-tiles not divisible by the split) against float64, outputs NaN-poisoned; split-K must
be bitwise reproducible; the device walk of a split schedule must match the Python reference,
K ranges included.
"""

import pytest
import torch
from conftest import (
    ARCH,
    check_mm,
    check_user_schedule,
    check_scaled_mm,
    expected_device_walk,
    fp8_pair,
    fp32_scales,
    operand,
    poisoned,
    requires_config,
)

import persistent_gemm as pg
from persistent_gemm.catalogue import CATALOGUE, parse_name

pytestmark = pytest.mark.gpu

CUDA = "cuda"
DECODE = [c for c in CATALOGUE
          if c.arch == ARCH and c.dtype in ("bf16", "fp16", "e4m3") and (c.swap_ab or c.schedule.split_k > 1)]
NAMES = [c.name for c in DECODE]
SPLIT = [c.name for c in DECODE if c.schedule.split_k > 1]
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (M, N, K): one token; a ragged N and a partial last K-tile; M past one 16-token tile; K of a
# single K-tile (split clamped to 1); an odd K-tile count (unequal splits); a long K.
SHAPES = [(1, 4096, 4096), (3, 1000, 1032), (20, 200, 520), (16, 128, 64), (5, 704, 7 * 128), (2, 256, 14336)]
ids = lambda s: "x".join(map(str, s))  # noqa: E731


def family(name: str) -> str:
    return parse_name(name).dtype


def fast(name: str) -> bool:
    """A '_fastacc' kernel runs only as use_fast_accum=True (the op refuses it for promoted sums)."""
    return parse_name(name).accum == "fast"


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("name", NAMES)
def test_decode_configs_match_float64(name, shape):
    requires_config(name)
    m, n, k = shape
    fam = family(name)
    if fam == "e4m3":
        a, b = fp8_pair(m, n, k, seed=m + n, device=CUDA)
        for rowwise in (False, True):
            sa, sb = fp32_scales(m, n, rowwise, seed=k, device=CUDA)
            out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, config=name,
                                                use_fast_accum=fast(name)), m, n, torch.bfloat16)
            check_scaled_mm(out, a, b, sa, sb, torch.bfloat16, use_fast_accum=fast(name))
    else:
        dt = DTYPE[fam]
        a = operand(m, k, dt, True, seed=m + n, device=CUDA)
        b = operand(k, n, dt, False, seed=k, device=CUDA)  # the weight, (N, K) row-major
        check_mm(poisoned(lambda: pg.mm(a, b, config=name), m, n, dt), a, b, dt)


@pytest.mark.parametrize("name", SPLIT)
def test_split_k_is_bitwise_reproducible(name):
    """Fixed-order reduction: the same inputs give the same bits, run after run (a reduction by
    atomics or in arrival order would differ in the last bits between runs)."""
    requires_config(name)
    m, n, k = 4, 4096, 14336
    if family(name) == "e4m3":
        a, b = fp8_pair(m, n, k, seed=1, device=CUDA)
        sa, sb = fp32_scales(m, n, True, seed=2, device=CUDA)
        run = lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, config=name,  # noqa: E731
                                   use_fast_accum=fast(name))
    else:
        dt = DTYPE[family(name)]
        a, b = operand(m, k, dt, True, seed=1, device=CUDA), operand(k, n, dt, False, seed=2, device=CUDA)
        run = lambda: pg.mm(a, b, config=name)  # noqa: E731
    first = poisoned(run, m, n, torch.bfloat16 if family(name) != "fp16" else torch.float16)
    for _ in range(3):
        again = poisoned(run, m, n, first.dtype)
        assert torch.equal(first, again), "split-K results differ between runs"


@pytest.mark.parametrize("k_tiles", [1, 2, 7, 224])
@pytest.mark.parametrize("name", SPLIT)
def test_split_device_walk_matches_reference(name, k_tiles):
    requires_config(name)
    cfg = next(c for c in CATALOGUE if c.name == name)
    for m, n, l, workers in [(8192, 16, 1, 132), (1000, 40, 2, 7), (64, 16, 1, 3)]:
        got = pg._C.device_schedule(name, m, n, l=l, workers=workers, k_tiles=k_tiles).cpu()
        torch.testing.assert_close(got, expected_device_walk(cfg, m, n, l, workers, got, k_tiles=k_tiles),
                                   rtol=0, atol=0)


def test_split_k_workspace_is_per_call_and_streams_do_not_share_it():
    """Two split-K GEMMs on two streams at once: each owns its workspace (flags and partials)."""
    name = next((n for n in SPLIT if family(n) == "bf16"), None)
    if name is None:
        pytest.skip("no bf16 split-K config in the catalogue")
    requires_config(name)
    m, n, k = 3, 2048, 8192
    ops = [(operand(m, k, torch.bfloat16, True, seed=s, device=CUDA),
            operand(k, n, torch.bfloat16, False, seed=s + 1, device=CUDA)) for s in (10, 20)]
    expect = [pg.mm(a, b, config=name) for a, b in ops]
    streams = [torch.cuda.Stream() for _ in ops]
    outs = [None, None]
    torch.cuda.synchronize()
    for _ in range(20):
        for i, ((a, b), s) in enumerate(zip(ops, streams)):
            with torch.cuda.stream(s):
                outs[i] = pg.mm(a, b, config=name)
    torch.cuda.synchronize()
    for got, want in zip(outs, expect):
        assert torch.equal(got, want)


#: In no catalogue: split-K schedules a user writes, JIT-compiled -- a cooperative tile with a 2x1
#: cluster (tail CTAs at the M edge) and a column-raster ping-pong one; both non-swap.
USER_SPLITS = [
    pg.KernelConfig(tile=(128, 128, 64), schedule=pg.TileSchedule(swizzle=8, cluster=(2, 1), split_k=3),
                    kernel="cooperative"),
    pg.KernelConfig(tile=(128, 64, 64), schedule=pg.TileSchedule(swizzle=3, cluster=(1, 2), raster="column",
                                                                 split_k=2), kernel="pingpong"),
]


@pytest.mark.sm90
@pytest.mark.parametrize("spec", USER_SPLITS, ids=lambda c: c.name)
def test_user_split_k_schedules_run_and_reproduce(spec):
    check_user_schedule(spec, [(257, 300, 1000), (1, 4096, 8192), (1000, 64, 64 * 7 + 8), (130, 129, 64)])
