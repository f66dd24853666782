"""The MoE routing ops (csrc/moe_routing.cpp) on the CPU: moe_dispatch against a stable argsort,
moe_activation against float64, moe_combine against the same sums written in torch; errors that
name the argument; opcheck (schema, fake kernel) and torch.compile(fullgraph=True). The CUDA
kernels against these CPU definitions: tests/test_gpu_moe_routing.py."""

import pytest
import torch

import persistent_gemm as pg

pytestmark = pytest.mark.skipif(not pg.extension_available() or not hasattr(torch.ops.persistent_gemm, "moe_dispatch"),
                                reason="needs the compiled extension with the MoE routing ops")


def dispatch_reference(indices: torch.Tensor, e: int, *rows: torch.Tensor):
    """The definition in torch: a stable sort of the slots by expert."""
    flat = indices.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices  # sorted row r is slot order[r]
    slot_rows = torch.empty_like(order).index_copy_(0, order, torch.arange(flat.numel()))
    offs = torch.cumsum(torch.bincount(flat, minlength=e), 0)
    return offs.int(), slot_rows.int(), [r[order // indices.shape[1]] for r in rows]


def activation_reference(h: torch.Tensor, kind: str, alpha=1.702, limit=7.0) -> torch.Tensor:
    gate, up = h.double().chunk(2, dim=-1)
    if kind == "silu":
        return gate * torch.sigmoid(gate) * up
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


def combine_reference(y, slot_rows, w):
    """The op's sums in torch: fp32 products, added in slot order."""
    tokens, top_k = w.shape
    rows = y.float()[slot_rows.long()].view(tokens, top_k, -1)
    acc = torch.zeros(tokens, y.shape[1])
    for j in range(top_k):
        acc = acc + w.float()[:, j:j + 1] * rows[:, j]
    return acc


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("tokens,e,top_k", [(1, 4, 1), (7, 8, 2), (37, 32, 4), (300, 128, 8), (5, 1, 3)])
def test_dispatch_is_a_stable_sort_by_expert(tokens, e, top_k, index_dtype):
    g = torch.Generator().manual_seed(tokens * e + top_k)
    # every other expert left empty, repeats within a token allowed
    indices = (torch.randint(0, (e + 1) // 2, (tokens, top_k), generator=g) * 2 % e).to(index_dtype)
    x = torch.randn(tokens, 40, generator=g).bfloat16()
    scales = torch.randint(0, 255, (tokens, 3), generator=g, dtype=torch.uint8)
    offs, slot_rows, (xs, ss) = pg.moe_dispatch(indices, e, x, scales)
    ref_offs, ref_rows, (ref_x, ref_s) = dispatch_reference(indices, e, x, scales)
    assert offs.dtype == slot_rows.dtype == torch.int32 and offs.shape == (e,)
    assert torch.equal(offs, ref_offs) and torch.equal(slot_rows, ref_rows)
    assert torch.equal(xs, ref_x) and torch.equal(ss, ref_s) and xs.dtype == x.dtype and ss.dtype == scales.dtype


def test_dispatch_without_rows_and_with_no_tokens():
    offs, slot_rows, rows = pg.moe_dispatch(torch.tensor([[2, 0], [2, 2]]), 3)
    assert offs.tolist() == [1, 1, 4] and slot_rows.tolist() == [1, 0, 2, 3] and rows == []
    offs, slot_rows, (xs,) = pg.moe_dispatch(torch.empty(0, 4, dtype=torch.int64), 5, torch.empty(0, 8))
    assert offs.tolist() == [0] * 5 and slot_rows.numel() == 0 and xs.shape == (0, 8)


@pytest.mark.parametrize("kind", ["silu", "gpt_oss"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_activation_matches_float64(kind, dtype):
    h = (torch.randn(19, 2 * 72) * 6).to(dtype)  # past gpt-oss's limit of 7 on both halves
    h[3, 5] = float("nan")
    out = pg.moe_activation(h, kind)
    ref = activation_reference(h, kind)
    assert out.dtype == dtype and out.shape == (19, 72)
    assert torch.isnan(out[3, 5]) and torch.isnan(ref[3, 5])
    ok = ~torch.isnan(ref)
    # fp32 math (exp, a division and two products: 4 roundings), then one rounding to dtype
    ulp = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-21}[dtype]
    torch.testing.assert_close(out.double()[ok], ref[ok], rtol=ulp, atol=1e-6)
    if kind == "gpt_oss":  # the clamp is on: up's +-limit and gate's limit are reached
        assert (h.float()[:, 72:].abs() > 7).any() and (h.float()[:, :72] > 7).any()


def test_activation_options_and_out_dtype():
    h = torch.randn(4, 16) * 3
    out = pg.moe_activation(h, "gpt_oss", alpha=1.0, limit=2.0, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), activation_reference(h, "gpt_oss", 1.0, 2.0), rtol=2**-8, atol=1e-6)
    # a strided h (a column slice) reads the same values
    wide = torch.randn(4, 40)
    assert torch.equal(pg.moe_activation(wide[:, 4:36], "silu"), pg.moe_activation(wide[:, 4:36].contiguous(), "silu"))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_combine_sums_each_tokens_slots_in_order(w_dtype, out_dtype):
    tokens, top_k, d = 23, 4, 48
    g = torch.Generator().manual_seed(3)
    y = torch.randn(tokens * top_k, d, generator=g).bfloat16()
    slot_rows = torch.randperm(tokens * top_k, generator=g).int()
    w = (torch.rand(tokens, top_k, generator=g) + 0.1).to(w_dtype)
    out = pg.moe_combine(y, slot_rows, w, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (tokens, d)
    assert torch.equal(out, combine_reference(y, slot_rows, w).to(out_dtype))
    exact = (y.double()[slot_rows.long()].view(tokens, top_k, d) * w.double()[..., None]).sum(1)
    assert (out.double() - exact).abs().max() <= 1e-5 + (2**-8 if out_dtype == torch.bfloat16 else 0) * exact.abs().max()


def test_dispatch_then_combine_inverts_the_permutation():
    indices = torch.randint(0, 6, (31, 3))
    x = torch.randn(31, 24).bfloat16()
    _, slot_rows, (xs,) = pg.moe_dispatch(indices, 6, x)
    # weights of 1 on slot 0, 0 elsewhere: each token's own row back
    w = torch.zeros(31, 3)
    w[:, 0] = 1
    assert torch.equal(pg.moe_combine(xs, slot_rows, w), x)


@pytest.mark.parametrize("call,match", [
    (lambda: pg.moe_dispatch(torch.tensor([[0, 4]]), 4), r"router_indices\[0\]\[1\] = 4 is not an expert index in \[0, 4\)"),
    (lambda: pg.moe_dispatch(torch.tensor([[-1]]), 4), r"router_indices\[0\]\[0\] = -1"),
    (lambda: pg.moe_dispatch(torch.tensor([[0.0]]), 4), r"router_indices must be torch.int32 or torch.int64"),
    (lambda: pg.moe_dispatch(torch.tensor([0, 1]), 4), r"router_indices must be 2-D \(tokens, top_k\)"),
    (lambda: pg.moe_dispatch(torch.tensor([[0]]), 0), r"num_experts must be in \[1, 11776\]"),
    (lambda: pg.moe_dispatch(torch.tensor([[0]]), 4, torch.zeros(2, 3)), r"rows\[0\] must be 2-D with a row per token"),
    (lambda: pg.moe_dispatch(torch.tensor([[0]]), 4, *[torch.zeros(1, 3)] * 3), r"at most two tensors"),
    (lambda: pg.moe_dispatch(torch.tensor([[0]]), 4.0), r"num_experts must be an int"),
    (lambda: pg.moe_activation(torch.zeros(2, 3), "silu"), r"h must be 2-D \(rows, 2 x intermediate\)"),
    (lambda: pg.moe_activation(torch.zeros(2, 4), "gelu"), r"kind must be 'silu' or 'gpt_oss'"),
    (lambda: pg.moe_activation(torch.zeros(2, 4, dtype=torch.int32), "silu"), r"h must be torch.bfloat16"),
    (lambda: pg.moe_activation(torch.zeros(2, 4), "silu", out_dtype=torch.int8), r"out_dtype"),
    (lambda: pg.moe_combine(torch.zeros(4, 8), torch.tensor([0, 1, 2, 4], dtype=torch.int32), torch.ones(2, 2)),
     r"slot_rows\[3\] = 4 is not a row of y \(4 rows\)"),
    (lambda: pg.moe_combine(torch.zeros(4, 8), torch.arange(4), torch.ones(2, 2)), r"slot_rows must be torch.int32"),
    (lambda: pg.moe_combine(torch.zeros(3, 8), torch.arange(4).int(), torch.ones(2, 2)), r"y must be 2-D with a row per slot"),
    (lambda: pg.moe_combine(torch.zeros(4, 8), torch.arange(3).int(), torch.ones(2, 2)), r"slot_rows must be 1-D"),
    (lambda: pg.moe_combine(torch.zeros(4, 8), torch.arange(4).int(), torch.ones(4)), r"routing_weights must be 2-D"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        call()


def test_inference_only():
    h = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"h requires grad, but the MoE routing ops are for inference"):
        pg.moe_activation(h, "silu")
    with torch.no_grad():
        pg.moe_activation(h, "silu")


def test_opcheck_and_a_whole_graph_trace():
    indices = torch.randint(0, 5, (9, 2))
    x, s = torch.randn(9, 32).bfloat16(), torch.randint(0, 255, (9, 1), dtype=torch.uint8)
    ops = torch.ops.persistent_gemm
    torch.library.opcheck(ops.moe_dispatch.default, (indices, 5, [x, s]))
    torch.library.opcheck(ops.moe_activation.default, (torch.randn(18, 64), "gpt_oss", 1.702, 7.0, torch.bfloat16))
    torch.library.opcheck(ops.moe_combine.default, (torch.randn(18, 32), torch.randperm(18).int(), torch.rand(9, 2)))

    def layer(x, indices, weights):
        offs, slot_rows, (xs,) = pg.moe_dispatch(indices, 5, x)
        return pg.moe_combine(pg.moe_activation(xs, "silu"), slot_rows, weights), offs

    compiled = torch.compile(layer, fullgraph=True, backend="eager", dynamic=False)
    weights = torch.rand(9, 2)
    for a, b in zip(compiled(x, indices, weights), layer(x, indices, weights)):
        assert torch.equal(a, b)
