"""GPU tests: the kernels against float64 references on an SM90/SM100 device.

Marked ``gpu``; skipped on machines without a CUDA device (CI). Every kernel output is
poisoned with NaN before the launch (``_C.set_poison_outputs``), so a tile the kernel never
writes shows up as NaN.
"""

import itertools

import pytest
import torch

import persistent_gemm as pg
from persistent_gemm import codegen
from persistent_gemm.catalogue import CATALOGUE

HAS_GPU = torch.cuda.is_available() and pg.extension_available()
ARCH = None
if HAS_GPU:
    ARCH = {(9, 0): "sm90a", (10, 0): "sm100a"}.get(torch.cuda.get_device_capability())
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and the built extension"),
]
BUILT = sorted({k["config"] for k in pg._C.built_kernels()}) if HAS_GPU else []
SCHEDULED = [c.name for c in CATALOGUE if c.arch == ARCH]
E4M3 = torch.float8_e4m3fn


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poisoned(fn, m, n, dtype):
    """Run fn() with the extension's poison hook on: every kernel output buffer is NaN-filled
    just before the launch, so a tile the kernel never writes stays NaN."""
    pg._C.set_poison_outputs(True)
    try:
        out = fn()
    finally:
        pg._C.set_poison_outputs(False)
    assert out.shape == (m, n) and out.dtype == dtype
    return out


def randn(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def operand(rows, cols, dtype, row_major, seed):
    """(rows, cols) tensor that is row-major or a column-major view."""
    return randn(rows, cols, dtype=dtype, seed=seed) if row_major else randn(cols, rows, dtype=dtype, seed=seed).t()


# -- the scheduler on the device ------------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEDULED)
@pytest.mark.parametrize("shape", [(1, 1, 1, 3), (3000, 8192, 1, 66), (8191, 8191, 2, 132), (129, 70000, 1, 7)])
def test_device_scheduler_matches_reference(name, shape):
    m, n, l, workers = shape
    cfg = next(c for c in CATALOGUE if c.name == name)
    got = pg._C.device_schedule(name, m, n, l=l, workers=workers).cpu()
    grid = cfg.grid(m, n, batch=l)
    cm, cn = cfg.schedule.cluster
    expect = torch.full_like(got, -1)
    for w in range(workers):
        for v in grid.tiles_of(w, workers):
            for rm, rn in itertools.product(range(cm), range(cn)):
                mi, ni = v.cluster_row * cm + rm, v.cluster_col * cn + rn
                inb = int(mi < grid.tiles_m and ni < grid.tiles_n)
                expect[w, rm * cn + rn, v.step] = torch.tensor([v.batch, mi, ni, inb])
    torch.testing.assert_close(got, expect, rtol=0, atol=0)


# -- mm ---------------------------------------------------------------------------------------------
MM_SIZES = [1, 7, 129, 257, 1000]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["rc", "rr", "cc", "cr"])
@pytest.mark.parametrize("mnk", [(m, 257, 1000) for m in MM_SIZES] + [(257, n, 129) for n in MM_SIZES]
                         + [(129, 257, k) for k in MM_SIZES], ids=lambda s: "x".join(map(str, s)))
def test_mm_shapes_layouts(dtype, layout, mnk):
    m, n, k = mnk
    a = operand(m, k, dtype, layout[0] == "r", seed=m + k)
    b = operand(k, n, dtype, layout[1] == "r", seed=n * 3 + k)
    out = poisoned(lambda: pg.mm(a, b), m, n, dtype)
    assert out.shape == (m, n) and out.dtype == dtype
    assert not out.isnan().any()
    assert rel_err(out, a.double() @ b.double()) < 1e-2


@pytest.mark.parametrize("mnk", [(8191, 8191, 8192), (8192, 8191, 777), (8191, 257, 8191), (3000, 8192, 8192)],
                         ids=lambda s: "x".join(map(str, s)))
def test_mm_large_and_unaligned(mnk):
    m, n, k = mnk
    a, b = randn(m, k, seed=1), randn(n, k, seed=2).t()
    out = poisoned(lambda: pg.mm(a, b), m, n, torch.bfloat16)
    assert not out.isnan().any()
    assert rel_err(out, (a.double() @ b.double())) < 1e-2


