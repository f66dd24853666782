"""GPU tests of the stream-K kernels (issue 27): the data-parallel head and the stream-K tail
(a tile's K shared by consecutive workers, reduced in worker order through the workspace).

Every built stream-K config is forced on shapes where the tail splits tiles at K-tile
boundaries that are not unit boundaries, where the head is whole waves, where there is no tail
at all, and where tail CTAs of a cluster hang past M or N; outputs NaN-poisoned, compared with
float64 (the tests' bound tied to torch's own error) and element by element; the result must be
bitwise reproducible, and the device walk must match the Python reference.
"""

import pytest
import torch
from conftest import (ARCH, check_mm, check_scaled_mm, check_user_schedule, expected_device_walk, fp8_pair,
                      fp32_scales, operand, poisoned, requires_config)

import persistent_gemm as pg
from persistent_gemm.catalogue import CATALOGUE

pytestmark = pytest.mark.gpu

CUDA = "cuda"
STREAM_K = [c for c in CATALOGUE if c.arch == ARCH and c.schedule.stream_k]
NAMES = [c.name for c in STREAM_K]
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (M, N, K): the 257-row band (all tail); a few waves then a tail; a partial last K-tile and
# ragged N; a single K-tile (no tile is split); the ragged row.
SHAPES = [(257, 4096, 4096), (3000, 2048, 1000), (129, 1000, 1032), (777, 555, 64), (1000, 3000, 5000)]
ids = lambda s: "x".join(map(str, s))  # noqa: E731


def _config(name):
    return next(c for c in STREAM_K if c.name == name)


def _run(name, m, n, k, seed):
    """(call, float64 reference, checker) for one shape of a stream-K config."""
    cfg = _config(name)
    if cfg.dtype == "e4m3":
        a, b = fp8_pair(m, n, k, seed=seed, device=CUDA)
        sa, sb = fp32_scales(m, n, True, seed=seed + 1, device=CUDA)
        ref = (a.double() * sa.double()) @ (b.double() * sb.double())
        fast = cfg.accum == "fast"  # a '_fastacc' kernel runs only as use_fast_accum=True
        return (lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, config=name, use_fast_accum=fast), ref,
                lambda out: check_scaled_mm(out, a, b, sa, sb, torch.bfloat16, use_fast_accum=fast))
    dt = DTYPE[cfg.dtype]
    a = operand(m, k, dt, True, seed=seed, device=CUDA)
    b = operand(k, n, dt, False, seed=seed + 1, device=CUDA)
    return lambda: pg.mm(a, b, config=name), a.double() @ b.double(), lambda out: check_mm(out, a, b, dt)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("name", NAMES)
def test_stream_k_matches_float64(name, shape):
    requires_config(name)
    m, n, k = shape
    call, ref, check = _run(name, m, n, k, seed=m + k)
    out = poisoned(call, m, n, torch.bfloat16 if _config(name).dtype != "fp16" else torch.float16)
    check(out)
    # Element by element: a piece reduced twice or not at all moves its tile's elements by about
    # a partial sum (>= 4 K-tiles), far past one bf16 rounding of the largest output.
    err = (out.double() - ref).abs()
    assert err.max().item() <= 2.0 ** -7 * ref.abs().max().item(), "an element is off by more than a rounding"


@pytest.mark.parametrize("name", NAMES)
def test_stream_k_is_bitwise_reproducible(name):
    requires_config(name)
    m, n, k = 257, 4096, 4096
    call, _, _ = _run(name, m, n, k, seed=5)
    dt = torch.bfloat16 if _config(name).dtype != "fp16" else torch.float16
    first = poisoned(call, m, n, dt)
    for _ in range(3):
        assert torch.equal(first, poisoned(call, m, n, dt)), "stream-K results differ between runs"


@pytest.mark.parametrize("name", NAMES)
def test_stream_k_device_walk_matches_reference(name):
    requires_config(name)
    cfg = _config(name)
    for m, n, l, workers, k_tiles in [(257, 4096, 1, 66, 64), (3000, 2048, 1, 66, 16), (1000, 40, 2, 7, 7),
                                      (64, 16, 1, 3, 1), (8192, 8192, 1, 66, 3)]:
        got = pg._C.device_schedule(name, m, n, l=l, workers=workers, k_tiles=k_tiles).cpu()
        torch.testing.assert_close(got, expected_device_walk(cfg, m, n, l, workers, got, k_tiles=k_tiles),
                                   rtol=0, atol=0)


def test_the_dispatcher_names_stream_k_when_it_picks_it():
    """explain() says what the chosen kernel does; a stream-K pick says so (and a forced one)."""
    if not NAMES:
        pytest.skip("no stream-K config built")
    name = NAMES[0]
    requires_config(name)
    cfg = _config(name)
    kw = {"dtype": "e4m3", "scale": "row"} if cfg.dtype == "e4m3" else {"dtype": cfg.dtype}
    d = pg.explain(257, 4096, 4096, config=name, **kw)
    assert d.config == name and "stream-K" in str(d), str(d)


#: In no catalogue: stream-K schedules a user writes, JIT-compiled -- a cooperative tile with a
#: column raster on 1x2 clusters, a ping-pong one on 2x1 clusters (tail CTAs at the M edge), and
#: the catalogue's ping-pong tile with its tail dealt unit-major (no lanes: the catalogue's all
#: deal in lanes where the tail is whole panel columns).
USER_STREAM_K = [
    pg.KernelConfig(tile=(128, 128, 64), kernel="cooperative",
                    schedule=pg.TileSchedule(swizzle=3, cluster=(1, 2), raster="column", stream_k=True)),
    pg.KernelConfig(tile=(128, 64, 64), kernel="pingpong",
                    schedule=pg.TileSchedule(swizzle=8, cluster=(2, 1), stream_k=True)),
    pg.KernelConfig(tile=(128, 128, 64), kernel="pingpong",
                    schedule=pg.TileSchedule(swizzle=8, cluster=(1, 2), stream_k=True, stream_k_lanes=False)),
]


@pytest.mark.sm90
@pytest.mark.parametrize("spec", USER_STREAM_K, ids=lambda c: c.name)
def test_user_stream_k_schedules_run_and_reproduce(spec):
    check_user_schedule(spec, [(257, 300, 1000), (1, 4096, 8192), (1000, 64, 64 * 7 + 8), (130, 129, 64),
                               (3000, 2048, 1000)])
