"""CPU tests of persistent_gemm.nn: Linear layers in every format against float64, 3-D inputs,
bias, quantize_ with a filter, errors naming the layer, autograd (bf16 trains, quantized formats
refuse with a message), and torch.compile(fullgraph=True) of a swapped model."""

import pytest
import torch
from conftest import rel_err
from support.models import Block

import persistent_gemm as pg
from persistent_gemm.nn import FORMATS  # importable without the extension: collection never errors

pytestmark = pytest.mark.skipif(not pg.extension_available(), reason="needs the compiled extension")


def quantized_reference(lin: torch.nn.Linear, x: torch.Tensor, fmt: str) -> torch.Tensor:
    """float64 of what the format computes: the operands as the format quantizes them."""
    w, x2 = lin.weight.detach(), x.reshape(-1, lin.in_features)
    if fmt == "bf16":
        xd, wd = x2.bfloat16().double(), w.bfloat16().double()
    elif fmt == "fp8_rowwise":
        def rq(t):
            s = t.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
            return (t / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s.double()
        xd, wd = rq(x2.float()), rq(w.float())
    else:
        weight_only = fmt.endswith("_weight_only")  # 16-bit activations (fp32 ones computed in bf16)
        xd = x2.bfloat16().double() if weight_only else pg.dequantize_mxfp8(*pg.quantize_mxfp8(x2)).double()
        mx8 = fmt in ("mxfp8", "mxfp8_weight_only")
        q, dq = (pg.quantize_mxfp8, pg.dequantize_mxfp8) if mx8 else (pg.quantize_mxfp4, pg.dequantize_mxfp4)
        wd = dq(*q(w)).double()
    y = xd @ wd.t()
    if lin.bias is not None:
        y = y + lin.bias.detach().bfloat16().double()
    return y.reshape(*x.shape[:-1], lin.out_features)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_its_quantized_operands_in_float64(fmt, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=bias)
    x = torch.randn(3, 5, 96)  # 3-D: any leading dims
    m = pg.nn.Linear.from_linear(lin, fmt)
    y = m(x)
    assert y.shape == (3, 5, 40) and y.dtype == torch.float32 and torch.isfinite(y).all()
    ref = quantized_reference(lin, x, fmt)
    assert rel_err(y, ref) < 1e-5, (fmt, rel_err(y, ref))  # fp32 out: only summation order differs
    # and close to the unquantized layer, as each format allows
    tol = {"bf16": 1e-2, "fp8_rowwise": 6e-2, "mxfp8": 6e-2, "fp8_fp4": 0.25, "mxfp8_weight_only": 6e-2,
           "mxfp4_weight_only": 0.25}[fmt]
    assert rel_err(y, lin(x).double()) < tol
    yb = m(x.bfloat16())
    assert yb.dtype == (torch.bfloat16)


def test_quantize_swaps_linears_in_place_with_a_filter_and_keeps_the_rest():
    model = Block()
    ref = model(torch.randn(2, 7, 64))
    out = pg.nn.quantize_(model, pg.nn.QuantConfig("mxfp8", rule="rceil"), filter_fn=lambda mod, fqn: fqn != "head")
    assert out is model
    assert isinstance(model.up, pg.nn.Linear) and isinstance(model.down, pg.nn.Linear)
    assert type(model.head) is torch.nn.Linear and isinstance(model.norm, torch.nn.LayerNorm)
    assert "format='mxfp8', rule='rceil'" in repr(model.up)
    assert model.up.weight_q.dtype == torch.float8_e4m3fn and not hasattr(model.up, "weight")
    with pytest.raises(RuntimeError, match="quantized_linear is not differentiable"):  # LayerNorm's grad reaches it
        model(torch.randn(2, 7, 64))
    with torch.no_grad():
        y = model(torch.randn(2, 7, 64))
    assert y.shape == ref.shape and torch.isfinite(y).all()


def test_fp8_fp4_names_the_layer_it_cannot_take():
    model = torch.nn.Sequential(torch.nn.Linear(64, 100), torch.nn.ReLU(), torch.nn.Linear(100, 8))
    with pytest.raises(ValueError, match=r"^2: format='fp8_fp4' needs in_features % 32 == 0.*in_features=100"):
        pg.nn.quantize_(model, "fp8_fp4")
    # The refused call had already swapped layer 0 (in place, as it walks): the retry swaps nothing more.
    with pytest.warns(UserWarning, match="nothing was swapped"):
        pg.nn.quantize_(model, "fp8_fp4", filter_fn=lambda mod, fqn: mod.in_features % 32 == 0)
    assert isinstance(model[0], pg.nn.Linear) and type(model[2]) is torch.nn.Linear


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="format must be one of"):
        pg.nn.QuantConfig("int8")
    with pytest.raises(ValueError, match="rule must be one of"):
        pg.nn.QuantConfig("mxfp8", rule="up")
    with pytest.raises(ValueError, match="use_fast_accum applies to format='fp8_rowwise' only"):
        pg.nn.QuantConfig("mxfp8", use_fast_accum=True)
    with pytest.raises(TypeError, match="quantize_ replaces the Linear children"):
        pg.nn.quantize_(torch.nn.Linear(4, 4), "bf16")
    m = pg.nn.Linear.from_linear(torch.nn.Linear(32, 8), "bf16")
    with pytest.raises(ValueError, match="input's last dim is 16, in_features is 32"):
        m(torch.randn(2, 16))


def test_bf16_trains_and_quantized_formats_refuse_grad_with_a_message():
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 32)
    m = pg.nn.Linear.from_linear(lin, "bf16")
    x = torch.randn(4, 64, requires_grad=True)
    m(x).float().sum().backward()
    assert x.grad is not None and m.weight.grad is not None and m.weight.grad.shape == (32, 64)
    for fmt in ("fp8_rowwise", "mxfp8", "fp8_fp4"):
        q = pg.nn.Linear.from_linear(lin, fmt)
        with pytest.raises(RuntimeError, match=r"is not differentiable: its operands are quantized"):
            q(torch.randn(4, 64, requires_grad=True))
        with torch.no_grad():
            assert torch.isfinite(q(torch.randn(4, 64, requires_grad=True))).all()


@pytest.mark.parametrize("op", ["scaled_mm", "mxfp8_mm"])
def test_quantized_ops_refuse_inputs_that_require_grad(op):
    if op == "scaled_mm":
        a = torch.randn(4, 32).to(torch.float8_e4m3fn)
        b = torch.randn(8, 32).to(torch.float8_e4m3fn).t()
        sa = torch.ones(4, 1, requires_grad=True)
        with pytest.raises(RuntimeError, match="persistent_gemm.scaled_mm is not differentiable.*'scale_a' requires grad"):
            pg.scaled_mm(a, b, sa, torch.ones(1, 8))
    else:
        xq, xs = pg.quantize_mxfp8(torch.randn(4, 64))
        wq, ws = pg.quantize_mxfp8(torch.randn(8, 64))
        xq.requires_grad_(True)
        with pytest.raises(RuntimeError, match="persistent_gemm.mxfp8_mm is not differentiable.*'a' requires grad"):
            pg.mxfp8_mm(xq, wq.t(), xs, ws)


@pytest.mark.parametrize("fmt", FORMATS)
def test_swapped_model_compiles_fullgraph(fmt):
    torch.manual_seed(2)
    model = Block(seed=3)
    pg.nn.quantize_(model, fmt)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.allclose(compiled, eager, rtol=1e-5, atol=1e-5)
