"""CPU tests of the model path a user walks after quantize_ (issue 23): an fp16 model stays fp16,
model-wide casts and device moves keep the quantized bytes, state_dict round-trips, and a model
on the meta device is refused at quantize time instead of producing garbage."""

import copy
import io

import pytest
import torch
from support.models import Block

import persistent_gemm as pg
from persistent_gemm.nn import FORMATS  # importable without the extension: collection never errors

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")

QUANTIZED = [f for f in FORMATS if f != "bf16"]


class MLP(torch.nn.Module):
    """Linears only, so every parameter the casts touch belongs to a swapped layer."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 96)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.1

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.fixture(autouse=True)
def _inference():
    # The quantized formats are for inference (their ops refuse inputs that require grad).
    with torch.no_grad():
        yield


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_fp16_model_stays_fp16_end_to_end(fmt):
    ref = Block().half()
    model = pg.nn.quantize_(copy.deepcopy(ref), fmt)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1)).half()
    y = model(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    want = ref.float()(x.float())
    assert ((y.float() - want).norm() / want.norm()).item() < (0.02 if fmt == "bf16" else 0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_has_the_input_dtype(dtype):
    model = pg.nn.quantize_(Block(), "mxfp8")
    assert model(torch.randn(3, 64).to(dtype)).dtype == dtype


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("cast", ["half", "float", "bfloat16", "to_dtype", "to_cpu"])
def test_casts_after_quantize_keep_the_quantized_bytes(fmt, cast):
    model = pg.nn.quantize_(MLP(), fmt)
    before = {n: b.clone() for n, b in model.named_buffers()}
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    y0 = model(x)
    apply = {"half": lambda m: m.half(), "float": lambda m: m.float(), "bfloat16": lambda m: m.bfloat16(),
             "to_dtype": lambda m: m.to(torch.float16), "to_cpu": lambda m: m.to("cpu")}[cast]
    model = apply(model)
    for n, b in model.named_buffers():
        assert b.dtype == before[n].dtype and torch.equal(b.view(torch.uint8), before[n].view(torch.uint8)), n
    y1 = model(x)
    assert y1.dtype == torch.bfloat16
    if cast in ("float", "bfloat16", "to_cpu"):  # the bias round-trips through fp32 / bf16 exactly
        torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    else:  # a bf16 bias cast to fp16 rounds; the rest is the same computation
        torch.testing.assert_close(y1, y0, rtol=2e-2, atol=2e-2)


def test_a_bf16_format_weight_keeps_a_16_bit_dtype():
    model = pg.nn.quantize_(MLP(), "bf16").float()
    assert model.up.weight.dtype == torch.bfloat16
    assert model(torch.randn(2, 64)).dtype == torch.float32
    assert pg.nn.quantize_(MLP(), "bf16").half().up.weight.dtype == torch.float16


@pytest.mark.parametrize("fmt", FORMATS)
def test_state_dict_round_trips_into_a_fresh_model(fmt):
    a = pg.nn.quantize_(Block(seed=0), fmt)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    b = pg.nn.quantize_(Block(seed=1), fmt)  # built the same way, other values
    b.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_a_float_checkpoint_loads_into_a_swapped_model(fmt):
    # Newcomer report #17: nn.Linear's "weight" key loads into a swapped layer, quantized there
    # as from_linear quantizes it (same bytes), so a checkpoint can be loaded after the swap.
    float_model = Block(seed=0)
    want = pg.nn.quantize_(Block(seed=0), fmt)
    b = pg.nn.quantize_(Block(seed=1), fmt)
    b.load_state_dict(float_model.state_dict())
    for name, buf in want.named_buffers():
        assert torch.equal(dict(b.named_buffers())[name].view(torch.uint8), buf.view(torch.uint8)), name
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(b(x), want(x), rtol=0, atol=0)
    bad = {k: (v[:, :32] if k == "up.weight" else v) for k, v in float_model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"size mismatch for up.weight"):
        pg.nn.quantize_(Block(seed=1), fmt).load_state_dict(bad)


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_quantizing_a_meta_model_is_refused(fmt):
    with torch.device("meta"):
        model = Block()
    with pytest.raises(ValueError, match=r"up: cannot quantize a weight on the meta device.*Materialise"):
        pg.nn.quantize_(model, fmt)


def test_a_bf16_meta_model_refuses_a_real_input_instead_of_returning_garbage():
    with torch.device("meta"):
        model = pg.nn.quantize_(MLP(), "bf16")
    with pytest.raises(ValueError, match="is on meta but a is on cpu"):
        model(torch.randn(2, 64))


def test_quantize_warns_when_nothing_is_swapped():
    # newcomer report #16: a second quantize_ (or a filter matching nothing) is not silent
    model = pg.nn.quantize_(MLP(), "mxfp8")
    with pytest.warns(UserWarning, match=r"no torch.nn.Linear matched.*already has 2 persistent_gemm Linear\(s\) \(mxfp8\)"):
        pg.nn.quantize_(model, "fp8_rowwise")
    with pytest.warns(UserWarning, match="no torch.nn.Linear matched the filter_fn"):
        pg.nn.quantize_(MLP(), "mxfp8", filter_fn=lambda m, fqn: False)


def test_a_forced_config_goes_through_the_ops_resolution(monkeypatch):
    # newcomer reports #14 / #15: QuantConfig(config=) is resolved as pg.mm's config= is (a valid
    # spec would be JIT-compiled on a GPU; on CPU the reference runs, said once per process).
    from persistent_gemm import jit

    monkeypatch.setattr(jit, "_warned_cpu_config", False)
    bf16 = next(c.name for c in pg.CATALOGUE if c.dtype == "bf16" and c.arch == "sm90a")
    model = pg.nn.quantize_(MLP(), pg.nn.QuantConfig("bf16", config=bf16))
    x = torch.randn(2, 64)
    with pytest.warns(UserWarning, match="config= selects a GPU kernel; these operands are on cpu"):
        y = model(x)
    torch.testing.assert_close(y, pg.nn.quantize_(MLP(), "bf16")(x), rtol=0, atol=0)
    wrong = pg.nn.quantize_(MLP(), pg.nn.QuantConfig("mxfp8", config=bf16))
    with pytest.raises(ValueError, match="is a bf16 kernel; (these operands need|this op takes) (a )?mxfp8 kernel"):
        wrong(x)


# -- one op call per swapped Linear (issue 23: the per-Linear host cost) -----------------------------
LINEAR_X = ["fp8_rowwise", "mxfp8", "fp8_fp4"]


def two_calls(lin, x2, out_dtype):
    """The swapped Linear as two op calls: its activation quantizer, then its GEMM op."""
    from persistent_gemm._linear_op import _linear_parts

    q = lin.qconfig
    quantize, gemm = _linear_parts(q.format, q.rule)
    xq, xs = quantize(x2)
    bias = None if lin.bias is None else lin.bias.to(out_dtype)
    if q.format == "fp8_rowwise":
        return gemm(xq, lin.weight_q.t(), xs, lin.weight_scale, out_dtype, q.use_fast_accum, None, bias)
    return gemm(xq, lin.weight_q.t(), xs, lin.weight_scale, out_dtype, "plain", None, "blocked", bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fmt", LINEAR_X)
def test_quantized_linear_is_the_quantizer_then_the_gemm(fmt, dtype):
    lin = pg.nn.quantize_(MLP(), pg.nn.QuantConfig(fmt, rule="rceil" if fmt == "fp8_fp4" else "floor")).up
    x = (torch.randn(5, 64, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    out = dtype  # the module answers in the activation's dtype
    got = torch.ops.persistent_gemm.quantized_linear(x, lin.weight_q, lin.weight_scale, fmt, out, lin.bias.to(out),
                                                     lin.qconfig.rule)
    assert got.dtype == out and got.shape == (5, 128)
    assert torch.equal(got, two_calls(lin, x, out))
    assert torch.equal(lin(x), got)  # the module takes the one-call path
    torch.library.opcheck(torch.ops.persistent_gemm.quantized_linear.default,
                          (x, lin.weight_q, lin.weight_scale, fmt, out, lin.bias.to(out), lin.qconfig.rule),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_quantized_linear_refuses_bad_arguments_by_name():
    lin = pg.nn.quantize_(MLP(), "mxfp8").up
    x = torch.randn(3, 64)
    op = torch.ops.persistent_gemm.quantized_linear
    with pytest.raises(RuntimeError, match=r"format must be one of \('fp8_rowwise', 'mxfp8', 'fp8_fp4'\), got 'mxfp4'"):
        op(x, lin.weight_q, lin.weight_scale, "mxfp4")
    with pytest.raises(ValueError, match="is on meta"):
        op(x.to("meta"), lin.weight_q, lin.weight_scale, "mxfp8")
    with pytest.raises(RuntimeError, match="x must be bfloat16, float16 or float32"):
        op(x.double(), lin.weight_q, lin.weight_scale, "mxfp8")
    with pytest.raises(RuntimeError, match="x has K = 96, weight_q K = 64"):
        op(torch.randn(3, 96), lin.weight_q, lin.weight_scale, "mxfp8")


def test_a_swapped_linear_compiles_fullgraph_with_one_op_per_layer():
    model = pg.nn.quantize_(MLP(), "mxfp8")
    x = torch.randn(4, 64)
    calls = []
    from torch._dynamo.testing import CompileCounterWithBackend

    backend = CompileCounterWithBackend("eager")
    got = torch.compile(model, fullgraph=True, backend=backend)(x)
    assert torch.equal(got, model(x))
    calls = [n.target for g in backend.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum(t == torch.ops.persistent_gemm.quantized_linear.default for t in calls) == 2, calls


@pytest.mark.parametrize("fmt", LINEAR_X)
def test_activations_the_quantizers_do_not_take_go_through_the_same_definition(fmt):
    # float64 x: the module composes the quantizer definition (which computes in fp32) and the
    # GEMM op itself, so it answers what quantized_linear gives for the same x in fp32 (bf16 out).
    lin = pg.nn.quantize_(MLP(), fmt).up
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = lin(x)
    want = torch.ops.persistent_gemm.quantized_linear(x.float(), lin.weight_q, lin.weight_scale, fmt, torch.bfloat16,
                                                      lin.bias, lin.qconfig.rule)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