@pytest.mark.parametrize("m", [1, 3, 100])
@pytest.mark.parametrize("op", ["mm", "scaled_mm"])
def test_decode_shapes_and_padded_m(op, m):
    # Decode shapes; where the dispatcher pads the partial M-tile (explain(...).pad_m), the rows
    # past M in the copy are uninitialised and must never reach the output.
    n, k = 4096, 8192
    if op == "mm":
        a, b = randn(m, k, seed=30 + m), randn(n, k, seed=31).t()
        if m == 1:
            assert pg.explain(m, n, k).pad_m
        out = poisoned(lambda: pg.mm(a, b), m, n, torch.bfloat16)
        ref = a.double() @ b.double()
    else:
        a, b = fp8_pair(m, n, k, seed=32 + m)
        sa, sb = torch.tensor(0.75, device="cuda"), torch.tensor(1.5, device="cuda")
        out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb), m, n, torch.bfloat16)
        ref = (a.double() * 0.75) @ (b.double() * 1.5)
    assert out.is_contiguous() and not out.isnan().any()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mm_out_dtypes(dtype, out_dtype):
    a, b = randn(300, 520, dtype=dtype, seed=3), randn(520, 264, dtype=dtype, seed=4)
    out = poisoned(lambda: pg.mm(a, b, out_dtype=out_dtype), 300, 264, out_dtype)
    assert out.dtype == out_dtype and not out.isnan().any()
    assert rel_err(out, a.double() @ b.double()) < (1e-5 if out_dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("name", [n for n in BUILT if "_bf16_" in n or "_fp16_" in n])
def test_mm_every_config(name):
    dtype = torch.bfloat16 if "_bf16_" in name else torch.float16
    cfg = next(c for c in CATALOGUE if c.name == name)
    tm = cfg.cta_tile[0]
    m = cfg.schedule.cluster_m * tm * 3 + tm + 17  # a tail cluster: M not a multiple of cluster_m * tile_m
    a, b = randn(m, 1000, dtype=dtype, seed=5), randn(1000, 777, dtype=dtype, seed=6)
    out = poisoned(lambda: pg.mm(a, b, config=name), m, 777, dtype)
    assert not out.isnan().any()
    assert rel_err(out, a.double() @ b.double()) < 1e-2


@pytest.mark.parametrize("name", [n for n in BUILT if "_e4m3_" in n])
def test_scaled_mm_every_config(name):
    cfg = next(c for c in CATALOGUE if c.name == name)
    m = cfg.schedule.cluster_m * cfg.cta_tile[0] * 2 + 33  # tail cluster
    a, b = fp8_pair(m, 520, 1024, seed=21)
    sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, 520, device="cuda") + 0.5
    out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb, config=name), m, 520, torch.bfloat16)
    assert not out.isnan().any()
    assert rel_err(out, (a.double() * sa.double()) @ (b.double() * sb.double())) < 1e-2


def test_unbuilt_or_unknown_config_lists_available():
    a, b = randn(64, 64), randn(64, 64)
    with pytest.raises(ValueError, match="(?s)unknown config.*the catalogue has"):
        pg.mm(a, b, config="sm90a_bf16_1x1x1")


# -- scaled_mm ----------------------------------------------------------------------------------
def fp8_pair(m, n, k, seed):
    a = (randn(m, k, seed=seed, dtype=torch.float32) * 2).to(E4M3)
    b = (randn(n, k, seed=seed + 1, dtype=torch.float32) * 2).to(E4M3).t()
    return a, b


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("mnk", [(1, 257, 1024), (129, 7, 512), (1000, 3000, 5000), (8191, 8191, 8192), (257, 129, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_scaled_mm(rowwise, out_dtype, mnk):
    m, n, k = mnk
    a, b = fp8_pair(m, n, k, seed=k)
    if rowwise:
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
    else:
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(1.25, device="cuda")
    out = poisoned(lambda: pg.scaled_mm(a, b, sa, sb, out_dtype=out_dtype), m, n, out_dtype)
    assert not out.isnan().any()
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    assert rel_err(out, ref) < 1e-2


# -- MX ops on SM90 ---------------------------------------------------------------------------------
@pytest.mark.skipif(ARCH != "sm90a", reason="SM90 message")
def test_mx_ops_say_not_implemented_on_sm90():
    xq, xs = pg.quantize_mxfp8(randn(64, 64, dtype=torch.float32))
    with pytest.raises(RuntimeError, match="not implemented for this GPU"):
        pg.mxfp8_mm(xq, xs, xq.t(), xs)


# -- streams, graphs, opcheck ----------------------------------------------------------------------
def test_non_default_stream_and_graph_capture():
    a, b = randn(1000, 512, seed=7), randn(512, 768, seed=8)
    ref = a.double() @ b.double()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = pg.mm(a, b)
    torch.cuda.current_stream().wait_stream(s)
    assert rel_err(out, ref) < 1e-2
    g = torch.cuda.CUDAGraph()
    pg.mm(a, b)  # warm-up outside capture (smem attributes, lazy module loading)
    with torch.cuda.graph(g):
        captured = pg.mm(a, b)
    captured.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(captured, ref) < 1e-2


def test_opcheck_cuda():
    a, b = randn(96, 200, seed=9), randn(200, 72, seed=10)
    torch.library.opcheck(torch.ops.persistent_gemm.mm, (a, b, None, None))
    a8, b8 = fp8_pair(96, 72, 256, seed=11)
    sa, sb = torch.rand(96, 1, device="cuda"), torch.rand(1, 72, device="cuda")
    torch.library.opcheck(torch.ops.persistent_gemm.scaled_mm, (a8, b8, sa, sb, torch.float32, None),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_compile_cuda():
    a, b = randn(256, 128, seed=12), randn(128, 64, seed=13)
    f = torch.compile(lambda x, y: torch.ops.persistent_gemm.mm(x, y) * 2, fullgraph=True)
    assert rel_err(f(a, b), 2 * (a.double() @ b.double())) < 1e-2
