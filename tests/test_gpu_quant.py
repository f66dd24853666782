"""GPU tests of the CUDA MXFP8 quantizer (torch.ops.persistent_gemm.quantize_mxfp8, which
pg.quantize_mxfp8 calls for CUDA tensors): bitwise equal to the torch-ops definition
(quantize_mxfp8_reference) on the same GPU, for both exponent rules, every input dtype, partial
tail blocks, strided rows, wide-range magnitudes, subnormal results, saturation and NaN/inf
blocks; traceable by torch.compile(fullgraph=True); on the current stream.
"""

import pytest
import torch

import persistent_gemm as pg
from persistent_gemm.quant import quantize_mxfp8_reference

pytestmark = pytest.mark.gpu

CUDA = "cuda"
SHAPES = [(1, 32), (3, 31), (7, 100), (64, 8192), (129, 4128), (2, 1)]
ids = lambda s: "x".join(map(str, s))  # noqa: E731


def wide(rows: int, k: int, dtype, seed: int) -> torch.Tensor:
    """Random values whose magnitudes span ~2^-40 .. 2^40 (per element), signs mixed."""
    g = torch.Generator(device=CUDA).manual_seed(seed)
    mant = torch.randn(rows, k, generator=g, device=CUDA)
    exp = torch.randint(-40, 41, (rows, k), generator=g, device=CUDA).float()
    x = mant * torch.exp2(exp)
    if dtype == torch.float16:  # keep inside fp16's range (its subnormals included)
        x = mant * torch.exp2(exp.clamp(-20, 14))
    return x.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def assert_same(got, want):
    (gd, gs), (wd, ws) = got, want
    assert gd.dtype == torch.float8_e4m3fn and gs.dtype == torch.float8_e8m0fnu
    assert gd.shape == wd.shape and gs.shape == ws.shape
    assert torch.equal(bits(gs), bits(ws)), "scales differ"
    # NaN elements may differ in their sign bit (both are NaN): compare NaN-ness there.
    nan = wd.float().isnan()
    assert torch.equal(gd.float().isnan(), nan)
    assert torch.equal(bits(gd)[~nan], bits(wd)[~nan]), "data differ"


@pytest.mark.parametrize("rule", ["floor", "rceil"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_kernel_is_bitwise_the_reference(shape, dtype, rule):
    x = wide(*shape, dtype, seed=shape[0] * 31 + shape[1])
    got = torch.ops.persistent_gemm.quantize_mxfp8(x, rule)
    assert_same(got, quantize_mxfp8_reference(x, rule=rule))
    assert_same(pg.quantize_mxfp8(x, rule=rule), got)  # the public function takes the kernel


@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_special_values(rule):
    x = torch.randn(6, 96, device=CUDA)
    x[0, 3] = float("nan")          # NaN block -> NaN scale
    x[1, 40] = float("inf")         # inf block
    x[2, :32] = 0.0                 # all-zero block -> code 0, data 0
    x[3, :32] = 1e-30               # subnormal-ish results
    x[4, 64:] = 448.0 * 2**5 + 1    # saturation under the floor rule
    x[5, :] = -2.0**-130            # float32 subnormal inputs
    assert_same(torch.ops.persistent_gemm.quantize_mxfp8(x, rule), quantize_mxfp8_reference(x, rule=rule))


def test_strided_rows_and_views():
    base = wide(16, 300, torch.bfloat16, seed=3)
    x = base[:, 7:263]  # row stride 300, misaligned start
    assert_same(pg.quantize_mxfp8(x), quantize_mxfp8_reference(x))
    xt = wide(256, 16, torch.bfloat16, seed=4).t()  # column-major: copied once
    assert_same(pg.quantize_mxfp8(xt), quantize_mxfp8_reference(xt))


def test_errors_match_the_reference_path():
    x = torch.randn(4, 64, device=CUDA)
    with pytest.raises(ValueError, match="rule"):
        pg.quantize_mxfp8(x, rule="nearest")
    with pytest.raises(ValueError, match="32"):
        pg.quantize_mxfp8(x, block=16)
    with pytest.raises(ValueError, match="2-D"):
        pg.quantize_mxfp8(x[0])


def test_compiles_fullgraph_and_runs_the_kernel():
    x = wide(8, 256, torch.bfloat16, seed=5)
    torch._dynamo.reset()
    f = torch.compile(lambda t: pg.quantize_mxfp8(t, rule="rceil"), fullgraph=True)
    assert_same(f(x), quantize_mxfp8_reference(x, rule="rceil"))


def test_current_stream_and_graph_capture():
    x = wide(32, 1024, torch.bfloat16, seed=6)
    want = quantize_mxfp8_reference(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = pg.quantize_mxfp8(x)
    s.synchronize()
    assert_same(got, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = pg.quantize_mxfp8(x)
    g.replay()
    torch.cuda.synchronize()
    assert_same(out, want)


def test_opcheck():
    x = wide(5, 70, torch.float32, seed=7)
    torch.library.opcheck(torch.ops.persistent_gemm.quantize_mxfp8.default, (x,), {"rule": "floor"},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# -- rowwise e4m3 (the fp8_rowwise Linear's activations; nn._rowwise_e4m3 is the definition) ------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 31), (16, 4096), (129, 4128), (2, 300)], ids=ids)
def test_rowwise_kernel_is_bitwise_the_reference(shape, dtype):
    from persistent_gemm.nn import _rowwise_e4m3_reference

    x = wide(*shape, dtype, seed=shape[0] * 7 + shape[1])
    x[0, 0] = 0.0  # rows of mixed magnitudes; one all-zero row below when there are several
    if shape[0] > 2:
        x[2] = 0.0
    got_d, got_s = torch.ops.persistent_gemm.quantize_rowwise_e4m3(x)
    want_d, want_s = _rowwise_e4m3_reference(x)
    assert got_d.dtype == torch.float8_e4m3fn and got_s.dtype == torch.float32 and got_s.shape == (shape[0], 1)
    assert torch.equal(got_s, want_s)
    assert torch.equal(bits(got_d), bits(want_d))


def test_rowwise_special_values_and_strides():
    from persistent_gemm.nn import _rowwise_e4m3, _rowwise_e4m3_reference

    x = torch.randn(6, 700, device=CUDA)
    x[1, 5] = float("nan")
    x[2, 9] = float("inf")
    x[3, 0] = -float("inf")
    x[4] = 1e-30  # below the 1e-12 floor of the scale
    got = torch.ops.persistent_gemm.quantize_rowwise_e4m3(x)
    want = _rowwise_e4m3_reference(x)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[0].float(), want[0].float(), rtol=0, atol=0, equal_nan=True)
    # a column slice (row stride 1400) and the nn entry point take the kernel too
    wide_x = torch.randn(5, 1400, device=CUDA, dtype=torch.bfloat16)[:, :700]
    got = _rowwise_e4m3(wide_x)
    want = _rowwise_e4m3_reference(wide_x)
    assert torch.equal(got[1], want[1]) and torch.equal(bits(got[0]), bits(want[0]))


def test_rowwise_opcheck_and_graph_capture():
    x = torch.randn(8, 512, device=CUDA, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.persistent_gemm.quantize_rowwise_e4m3, (x,),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        d, s = torch.ops.persistent_gemm.quantize_rowwise_e4m3(x)
    g.replay()
    torch.cuda.synchronize()
    want = torch.ops.persistent_gemm.quantize_rowwise_e4m3(x)
    assert torch.equal(s, want[1]) and torch.equal(bits(d), bits(want[0]))


# -- quantized_linear: one swapped Linear in one op call (issue 23) -------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("fmt", ["fp8_rowwise", "mxfp8", "fp8_fp4"])
@pytest.mark.parametrize("rows", [1, 37, 300])
def test_quantized_linear_is_bitwise_the_two_calls(fmt, dtype, rows):
    from persistent_gemm._linear_op import _linear_parts
    from persistent_gemm.nn import QuantConfig, quantize_

    lin = quantize_(torch.nn.Sequential(torch.nn.Linear(512, 200)), QuantConfig(fmt)).cuda()[0]
    x = wide(rows, 512, dtype, seed=rows).clamp(-1e4, 1e4)
    out = dtype  # the module answers in the activation's dtype
    bias = lin.bias.to(out)
    pg._C.set_poison_outputs(True)
    try:
        got = torch.ops.persistent_gemm.quantized_linear(x, lin.weight_q, lin.weight_scale, fmt, out, bias)
        # the two calls on the GPU: the quantizer op (the kernel), then the GEMM op
        xq, xs = (torch.ops.persistent_gemm.quantize_rowwise_e4m3(x) if fmt == "fp8_rowwise"
                  else torch.ops.persistent_gemm.quantize_mxfp8(x, "floor"))
        gemm = _linear_parts(fmt, "floor")[1]
        want = (gemm(xq, lin.weight_q.t(), xs, lin.weight_scale, out, False, None, bias) if fmt == "fp8_rowwise"
                else gemm(xq, lin.weight_q.t(), xs, lin.weight_scale, out, "plain", None, "blocked", bias))
    finally:
        pg._C.set_poison_outputs(False)
    assert got.dtype == out and not got.isnan().any()
    assert torch.equal(got, want)
    assert torch.equal(lin(x), got)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        replayed = torch.ops.persistent_gemm.quantized_linear(x, lin.weight_q, lin.weight_scale, fmt, out, bias)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, got)
